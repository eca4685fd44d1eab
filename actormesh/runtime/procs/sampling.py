"""What each rank uses, measured from outside: its host agent samples CPU and memory.

About once a second (``SAMPLE_EVERY``) the agent reads each of its live workers' CPU use (% of
one core since the last sample) and resident memory with psutil, and sends them to the
controller as one RESOURCES message for the whole host (``protocol.py``), never a message per
rank. The ranks do nothing for it: sampling costs them no CPU. The controller keeps the last
``KEEP`` samples of each rank (``ResourceHistory``) for the sidebar's charts; a rank that died
keeps its samples up to its death, and gets no more.

GPUs: where NVML can be loaded (``pip install nvidia-ml-py``, the ``gpu`` extra) the same tick
reads the GPU memory each worker process holds (its CUDA context, torch's cache and tensors:
what ``nvidia-smi`` shows for it) and the utilisation of the GPUs it uses; elsewhere those
fields are None. NVML names processes by the host's process ids, which are the agent's own
except inside a container with a private pid namespace: there the GPU fields stay None.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import psutil

from ..messaging import Address
from ..messaging.protocol import RESOURCES

if TYPE_CHECKING:
    from ..messaging import Node

logger = logging.getLogger(__name__)

SAMPLE_EVERY = 1.0  # seconds
KEEP = 600  # samples per rank: ten minutes at one a second

# (mesh_id, rank, pid) of each live worker of this host.
Workers = Callable[[], Iterable[tuple[str, int, int]]]


class Sample(NamedTuple):
    """One rank's reading: CPU as % of one core, memory in bytes, GPU utilisation in %."""

    time: float
    cpu: float
    rss: int
    gpu_mem: int | None = None
    gpu_util: int | None = None


class GpuReader:
    """Per-process GPU memory and per-GPU utilisation through NVML (None where unavailable)."""

    def __init__(self) -> None:
        self.nvml: Any = None
        self.handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handles = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
            ]
            self.nvml = pynvml
        except Exception:  # no package, no driver, no GPU: the GPU fields stay None
            self.handles = []

    def read(self) -> dict[int, tuple[int, int]]:
        """``pid -> (GPU memory bytes, utilisation %)`` of the processes using a GPU; a
        process on several GPUs sums their memory and reports the busiest one."""
        by_pid: dict[int, tuple[int, int]] = {}
        for handle in self.handles:
            util = int(self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            for proc in self.nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                mem, busiest = by_pid.get(proc.pid, (0, 0))
                by_pid[proc.pid] = (mem + int(proc.usedGpuMemory or 0), max(busiest, util))
        return by_pid


class ResourceSampler:
    """The host agent's side: a timer on its I/O thread."""

    def __init__(self, node: Node, controller: Address, workers: Workers) -> None:
        self.node = node
        self.controller = controller
        self.workers = workers
        self._procs: dict[int, psutil.Process] = {}
        self.gpus = GpuReader()

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

    def _sample(self) -> list[tuple[str, int, float, int, int | None, int | None]]:
        samples = []
        seen = set()
        gpu = self.gpus.read() if self.gpus.handles else None
        for mesh_id, rank, pid in self.workers():
            seen.add(pid)
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                    proc.cpu_percent(None)  # the first reading only starts the interval
                    continue
                with proc.oneshot():
                    cpu, rss = proc.cpu_percent(None), proc.memory_info().rss
                gpu_mem, gpu_util = (None, None) if gpu is None else gpu.get(pid, (0, 0))
                samples.append((mesh_id, rank, cpu, rss, gpu_mem, gpu_util))
            except psutil.Error:
                continue  # it just exited: its exit report is on its way
        for pid in list(self._procs):
            if pid not in seen:
                del self._procs[pid]
        return samples


class ResourceHistory:
    """The controller's side, per proc mesh: ``rank -> deque of Sample``."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self.by_rank: dict[int, deque[Sample]] = {}

    def add(self, rank: int, sample: Sample) -> None:
        history = self.by_rank.get(rank)
        if history is None:
            history = self.by_rank[rank] = deque(maxlen=self.keep)
        history.append(sample)

    def latest(self) -> dict[int, Sample]:
        return {rank: h[-1] for rank, h in list(self.by_rank.items()) if h}

    def series(self, rank: int) -> list[Sample]:
        return list(self.by_rank.get(rank, ()))
