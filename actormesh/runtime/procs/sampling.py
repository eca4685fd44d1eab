"""What each rank uses, measured from outside: its host agent samples CPU and memory.

About once a second (``SAMPLE_EVERY``) the agent reads each of its live workers' CPU use (% of
one core since the last sample) and resident memory with psutil, and sends them to the
controller as one RESOURCES message for the whole host (``protocol.py``), never a message per
rank. The ranks do nothing for it: sampling costs them no CPU. The controller keeps the last
``KEEP`` samples of each rank (``ResourceHistory``) for the sidebar's charts; a rank that died
keeps its samples up to its death, and gets no more.

GPU utilisation and memory are not sampled yet: that needs NVML on a machine with GPUs.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import psutil

from ..messaging.address import Address
from ..messaging.protocol import RESOURCES

if TYPE_CHECKING:
    from ..messaging.node import Node

logger = logging.getLogger(__name__)

SAMPLE_EVERY = 1.0  # seconds
KEEP = 600  # samples per rank: ten minutes at one a second

# (mesh_id, rank, pid) of each live worker of this host.
Workers = Callable[[], Iterable[tuple[str, int, int]]]


class ResourceSampler:
    """The host agent's side: a timer on its I/O thread."""

    def __init__(self, node: Node, controller: Address, workers: Workers) -> None:
        self.node = node
        self.controller = controller
        self.workers = workers
        self._procs: dict[int, psutil.Process] = {}

    def start(self) -> None:
        """Begin sampling (any thread; the samples are taken on the I/O thread)."""
        transport = self.node.transport
        transport.call_soon(lambda: transport.call_later(SAMPLE_EVERY, self._tick))

    def _tick(self) -> None:
        try:
            samples = self._sample()
            if samples:
                self.node.send(self.controller, (RESOURCES, time.time(), tuple(samples)))
        except Exception:
            logger.exception("sampling the workers' resources failed")
        self.node.transport.call_later(SAMPLE_EVERY, self._tick)

    def _sample(self) -> list[tuple[str, int, float, int]]:
        samples = []
        seen = set()
        for mesh_id, rank, pid in self.workers():
            seen.add(pid)
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                    proc.cpu_percent(None)  # the first reading only starts the interval
                    continue
                with proc.oneshot():
                    samples.append((mesh_id, rank, proc.cpu_percent(None), proc.memory_info().rss))
            except psutil.Error:
                continue  # it just exited: its exit report is on its way
        for pid in list(self._procs):
            if pid not in seen:
                del self._procs[pid]
        return samples


class ResourceHistory:
    """The controller's side, per proc mesh: ``rank -> deque of (time, cpu %, rss bytes)``."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self.by_rank: dict[int, deque[tuple[float, float, int]]] = {}

    def add(self, rank: int, t: float, cpu: float, rss: int) -> None:
        history = self.by_rank.get(rank)
        if history is None:
            history = self.by_rank[rank] = deque(maxlen=self.keep)
        history.append((t, cpu, rss))

    def latest(self) -> dict[int, tuple[float, float, int]]:
        return {rank: h[-1] for rank, h in list(self.by_rank.items()) if h}

    def series(self, rank: int) -> list[Any]:
        return list(self.by_rank.get(rank, ()))
