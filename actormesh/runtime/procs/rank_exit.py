"""How a worker ends after a graceful stop: its ``atexit`` handlers, then the finalizers of what
its own modules hold, within a bound.

A worker ends with ``os._exit``: a full interpreter finalization costs about 0.3 s of CPU per
rank once torch is imported (measured in a forked worker), and tearing down libraries' state
runs destructors that can hang (a process group's, on a dead peer). What a graceful stop does
instead, as an interpreter's exit would for them: the rank's ``atexit`` handlers run, then its
*own* modules (those imported from outside the Python installation and its packages: the user's
code) are released in reverse import order, as the interpreter clears a module at exit, and the
garbage is collected, so that ``__del__`` of what they held (and of anything left in a
reference cycle) runs. A killed rank runs none of it.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import site
import sys
import threading
from types import ModuleType

from ... import config

logger = logging.getLogger(__name__)


def run_exit_handlers(timeout: float = config.STOP_GRACE / 4) -> None:
    """The rank's ``atexit`` handlers, then its own modules' finalizers (see the module
    docstring). Bounded: a handler or a ``__del__`` that hangs cannot hold up the stop."""
    runner = threading.Thread(target=_finish, name="actormesh-atexit", daemon=True)
    runner.start()
    runner.join(timeout)


def _finish() -> None:
    atexit._run_exitfuncs()  # noqa: SLF001  (what the interpreter's exit calls)
    release_own_modules()


def release_own_modules() -> None:
    """Clear the modules of the user's own code, newest first, then collect garbage."""
    installed = _installation_dirs()
    for module in reversed(list(sys.modules.values())):
        if _is_own(module, installed):
            _clear(module)
    gc.collect()


def _installation_dirs() -> tuple[str, ...]:
    """Where the Python installation, its packages and actormesh itself (still running: the
    worker's ``__main__`` is one of its modules) live."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, package}
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:  # an embedded or virtualenv's old site module
        pass
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


def _is_own(module: ModuleType, installed: tuple[str, ...]) -> bool:
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return False  # built in, frozen, or a namespace package
    return not os.path.realpath(path).startswith(installed)


def _clear(module: ModuleType) -> None:
    # As CPython clears a module at exit: names with a leading underscore first (so that
    # __del__ methods still find the public ones), then the rest; __builtins__ stays.
    namespace = module.__dict__
    try:
        for first_pass in (True, False):
            for key in list(namespace):
                if key == "__builtins__" or (first_pass and not key.startswith("_")):
                    continue
                namespace[key] = None
    except Exception:  # a module with an odd namespace: its finalizers are not run
        logger.debug("could not release module %r", module, exc_info=True)
