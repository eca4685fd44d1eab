"""Pipelines and ``to_mesh`` (issue 41), each beside its floor, in one run.

- P1: a training step of a 2-stage pipeline (an MLP split in two, 4 microbatches, SGD,
  ``loss.item()`` every step), GPipe and 1F1B: ``actormesh.tensor.pipeline_step`` from the
  controller, the stages ``module_to_mesh``'d on the slices ``pp=0`` and ``pp=1`` of a {pp: 2}
  mesh, against the same schedule SPMD with ``torch.distributed.pipelining`` (PipelineStage,
  ScheduleGPipe/Schedule1F1B) in an actor on the *same two processes*, over their process group
  (the one the tensor layer formed over the whole mesh; the stages' engines use groups of their
  own). One intra-op thread per rank on both sides. The two sides alternate in blocks for
  ``ROUNDS`` rounds; the medians of all steps are compared (ratio).
- P2: ``to_mesh`` of one float32 tensor from the slice pp=0 to the slice pp=1 (each one process:
  the bytes go rank to rank over the data plane), until it is on the destination, against the
  data plane's floor for the same bytes between the same two processes: an actor on pp=0
  sending the tensor to a port of an actor on pp=1 (what ``to_mesh`` is built on), and an actor
  on pp=1 reading it from a ``TensorBuffer`` of the other (a one-sided copy). Per transfer,
  medians over blocks of ``MOVES`` transfers; GB/s.

- P3: the bubble against the schedule's theory. Stages whose forward and backward take a set
  time on their ranks (a sleep: no CPU, so the load of a shared machine does not decide it) and
  nothing else, 2 and 4 stages (one process each, a {pp: 4} mesh), 4 and 8 microbatches, both
  schedules: a step of m microbatches over p stages should take (m + p - 1) (F + B), so each
  stage idles (p - 1) / (m + p - 1) of it. Measured: 1 - m (F + B) / (the fastest of
  ``BUBBLE_RUNS`` steps), beside the theory and beside (p - 1) / p, what stages that ran one
  after another would idle. P1 also reports, for the real MLP, the share of the measured steps
  during which each stage's engine ran ops (``busy_spans``), beside 1 - the theory's bubble.

Run:  python bench/bench_pipeline.py     (BENCH_QUICK=1: fewer steps and rounds)
Prints one JSON object; ``BENCH_OUT=path`` also writes it there.
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
from torch import nn

import actormesh as am
from actormesh.tensor import (
    bubble_fraction,
    busy_spans,
    device_mesh,
    distribute,
    inspect,
    module_to_mesh,
    pipeline_step,
)

if C.QUICK:
    ROUNDS, STEPS, MOVES = 2, 5, 5
else:
    ROUNDS, STEPS, MOVES = 5, 15, 20
WARMUP = 2
WIDTH, BATCH, MICRO = 256, 64, 4
SIZES = {"1MB": 1 << 20, "16MB": 16 << 20, "64MB": 64 << 20}
FORWARD, BACKWARD = 0.05, 0.1  # P3's stage times, seconds
BUBBLE_RUNS = 2 if C.QUICK else 4


def stage_modules() -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU()),
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH)),
    ]


class SpmdPipe(am.Actor):
    """The floor of P1: the same stage and schedule as an SPMD program on this rank."""

    @am.endpoint
    def train(
        self, stage: nn.Module, schedule: str, steps: int, x: torch.Tensor, y: torch.Tensor
    ) -> list[int]:
        import torch.distributed as dist
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        torch.set_num_threads(1)  # as the tensor engine (and torchrun's default with 2 ranks)
        rank, n = dist.get_rank(), dist.get_world_size()
        pipe_stage = PipelineStage(stage, rank, n, torch.device("cpu"))
        kind = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        pipe = kind(pipe_stage, MICRO, loss_fn=nn.functional.mse_loss)
        opt = torch.optim.SGD(stage.parameters(), lr=0.01)
        out = []
        for step in range(WARMUP + steps):
            t0 = time.perf_counter_ns()
            if rank == 0:
                pipe.step(x)
            else:
                losses: list[torch.Tensor] = []
                pipe.step(target=y, losses=losses)
                sum(float(v) for v in losses)  # the loss read, as loss.item() does
            opt.step()
            opt.zero_grad()
            dist.barrier()  # a step ends when both stages finished it
            if step >= WARMUP:
                out.append(time.perf_counter_ns() - t0)
        return out


class Mover(am.Actor):
    """The floors of P2: a port message, and a TensorBuffer read, of the same bytes."""

    def __init__(self) -> None:
        self.tensors: dict[int, torch.Tensor] = {}

    @am.endpoint
    def open(self) -> am.Port:
        self.port, self.receiver = am.Channel.open()
        return self.port

    @am.endpoint
    def push(self, port: am.Port, nbytes: int, count: int) -> None:
        t = torch.ones(nbytes // 4)
        for _ in range(count):
            port.send(t)

    @am.endpoint
    def drain(self, count: int) -> float:
        total = 0.0
        for _ in range(count):
            total += float(self.receiver.recv().get(timeout=120)[0])
        return total

    @am.endpoint
    def lend(self, nbytes: int) -> am.TensorBuffer:
        self.tensors[nbytes] = torch.ones(nbytes // 4)
        return am.TensorBuffer(self.tensors[nbytes])

    @am.endpoint
    def read(self, buffer: am.TensorBuffer, count: int) -> None:
        dst = torch.empty(buffer.nbytes // 4)
        for _ in range(count):
            buffer.read_into(dst).get(timeout=120)


def p1(procs: Any, spmd: Any) -> dict[str, Any]:
    meshes = [procs.slice(pp=s) for s in range(2)]
    modules = stage_modules()
    torch.manual_seed(1)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    out: dict[str, Any] = {}
    for schedule in ("gpipe", "1f1b"):
        meshed = [module_to_mesh(m, mesh) for m, mesh in zip(modules, meshes, strict=True)]
        opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in meshed]

        def step(
            meshed: list[Any] = meshed, opts: list[Any] = opts, schedule: str = schedule
        ) -> None:
            loss = pipeline_step(meshed, meshes, x, y, nn.functional.mse_loss,
                                 microbatches=MICRO, schedule=schedule)  # fmt: skip
            for opt in opts:
                opt.step()
                opt.zero_grad()
            loss.item()

        ours: list[float] = []
        floor: list[float] = []
        busy = [0.0, 0.0]  # seconds each stage's engine ran ops during our blocks
        timed = 0.0
        for _ in range(WARMUP):
            step()
        for _ in range(ROUNDS):
            start = time.time()
            for _ in range(STEPS):
                t0 = time.perf_counter_ns()
                step()
                # A step ends when both stages finished it: stage 0's last op is its backward.
                inspect(next(meshed[0].parameters()).view(-1)[0])
                ours.append((time.perf_counter_ns() - t0) / 1e3)
            end = time.time()
            timed += end - start
            for stage, mesh in enumerate(meshes):
                busy[stage] += _busy_between(busy_spans(mesh, timeout=60)[0], start, end)
            replies = [
                spmd.slice(pp=s).train.call_one(modules[s], schedule, STEPS, x, y) for s in range(2)
            ]
            times = [r.get(timeout=600) for r in replies]
            floor += [max(a, b) / 1e3 for a, b in zip(*times, strict=True)]
        mine, theirs = statistics.median(ours), statistics.median(floor)
        out[schedule] = {
            "controller_us_per_step": round(mine),
            "spmd_us_per_step": round(theirs),
            "ratio": round(mine / theirs, 3),
            "steps_each": len(ours),
            "stage_busy_share": [round(b / timed, 3) for b in busy],
            "theory_busy_share": round(1 - bubble_fraction(2, MICRO), 3),
        }
    return out


def _busy_between(spans: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)


@am.remote(propagate=lambda x, seconds: x)
def takes(x: Any, seconds: float) -> Any:
    time.sleep(seconds)
    return x * 1


class Timed(torch.autograd.Function):
    """A stage that takes FORWARD seconds forward and BACKWARD seconds backward, on its ranks."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return takes(x, FORWARD)

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:
        return takes(g, BACKWARD)


