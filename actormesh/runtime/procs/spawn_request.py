"""What a rank of a proc mesh starts with: the part every rank of the mesh shares
(``SpawnRequest``, kept to start a rank again when it is healed) and its own part
(``rank_request``). Host agents merge the two into the JSON line a worker reads at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..extent import Extent
from ..messaging import Address


@dataclass(frozen=True)
class SpawnRequest:
    """What every process of one proc mesh starts with; each rank adds its own part
    (``MeshRecord.proc_request``). Kept to start a rank again when it is healed.

    It goes to host agents as the plain dict of ``wire()``: the agent merges it with each
    rank's part into the JSON line a worker reads at start-up (``worker.main``), so the dict
    *is* the form the far end uses, and an agent needs no class of ours to read it.
    """

    cwd: str
    sys_path: list[str]
    env: dict[str, str]  # added to each worker's environment
    extent: Extent  # of the whole proc mesh: host dimensions, then per-host ones

    def wire(self) -> dict[str, Any]:
        return {
            "cwd": self.cwd,
            "sys_path": self.sys_path,
            "env": self.env,
            "extent": [list(self.extent.labels), list(self.extent.sizes)],
        }


def rank_request(rank: int, address: Address, label: str, extra: dict[str, Any]) -> dict[str, Any]:
    """One rank's own part: where it listens, and ``extra`` (for a rank on the controller's
    host once other hosts take part: its tcp:// inbox)."""
    return {
        "rank": rank,
        "label": label,
        "mailbox": address.mailbox.hex(),
        "ipc": address.ipc,
        # A rank healed in place binds its old tcp port again, so copies of the proc table
        # held by other processes stay valid.
        "tcp_port": int(address.tcp.rsplit(":", 1)[1]) if address.tcp else 0,
        **extra,
    }
