"""Small Linux process helpers: parent-death signals, the open-files limit, exit-status
decoding and the GPUs a process may use."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1

# Written on a host agent's lifeline before it is closed on purpose: end-of-file without it
# means the controller died, and the agent cleans up what it left.
GOODBYE = b"bye"


def die_with_parent(expected_parent: int) -> None:
    """Get SIGKILLed when the parent (thread) that started us goes away; exit if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: heartbeats and lifelines still end us
    exit_if_orphaned(expected_parent)


def exit_if_orphaned(expected_parent: int) -> None:
    """Exit at once when the parent is not ``expected_parent`` (it died before we started)."""
    if os.getppid() != expected_parent:
        os._exit(1)


def raise_fd_limit() -> None:
    """Raise the soft limit on open files to the hard one (as Jupyter and Ray do): every
    process and actor this process talks to costs it descriptors, and 1,024 is soon used up."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20  # what Linux accepts (fs.nr_open's default)
        if soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass  # not Unix, or not allowed: the transport refuses connections before the limit


def describe_status(status: int) -> tuple[int | None, str | None]:
    """``(exitcode, None)`` for a normal exit, ``(None, "SIGKILL")`` for death by a signal."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            return None, signal.Signals(-code).name
        except ValueError:
            return None, f"signal {-code}"
    return code, None


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (device ``i`` of
    the process is entry ``i``); empty on a machine without NVIDIA GPUs. Reads the driver's
    directory, never CUDA: asking CUDA would start it, which a process about to fork must not."""
    try:
        count = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip()][:count]
    return [str(i) for i in range(count)]


def kill_quietly(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` unless it is gone already (or not a process id)."""
    if pid <= 0:
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