def p3(four: Any) -> dict[str, Any]:
    flat = four.flatten("stage")
    out: dict[str, Any] = {}
    for p in (2, 4):
        meshes = [flat.slice(stage=slice(s, s + 1)) for s in range(p)]
        for m in (4, 8):
            x = distribute(torch.ones(m, 2), meshes[0]).requires_grad_()
            for schedule in ("gpipe", "1f1b"):

                def step(meshes: list[Any] = meshes, x: Any = x, m: int = m,
                         schedule: str = schedule) -> float:  # fmt: skip
                    t0 = time.perf_counter()
                    loss = pipeline_step([Timed.apply] * len(meshes), meshes, x, x,
                                         lambda out, t: out.sum(), microbatches=m,
                                         schedule=schedule)  # fmt: skip
                    inspect([loss, x.grad])  # stage 0 makes the last gradient, x.grad
                    x.grad = None
                    return time.perf_counter() - t0

                step()  # warm
                best = min(step() for _ in range(BUBBLE_RUNS))  # noise only adds time
                measured = 1 - m * (FORWARD + BACKWARD) / best
                theory = bubble_fraction(p, m)
                out[f"{p}x{m}_{schedule}"] = {
                    "step_s": round(best, 3),
                    "bubble": round(measured, 3),
                    "theory": round(theory, 3),
                    "off_by": round((measured - theory) / theory, 3),
                    # what the step took beyond the schedule's (m + p - 1) (F + B)
                    "overhead_s": round(best - (m + p - 1) * (FORWARD + BACKWARD), 3),
                    "one_after_another": round((p - 1) / p, 3),
                }
    return out


