"""When a finished training step goes to the ranks (issue 43), measured in one process: the
stream's two ways toggled on the same mesh and model, so that the machine's drift falls on both.

- ``batched``: a step that read nothing waits in the buffer for ``BATCH_OPS`` ops or the next
  read (what a host with no core to spare does);
- ``each step``: it goes as the next step begins (``StepSends.each_step``: what a host with a
  core per rank beside the controller's does).

T1, T1b (the loss read every step) and T5 (read every 10 steps), the steps of
``bench_tensor.py``, ``ROUNDS`` rounds of 20 steps in each way, the order reversed every round;
medians of the wall time and of the controller's and the workers' CPU per step, and the
messages a step. ``BENCH_DEVICE=cuda``: on a mesh of a rank per GPU, as ``bench_tensor.py``.

Run:  python bench/ab_step_send.py   (ROUNDS=10 by default; BENCH_QUICK=1: 2)
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/
import common as C
import torch
from bench_tensor import READ_EVERY, Spmd, mesh_shape, mlp_step

import actormesh as am
from actormesh.tensor.controller.mesh import tensor_mesh

ROUNDS = int(os.environ.get("ROUNDS", 2 if C.QUICK else 10))
STEPS = 20
WAYS = {"batched": False, "each step": True}
CASES = ("T1", "T1b", "T5")


def measure(procs: Any, spmd: Any, case: str) -> dict[str, dict[str, float]]:
    read_every = READ_EVERY if case == "T5" else 1
    step = mlp_step(procs, case)[3]
    stream = tensor_mesh(procs).stream

    def workers_cpu() -> float:
        return float(sum(spmd.cpu.call().get(timeout=60).values()))

    for _ in range(30):  # the optimizer's state, the programs defined
        step()
    samples: dict[str, list[tuple[float, float, float, float]]] = {w: [] for w in WAYS}
    for r in range(ROUNDS):
        for way in list(WAYS) if r % 2 == 0 else list(WAYS)[::-1]:
            stream.steps.each_step = WAYS[way]
            for _ in range(read_every):  # to a read: the last way's steps are all run
                step()
            workers, sent = workers_cpu(), stream.batches
            mine, t0 = time.process_time(), time.perf_counter()
            for _ in range(STEPS):
                step()
            wall = (time.perf_counter() - t0) / STEPS * 1e6
            mine = (time.process_time() - mine) / STEPS * 1e6
            workers = (workers_cpu() - workers) / STEPS * 1e6
            samples[way].append((wall, mine, workers, (stream.batches - sent) / STEPS))
    keys = ("wall_us", "controller_cpu_us", "workers_cpu_us", "messages_per_step")
    return {
        way: {k: statistics.median(s[i] for s in v) for i, k in enumerate(keys)}
        for way, v in samples.items()
    }


def main() -> None:
    torch.set_num_threads(1)
    procs = am.this_host().spawn_procs(per_host=mesh_shape())
    try:
        tm = tensor_mesh(procs)
        spmd = procs.spawn("spmd", Spmd)
        result: dict[str, Any] = {"machine": C.machine_info(), "mesh": mesh_shape(),
                                  "engine_device": str(tm.device), "rounds": ROUNDS}  # fmt: skip
        for case in CASES:
            result[case] = measure(procs, spmd, case)
    finally:
        procs.stop().get(timeout=60)
    C.print_result(result)


if __name__ == "__main__":
    main()
