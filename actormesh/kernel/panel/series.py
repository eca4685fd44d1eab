"""The charts' data for the panel: what is new in each mesh's resource samples and metrics.

The controller keeps every mesh's history (``MeshRecord.resources``: a sample per rank about
once a second, ten minutes of them; ``MeshRecord.metrics``: what ``am.log_metrics`` recorded).
The panel keeps its own copy for its charts, so the kernel sends only the points added since
the last ``series`` message (``protocol.series``), column by column, and at most
``RESOURCE_POINTS`` / ``METRIC_POINTS`` per rank and series in one message: a panel that
subscribes to a kernel that trained for an hour gets the recent past, not a message of
megabytes. A new subscription starts over (``reset``): every panel then gets the whole kept
history once.

Metrics logged without a step are placed at their ordinal (the n-th value that rank logged
under that name), so that every point has an x.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

from ...runtime.procs import MeshRecord, Sample
from . import protocol

RESOURCE_POINTS = 600  # per rank and message: the controller keeps as many (10 minutes)
METRIC_POINTS = 2000  # per metric, rank and message


class SeriesFeed:
    """Cursors into each mesh's histories. Used by the panel's update thread only, except
    ``reset`` (any thread: it only raises a flag)."""

    def __init__(self) -> None:
        self._reset = True
        self._metric_cursor: dict[str, int] = {}  # mesh_id -> MetricsLog.total seen
        self._sample_cursor: dict[tuple[str, int], float] = {}  # (mesh_id, rank) -> time
        self._ordinal: dict[tuple[str, int, str], int] = {}  # values without a step so far

    def reset(self) -> None:
        """The next update sends every mesh's whole kept history, marked ``reset``."""
        self._reset = True

    def update(self, records: list[MeshRecord]) -> dict[str, Any] | None:
        """The ``series`` message of what is new, or None when nothing is."""
        reset, self._reset = self._reset, False
        if reset:
            self._metric_cursor.clear()
            self._sample_cursor.clear()
            self._ordinal.clear()
        meshes = []
        live = set()
        for record in records:
            mesh_id = record.table.mesh_id
            live.add(mesh_id)
            resources = self._resources(mesh_id, record)
            metrics = self._metrics(mesh_id, record)
            if resources or metrics:
                meshes.append({"mesh_id": mesh_id, "resources": resources, "metrics": metrics})
        self._forget(live)
        if not meshes and not reset:
            return None
        return protocol.series(round(time.time(), 2), reset, meshes)

    def _resources(self, mesh_id: str, record: MeshRecord) -> list[dict[str, Any]]:
        out = []
        for rank in sorted(record.resources.by_rank):
            samples = record.resources.series(rank)  # a copy: the I/O thread appends
            after = self._sample_cursor.get((mesh_id, rank), -math.inf)
            start = len(samples)
            while start > 0 and samples[start - 1].time > after:
                start -= 1
            new = samples[max(start, len(samples) - RESOURCE_POINTS) :]
            if not new:
                continue
            self._sample_cursor[(mesh_id, rank)] = new[-1].time
            out.append(_columns(rank, new))
        return out

    def _metrics(self, mesh_id: str, record: MeshRecord) -> list[dict[str, Any]]:
        rows, self._metric_cursor[mesh_id] = record.metrics.since(
            self._metric_cursor.get(mesh_id, 0)
        )
        if not rows:
            return []
        by_name: dict[str, dict[int, tuple[list[int], list[float | None]]]] = defaultdict(dict)
        ordinal = self._ordinal
        for rank, name, value, step, _t in rows:
            key = (mesh_id, rank, name)
            n = ordinal.get(key, 0)
            ordinal[key] = n + 1
            steps, values = by_name[name].setdefault(rank, ([], []))
            steps.append(n if step is None else step)
            values.append(value if math.isfinite(value) else None)
        return [
            {
                "name": name,
                "ranks": [
                    {
                        "rank": rank,
                        "step": steps[-METRIC_POINTS:],
                        "value": values[-METRIC_POINTS:],
                    }
                    for rank, (steps, values) in sorted(ranks.items())
                ],
            }
            for name, ranks in sorted(by_name.items())
        ]

    def _forget(self, live: set[str]) -> None:
        for mesh_id in set(self._metric_cursor) - live:
            del self._metric_cursor[mesh_id]
        for sample_key in [k for k in self._sample_cursor if k[0] not in live]:
            del self._sample_cursor[sample_key]
        for ordinal_key in [k for k in self._ordinal if k[0] not in live]:
            del self._ordinal[ordinal_key]


def _columns(rank: int, samples: list[Sample]) -> dict[str, Any]:
    gpu = all(s.gpu_mem is not None for s in samples)
    return {
        "rank": rank,
        "time": [round(s.time, 2) for s in samples],
        "cpu": [round(s.cpu, 1) for s in samples],
        "rss": [int(s.rss) for s in samples],
        "gpu_mem": [s.gpu_mem for s in samples] if gpu else None,
        "gpu_util": [s.gpu_util for s in samples] if gpu else None,
    }
