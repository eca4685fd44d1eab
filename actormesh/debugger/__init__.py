"""The actormesh debugger: pause any rank, inspect its stack and tensors, step it.

It builds on the kernel (``%mesh dbg`` is a kernel magic) and installs itself in the kernel's
seam (``actormesh.kernel.debugger_seam``) when it loads; the kernel never imports it.
"""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext actormesh``: the ``%%mesh`` magics, then the debugger hooked into them."""
    from ..kernel import debugger_seam
    from ..kernel.magics import load
    from .magics import install

    magics = load(ipython)
    if debugger_seam.installed() is None:
        debugger_seam.install(install(magics))
