"""Where one controller-driven training step's CPU goes (issue 43), run by hand.

The T1/T1b step of ``bench_tensor.py`` (``module_to_mesh`` + AdamW + ``loss.item()``) on the
same mesh (``BENCH_DEVICE=cuda``: a rank per GPU), with thread-CPU timers around the parts of
the step, on the controller and inside each worker process (a small actor patches the engine
there, in that process only):

- controller, main thread: ``zero_grad``, forward + loss, ``backward``, ``opt.step()``,
  ``loss.item()`` (and within it the batch's pickling, ``stream.pack``); for each part, the
  time spent recording ops (in ``MeshTensor.__torch_dispatch__``'s recorder, below it torch's
  own cost of calling it) and how many ops it recorded: the rest is the user's Python, the
  controller's autograd and torch's per-op work;
- each worker: its process CPU per step; on the engine's thread the batch's unpickling, each
  op's handler (by op name; a program's steps run as ops count twice, in the program too) and
  the fetch's answer; the garbage collector by generation; what is left of the process's CPU is the
  message path (its I/O and actor threads) and gloo's threads, which each thread's CPU by name
  shows (clock ticks: 10 ms each, so steps enough to add up).

``T6``: the GPT-2 step of ``bench_tensor.py`` instead of the MLP. ``--cprofile``: also the
busiest functions of a few steps on the controller and on rank 0 (instrumented: for
attribution, not timing). ``--foreach``: AdamW(foreach=True). Prints JSON; ``BENCH_OUT=path``
writes it too. Per-op figures include the timers' own cost (two thread-CPU reads an op).

Run: ``PYTHONPATH=$PWD python bench/profile_step.py [T1|T1b|T6] [--steps 40] [--cprofile]``
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import os
import pstats
import sys
import time
from collections import defaultdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/
import common as C
import torch
import torch.nn.functional as F
from bench_tensor import MLP, SHAPES, gpt2, mesh_shape, token_batch

import actormesh as am
from actormesh.tensor import module_to_mesh
from actormesh.tensor.controller import stream as stream_mod
from actormesh.tensor.controller import tensor as tensor_mod
from actormesh.tensor.controller.mesh import tensor_mesh

_T = time.thread_time_ns


class Probe(am.Actor):
    """Timers inside a worker process's engine (this process only)."""

    def __init__(self) -> None:
        self.ops: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.parts: dict[str, int] = defaultdict(int)
        self.profile: cProfile.Profile | None = None
        self.installed = False

    @am.endpoint
    def install(self) -> None:
        from actormesh.tensor.worker import engine as engine_mod

        if self.installed:
            return
        self.installed = True
        cls = engine_mod._TensorEngine
        execute, run_batch, fetch = cls._execute, cls._run_batch, cls._fetch
        loads = engine_mod.loads
        ops, parts = self.ops, self.parts

        def timed_execute(engine: Any, op: Any) -> None:
            t0 = _T()
            execute(engine, op)
            cell = ops[op[4][0] if op[0] == "aten" else op[0]]
            if op[0] == "program":  # its steps are timed as ops too (those run as sent)
                cell = ops["program (its fast steps)"]
            cell[0] += 1
            cell[1] += _T() - t0

        def timed_loads(data: Any) -> Any:
            t0 = _T()
            out = loads(data)
            parts["unpickle"] += _T() - t0
            return out

        def timed_run_batch(engine: Any, batch: Any, drops: Any) -> None:
            t0 = _T()
            run_batch(engine, batch, drops)
            parts["batch"] += _T() - t0
            parts["batches"] += 1

        def timed_fetch(engine: Any, requests: Any) -> Any:
            t0 = _T()
            out = fetch(engine, requests)
            parts["fetch"] += _T() - t0
            return out

        time_collections(parts)
        _time_dtensor_dispatch(ops)
        cls._execute = timed_execute  # type: ignore[method-assign]
        cls._run_batch = timed_run_batch  # type: ignore[method-assign]
        cls._fetch = timed_fetch  # type: ignore[method-assign]
        engine_mod.loads = timed_loads

    @am.endpoint
    def reset(self) -> float:
        self.ops.clear()
        self.parts.clear()
        self.threads = threads_cpu()
        return time.process_time()

    @am.endpoint
    def read(self) -> tuple[float, dict[str, list[int]], dict[str, int]]:
        from actormesh.tensor.worker.local import REGISTRY

        parts = dict(self.parts)
        for engine in REGISTRY.values():
            parts["poisoned values"] = len(engine.poison)
            parts["programs kept"] = len(getattr(engine, "programs", ()))
        for name, ns in threads_cpu().items():
            parts[f"thread {name}"] = ns - self.threads.get(name, 0)
        return time.process_time(), dict(self.ops), parts

    @am.endpoint
    def cprofile(self, on: bool) -> str:
        """Profile the engine's thread (the batches run on the actor thread of the engine)."""
        from actormesh.tensor.worker import engine as engine_mod

        cls = engine_mod._TensorEngine
        if on:
            # Thread CPU, not wall time: on a loaded machine a wall-clock profile charges a
            # function for the time its process waited for a core.
            self.profile = prof = cProfile.Profile(time.thread_time_ns, 1e-9)
            self._plain = cls._run_batch

            def profiled(engine: Any, batch: Any, drops: Any) -> None:
                prof.enable()
                try:
                    self._plain(engine, batch, drops)
                finally:
                    prof.disable()

            cls._run_batch = profiled  # type: ignore[method-assign]
            return ""
        cls._run_batch = self._plain  # type: ignore[method-assign]
        assert self.profile is not None
        return _top(self.profile, 30)


