"""Small Linux process helpers: parent-death signals and exit-status decoding."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int) -> None:
    """Get SIGKILLed when the parent (thread) that started us goes away; exit if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: heartbeats and lifelines still end us
    if os.getppid() != expected_parent:
        os._exit(1)


def describe_status(status: int) -> tuple[int | None, str | None]:
    """``(exitcode, None)`` for a normal exit, ``(None, "SIGKILL")`` for death by a signal."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            return None, signal.Signals(-code).name
        except ValueError:
            return None, f"signal {-code}"
    return code, None
