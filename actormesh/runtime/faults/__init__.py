"""Failures of the runtime: where those nobody waited for go, and stack dumps.

The face of ``runtime/faults``: other layers import these names from here, never from its
modules (``tests/unit/test_faces.py``).

- ``supervision``: the fault hook (``set_fault_hook``, ``unhandled_fault_hook``), and a script's
  main thread failing fast (``raise_pending``, main waiters).
- ``stacks``: stack dumps served by a worker's I/O thread, grouped by rank; interrupts.
"""

from .stacks import (
    STOPPED_HINT,
    TOOL_ACTOR_PREFIX,
    format_stacks,
    raise_in_thread,
    render_grouped,
    stopped,
    without_busy_time,
)
from .supervision import (
    FaultHook,
    add_main_waiter,
    current_fault_hook,
    failure_of_broadcast,
    raise_pending,
    remove_main_waiter,
    set_fault_hook,
    unhandled_fault_hook,
)

__all__ = [
    "STOPPED_HINT",
    "TOOL_ACTOR_PREFIX",
    "FaultHook",
    "add_main_waiter",
    "current_fault_hook",
    "failure_of_broadcast",
    "format_stacks",
    "raise_in_thread",
    "raise_pending",
    "remove_main_waiter",
    "render_grouped",
    "set_fault_hook",
    "stopped",
    "unhandled_fault_hook",
    "without_busy_time",
]
