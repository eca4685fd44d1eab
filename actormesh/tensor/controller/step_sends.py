"""When a finished training step goes to the ranks (issue 43), beside ``stream.py``'s other
reasons to send its buffer.

Where the controller's host has a core for each of the mesh's processes on it and one more
for the controller (a GPU host, whose ranks mostly wait on their GPUs), a step that read
nothing (a loop that logs its loss every few steps) is sent as the next one begins, so that
the ranks run it while the controller records the next; otherwise it would wait for
``BATCH_OPS`` ops or the next read, the ranks idle meanwhile. On fewer cores the ranks running
a step take the core the controller records the next on, and the step's own message costs CPU
that no overlap pays back, so steps stay batched there (measured: ``bench/RESULTS-tensors.md``).

A step that read something before its update stays for the next read: sent at once, its
update would be a message of its own, two a step.
"""

from __future__ import annotations

from ... import config


class StepSends:
    """One stream's steps: where one ended, and whether it goes as the next begins. Read and
    written under the stream's lock, or on the thread that records."""

    __slots__ = ("each_step", "over", "read", "send_next")

    def __init__(self, processes_here: int) -> None:
        self.each_step = processes_here < config.USABLE_CORES
        self.reset()

    def reset(self) -> None:
        self.over = False  # a step ended (``ended``): the next recorded op begins another
        self.send_next = False  # the step that ended read nothing: it goes then
        self.read = False  # a sync point since the step's first op

    def ended(self, buffered: int) -> None:
        """An optimizer step ended with ``buffered`` ops unsent."""
        self.send_next = buffered > 0 and not self.read and self.each_step
        self.over = True

    def begins(self) -> bool:
        """The next step's first op is being recorded: whether the buffer goes now."""
        self.over = False
        self.read = False  # a read after the update belonged to the step that ended
        return self.send_next
