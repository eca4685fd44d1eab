"""The idle flush of a tensor stream (stream.py): its buffer goes out by itself once nothing was
recorded for ``IDLE_FLUSH`` seconds, so that the workers start on the ops while the controller
computes the next step. One timer thread per stream, armed by the first op of a batch; it
compares an op count across the window, so that recording an op reads no clock, and it ends
after a second of nothing (the next op starts another).

"Idle" means the user's thread did not *want* to run: on a loaded machine (the workers busy
with the last batch on the same cores) it is often descheduled for tens of milliseconds in the
middle of a loop of ops, and flushing then would split one burst into many messages. So before
an idle flush the timer checks, where Linux says so (``/proc/self/task/<tid>/schedstat``),
whether that thread spent the quiet window waiting for a CPU; if it did, it is not idle.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any, Protocol

# Seconds without a recorded op before the buffer goes out by itself. The design said 2 ms; on
# a loaded 2-core host a loop of ops has GIL and scheduling gaps of 2-40 ms, and at 2 ms (even
# with the starvation check below) 500 ops took up to 5 messages; at 10 ms they took 1-2.
IDLE_FLUSH = 0.01


class Buffered(Protocol):
    """What the timer reads of a stream (``stream.Stream``)."""

    closed: bool
    ops: list[Any]
    recorded: int  # ops recorded so far
    armed: bool
    lock: threading.Lock
    wake_event: threading.Event
    recorder_tid: int  # native id of the thread that recorded the first buffered op
    error: BaseException | None  # a failed send, for the next sync point

    def send_now(self) -> None: ...

    def timer_ends_if_idle(self) -> bool: ...


def start_timer(stream: Buffered) -> threading.Thread:
    """The idle timer of ``stream``, started (``Stream.record`` starts it with a batch's first
    op when none runs)."""
    timer = threading.Thread(
        target=_idle_loop, args=(weakref.ref(stream),), name="tensor-stream", daemon=True
    )
    timer.start()
    return timer


def _idle_loop(ref: weakref.ref[Buffered]) -> None:
    """Flush a stream once nothing was recorded for IDLE_FLUSH seconds (holds no strong ref
    while it sleeps, so a dropped mesh's stream can go); end after a second of nothing."""
    while True:
        stream = ref()
        if stream is None or stream.closed:
            return
        wake = stream.wake_event
        del stream
        wake.wait(1.0)
        stream = ref()
        if stream is None or stream.closed:
            return
        if not wake.is_set() and not stream.ops:
            # (armed, but an interrupt came before the event was set: ops say it)
            if stream.timer_ends_if_idle():
                return
            continue
        while True:
            seen = stream.recorded
            # A timer, not synchronisation: the count decides whether the window was quiet.
            time.sleep(IDLE_FLUSH)
            if stream.closed:
                return
            if stream.recorded != seen:
                continue
            with stream.lock:
                if not stream.ops:
                    stream.armed = False
                    wake.clear()
                    break
            if _starved(stream):
                continue
            try:
                stream.send_now()
            except BaseException as exc:
                stream.error = exc  # raised by the next sync point on the user's thread
        del stream


_tls = threading.local()


def native_id() -> int:
    tid: int | None = getattr(_tls, "tid", None)
    if tid is None:
        tid = _tls.tid = threading.get_native_id()
    return tid


def _runqueue_wait(tid: int) -> float | None:
    """Seconds thread ``tid`` of this process has spent runnable but waiting for a CPU."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _starved(stream: Buffered) -> bool:
    """Watch the recording thread for one more idle window: True if it recorded meanwhile or
    spent most of the window waiting for a CPU (then it is busy, not idle)."""
    if not hasattr(os, "sched_getaffinity"):
        return False
    before = _runqueue_wait(stream.recorder_tid)
    if before is None:
        return False
    seen = stream.recorded
    start = time.monotonic()
    time.sleep(IDLE_FLUSH)
    if stream.recorded != seen:
        return True
    after = _runqueue_wait(stream.recorder_tid)
    return after is not None and after - before > (time.monotonic() - start) / 2