def p2(procs: Any, movers: Any) -> dict[str, Any]:
    src, dst = procs.slice(pp=0), procs.slice(pp=1)
    sender, receiver = movers.slice(pp=0), movers.slice(pp=1)
    port = receiver.open.call_one().get(timeout=60)
    out: dict[str, Any] = {}
    for name, nbytes in SIZES.items():
        t = distribute(torch.ones(nbytes // 4), src)
        moved = t.to_mesh(dst)
        inspect(moved.view(-1)[0])  # warm
        buffer = sender.lend.call_one(nbytes).get(timeout=60)
        samples: dict[str, list[float]] = {"to_mesh": [], "port": [], "buffer": []}
        for _ in range(ROUNDS):
            t0 = time.perf_counter_ns()
            for _ in range(MOVES):
                moved = t.to_mesh(dst)
            inspect(moved.view(-1)[0])
            samples["to_mesh"].append((time.perf_counter_ns() - t0) / MOVES / 1e3)
            t0 = time.perf_counter_ns()
            drained = receiver.drain.call_one(MOVES)
            sender.push.call_one(port, nbytes, MOVES).get(timeout=600)
            drained.get(timeout=600)
            samples["port"].append((time.perf_counter_ns() - t0) / MOVES / 1e3)
            t0 = time.perf_counter_ns()
            receiver.read.call_one(buffer, MOVES).get(timeout=600)
            samples["buffer"].append((time.perf_counter_ns() - t0) / MOVES / 1e3)
        med = {k: statistics.median(v) for k, v in samples.items()}
        out[name] = {
            **{f"{k}_us": round(v) for k, v in med.items()},
            **{f"{k}_GBps": round(nbytes / v / 1e3, 2) for k, v in med.items()},
            "to_mesh_over_port": round(med["to_mesh"] / med["port"], 2),
            "to_mesh_over_buffer": round(med["to_mesh"] / med["buffer"], 2),
        }
    return out


def main() -> None:
    torch.set_num_threads(1)
    started = time.time()
    procs = am.this_host().spawn_procs(per_host={"pp": 2})
    try:
        device_mesh(procs)  # the group over both: the stages' engines and the SPMD side use it
        spmd = procs.spawn("spmd_pipe", SpmdPipe)
        movers = procs.spawn("movers", Mover)
        result: dict[str, Any] = {
            "machine": C.machine_info(),
            "quick": C.QUICK,
            "mesh": {"P1, P2": {"pp": 2}, "P3": {"pp": 4}},
            "rounds": ROUNDS,
            "torch": torch.__version__,
            "model": {"width": WIDTH, "batch": BATCH, "microbatches": MICRO},
        }
        only = os.environ.get("BENCH_ONLY", "P2,P1,P3").split(",")
        if "P2" in only:
            result["P2"] = p2(procs, movers)
        if "P1" in only:
            result["P1"] = p1(procs, spmd)
        if "P3" in only:
            four = am.this_host().spawn_procs(per_host={"pp": 4})
            try:
                result["P3"] = p3(four)
            finally:
                four.stop().get(timeout=60)
        with open("/proc/loadavg") as f:
            result["loadavg_end"] = f.read().split()[:3]
        result["seconds"] = round(time.time() - started, 1)
    finally:
        procs.stop().get(timeout=60)
    C.print_result(result)


if __name__ == "__main__":
    main()
