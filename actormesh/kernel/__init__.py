"""The actormesh Jupyter kernel and the ``%%mesh`` magics.

``python -m actormesh.kernel -f CONNECTION_FILE`` runs the kernel (what the "actormesh"
kernelspec starts); ``%load_ext actormesh`` loads the magics into any IPython. Workers import
``actormesh.kernel.executor``, so this package imports nothing heavy itself.
"""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext actormesh``: register ``%%mesh`` / ``%mesh`` with ``ipython``."""
    from .magics import load

    load(ipython)
