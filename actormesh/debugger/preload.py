"""Imported by the fork server of a controller whose debugger is on (``enable_breakpoints``
puts this module in ``config.PRELOAD``): pydevd is imported once there, so every rank forked
afterwards has it in memory already, shared copy-on-write, and the first pause of a busy rank
does not spend CPU importing it while its peers do the same on the same cores.

Only the import: no thread, no socket, no trace function (the fork server forks). The ranks
still start debugpy on first use; until then nothing of it runs. A host without debugpy
skips it.
"""

from __future__ import annotations

import importlib.util
import os

from .rank import import_pydevd

if importlib.util.find_spec("debugpy") is not None:
    before = set(os.environ)
    import_pydevd()
    # The variables set for pydevd were read as it was imported: the ranks, and the processes
    # they start, need not inherit them.
    for name in set(os.environ) - before:
        del os.environ[name]
