"""The in-memory snapshots a rank keeps for live recovery (``recovery.py`` writes and reads
them), and what frees them: each ``FaultTolerant`` names its snapshots by a lineage and holds an
anchor id; when it is collected on the controller the anchor is dropped like a MeshTensor's
value, and the rank forgets that lineage's copy (``forget_anchor``, from ``EngineState._drop``).

Module-level, not the engine's: a snapshot outlives the engine that took it (recovery restarts
the engines and restores from the copies that survived).
"""

from __future__ import annotations

from typing import Any

# lineage -> this rank's snapshot of it (a ``recovery.Generation``: the last committed step)
SNAPSHOTS: dict[str, Any] = {}
# anchor id -> lineage, for the lineages whose snapshots this rank took
ANCHORS: dict[int, str] = {}


def forget_anchor(anchor: int) -> None:
    lineage = ANCHORS.pop(anchor, None)
    if lineage is not None:
        SNAPSHOTS.pop(lineage, None)
