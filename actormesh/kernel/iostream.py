"""The kernel's stdout/stderr: ipykernel's ``OutStream``, minus waits for nothing.

ipykernel flushes stdout and stderr at the end of every cell (and before every displayed
result), and each flush hands two tasks to the IOPub thread and waits for both to run, even
when nothing was written since the last flush. Those waits are one thread round trip each:
a few hundred microseconds of every cell, more while the ranks of a ``%%mesh`` cell compete
for the same cores. Here a flush returns at once when everything written has already been sent
by an earlier flush; otherwise it is ipykernel's.
"""

from __future__ import annotations

from typing import Any

from ipykernel.iostream import OutStream


class OutStreamSkippingEmptyFlushes(OutStream):
    """An ``OutStream`` whose ``flush`` is free when there is nothing to flush."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._written = 0  # writes that have reached the buffer
        self._sent = 0  # of those, how many a completed flush has sent

    def write(self, string: str) -> int | None:  # type: ignore[override]  # as ipykernel
        n = super().write(string)
        # Counted once in the buffer: a flush that reads the count before this line sends
        # the text anyway and records one write less, so the next flush waits (never skips).
        with self._buffer_lock:  # += is not atomic across threads
            self._written += 1
        return n

    def flush(self) -> None:
        if self._sent == self._written and self.echo is None and self._is_master_process():
            return
        super().flush()

    def _flush(self) -> None:
        written = self._written  # read before the buffers are taken: see write
        super()._flush()
        self._sent = written
