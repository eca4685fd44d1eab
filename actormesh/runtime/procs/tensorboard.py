"""Metrics to TensorBoard, for people who already read their curves there.

With ``ACTORMESH_TENSORBOARD_DIR`` set, the controller also writes every value the ranks log
(``am.log_metrics``) with ``torch.utils.tensorboard``: one run per proc mesh (a sub-directory
named after the mesh), one tag per metric and rank (``loss/gpus=1``). Values without a step get
consecutive steps per tag. Without the ``tensorboard`` package this says so once and writes
nothing; the metrics are still in ``procs.metrics()``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

ENV = "ACTORMESH_TENSORBOARD_DIR"


class TensorBoardExport:
    """The controller's writers, one per mesh (on the I/O thread, which delivers the values)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._writers: dict[str, Any] = {}
        self._next_step: dict[tuple[str, str], int] = {}
        self._missing = False

    @classmethod
    def from_environment(cls) -> TensorBoardExport | None:
        directory = os.environ.get(ENV)
        return cls(directory) if directory else None

    def write(self, mesh_id: str, rank_label: str, records: Any) -> None:
        writer = self._writer(mesh_id)
        if writer is None:
            return
        for name, value, step, t in records:
            tag = f"{name}/{rank_label}"
            if step is None:
                step = self._next_step.get((mesh_id, tag), 0)
            self._next_step[(mesh_id, tag)] = step + 1
            writer.add_scalar(tag, value, global_step=step, walltime=t)

    def close(self, mesh_id: str | None = None) -> None:
        """Flush and close one mesh's run (when it stops), or every run (at shutdown)."""
        for key in [mesh_id] if mesh_id is not None else list(self._writers):
            writer = self._writers.pop(key, None)
            if writer is not None:
                writer.close()

    def _writer(self, mesh_id: str) -> Any:
        writer = self._writers.get(mesh_id)
        if writer is not None or self._missing:
            return writer
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch imports tensorboard itself, and says which is missing
            self._missing = True
            logger.warning(
                "%s is set, but metrics cannot be written there: %s (pip install tensorboard)",
                ENV,
                exc,
            )
            return None
        writer = SummaryWriter(log_dir=os.path.join(self.directory, mesh_id), flush_secs=2)
        self._writers[mesh_id] = writer
        return writer