def threads_cpu() -> dict[str, int]:
    """CPU (ns) of each thread of this process so far, by name: a Python thread's own, another's
    (zmq's I/O, gloo's) as the kernel names it; threads of one name add up."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = 1e9 / os.sysconf("SC_CLK_TCK")
    out: dict[str, int] = defaultdict(int)
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            continue  # ended since the listing
        comm, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        utime, stime = (int(v) for v in fields.split()[11:13])
        name = names.get(int(tid), comm)
        out[name.rstrip("0123456789-_")] += int((utime + stime) * tick)
    return dict(out)


def _per_thread(parts: dict[str, int], steps: int) -> dict[str, int]:
    """µs per step of each thread that ran, busiest first."""
    threads = [(k.removeprefix("thread "), v) for k, v in parts.items() if k.startswith("thread ")]
    return {k: round(v / 1e3 / steps) for k, v in sorted(threads, key=lambda kv: -kv[1]) if v}


def _time_dtensor_dispatch(ops: dict[str, list[int]]) -> None:
    """Count and time, by op name, the ops no shard route took (DTensor's own dispatch ran
    them), under ``DTensor: <op>``: what a new route would save."""
    from actormesh.tensor.worker import aten, programs

    plain = aten.on_dtensors

    def timed(name: str, func: Any, args: Any, kwargs: dict[str, Any]) -> list[Any]:
        t0 = _T()
        out = plain(name, func, args, kwargs)
        cell = ops[f"DTensor: {name}"]
        cell[0] += 1
        cell[1] += _T() - t0
        return out

    aten.on_dtensors = timed
    programs.on_dtensors = timed  # type: ignore[attr-defined]


def time_collections(parts: dict[str, int]) -> None:
    """Add the garbage collector's thread CPU to ``parts``, by generation (and 1000 per run)."""
    import gc

    started = [0]

    def timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = _T()
        else:
            parts[f"gc gen{info['generation']}"] += _T() - started[0]
            parts[f"gc gen{info['generation']} runs"] += 1000

    gc.callbacks.append(timer)


def _top(prof: cProfile.Profile, n: int) -> str:
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(n)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", nargs="?", default="T1", choices=[*sorted(SHAPES), "T6"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--foreach", action="store_true", help="AdamW(foreach=True)")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    procs = am.this_host().spawn_procs(per_host=mesh_shape())
    result: dict[str, Any] = {"machine": C.machine_info(), "case": opts.case, "steps": opts.steps}
    result["mesh"] = mesh_shape()
    try:
        tm = tensor_mesh(procs)
        probe = procs.spawn("probe", Probe)
        probe.install.call().get(timeout=60)
        if opts.case == "T6":  # Hugging Face's GPT-2 (tiny), its loss from labels
            model = module_to_mesh(gpt2(), procs)
            tokens = token_batch()

            def loss_of() -> Any:
                return model(**tokens).loss
        else:
            d_in, hidden, d_out, batch = SHAPES[opts.case]
            torch.manual_seed(0)
            model = module_to_mesh(MLP(d_in, hidden, d_out), procs)
            x, y = torch.randn(batch, d_in), torch.randn(batch, d_out)

            def loss_of() -> Any:
                return F.mse_loss(model(x), y)

        extra = {"foreach": True} if opts.foreach else {}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **extra)
        phases: dict[str, int] = defaultdict(int)
        time_collections(phases)
        pack = stream_mod.pack

        def timed_pack(ops: Any) -> Any:
            t0 = _T()
            out = pack(ops)
            phases["item: pickling the batch"] += _T() - t0
            phases["ops per batch (x1000)"] += len(ops)
            return out

        stream_mod.pack = timed_pack
        recorded = [0, 0]  # thread CPU ns in the recorder, ops recorded
        ops_recorded: dict[str, int] = defaultdict(int)
        record = tensor_mod.methods.dispatch

        def timed_dispatch(func: Any, args: Any, kwargs: Any) -> Any:
            t0 = _T()
            try:
                return record(func, args, kwargs)
            finally:
                recorded[0] += _T() - t0
                recorded[1] += 1

        tensor_mod.install_methods(dataclasses.replace(tensor_mod.methods, dispatch=timed_dispatch))

        def step() -> float:
            seen = []  # (thread CPU, recorder's CPU, ops recorded) at each part's edge

            def edge() -> None:
                seen.append((_T(), *recorded))

            edge()
            opt.zero_grad()
            edge()
            loss = loss_of()
            edge()
            loss.backward()
            edge()
            opt.step()
            edge()
            value = loss.item()
            edge()
            names = ("zero_grad", "forward + loss", "backward", "opt.step", "item")
            for name, a, b in zip(names, seen, seen[1:], strict=False):
                phases[name] += b[0] - a[0]
                phases[f"{name}: recording"] += b[1] - a[1]
                ops_recorded[name] += b[2] - a[2]
            return value

        for _ in range(10):
            step()
        phases.clear()
        ops_recorded.clear()
        before = probe.reset.call().get(timeout=60)
        mine = time.process_time()
        wall = time.perf_counter()
        for _ in range(opts.steps):
            step()
        wall = time.perf_counter() - wall
        mine = time.process_time() - mine
        after = probe.read.call().get(timeout=60)
        n = opts.steps
        result["wall_ms_per_step"] = wall * 1e3 / n
        result["controller"] = {
            "process_cpu_ms": mine * 1e3 / n,
            "main_thread_us": {k: v / 1e3 / n for k, v in phases.items()},
            "ops_recorded_per_step": {k: v / n for k, v in ops_recorded.items()},
        }
        workers = {}
        for point, (cpu, ops, parts) in after.items():
            rank = str(point)
            start = before[point] if point in before else next(iter(before.values()))
            batch_us = parts.get("batch", 0) / 1e3 / n
            op_us = {k: (c, round(t / 1e3 / n, 1)) for k, (c, t) in
                     sorted(ops.items(), key=lambda kv: -kv[1][1])}  # fmt: skip
            workers[rank] = {
                "process_cpu_ms": (cpu - start) * 1e3 / n,
                "batch_us": batch_us,
                "unpickle_us": parts.get("unpickle", 0) / 1e3 / n,
                "ops_us": sum(t for k, (_, t) in op_us.items() if not k.startswith("DTensor: ")),
                "fetch_us": parts.get("fetch", 0) / 1e3 / n,
                "gc_us": {k: v / 1e3 / n for k, v in parts.items() if k.startswith("gc")},
                "threads_us": _per_thread(parts, n),
                "batches_per_step": parts.get("batches", 0) / n,
                "poisoned_values": parts.get("poisoned values", 0),
                "programs_kept": parts.get("programs kept", 0),
                "per_op": {k: f"{c // n} x, {t} us" for k, (c, t) in op_us.items()},
            }
        result["workers"] = workers
        if opts.cprofile:
            probe.cprofile.call(True).get(timeout=60)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(opts.steps):
                step()
            prof.disable()
            texts = probe.cprofile.call(False).get(timeout=60)
            result["cprofile_controller"] = _top(prof, 40)
            result["cprofile_rank0"] = next(iter(texts.values()))
        # Whether the controller made a CUDA context of its own (a MeshTensor on the GPUs says
        # its device is cuda:0; nothing of it is on this process's GPU)
        result["controller_cuda_initialized"] = torch.cuda.is_initialized()
        programs = getattr(tm.stream, "programs", None)  # (an A/B against code without them)
        result["programs_sent"] = programs.sent if programs is not None else None
        with open("/proc/loadavg") as f:
            result["loadavg_end"] = f.read().split()[:3]
        del tm
    finally:
        procs.stop().get(timeout=60)
    cp = {k: result.pop(k) for k in ("cprofile_controller", "cprofile_rank0") if k in result}
    C.print_result(result)
    for k, v in cp.items():
        print(f"==== {k}\n{v}")


if __name__ == "__main__":
    main()
