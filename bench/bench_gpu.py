"""GPU benchmarks: needs a machine with NVIDIA GPUs and a CUDA build of torch.

- ``buffer``: a ``TensorBuffer`` of a CUDA tensor read and written by another rank on the same
  GPU (CUDA IPC), against the same device-to-device copy inside the reader's own process
  (``Tensor.copy_``, i.e. cudaMemcpy), interleaved in blocks. GB/s count the bytes moved once.
- ``allreduce``: a 256 MB float32 all-reduce over a group formed by ``init_process_group`` on a
  ``{"gpus": N}`` mesh (N = the GPUs visible), against the same loop launched by ``torchrun
  --nproc-per-node N`` (``gpu_allreduce_spmd.py``), alternating.

Usage: python bench/bench_gpu.py [buffer] [allreduce]   (both by default)
Prints Markdown tables for bench/RESULTS.md, with the card's name.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import actormesh as am
from actormesh.runtime.procs.osutil import visible_gpus

HERE = Path(__file__).parent
BLOCKS = 5
PER_BLOCK = 10
SIZES = {"4 KiB": 4 << 10, "64 MiB": 64 << 20, "1 GiB": 1 << 30}
ALLREDUCE_BYTES = 256 << 20
ALLREDUCE_ITERS = 20


class Owner(am.Actor):
    @am.endpoint
    def share(self, nbytes: int) -> am.TensorBuffer:
        self.tensor = torch.randn(nbytes // 4, device="cuda")
        return am.TensorBuffer(self.tensor)


class Reader(am.Actor):
    @am.endpoint
    def noop(self) -> None:
        return None

    @am.endpoint
    def measure(self, buf: am.TensorBuffer) -> dict[str, list[float]]:
        dst = torch.empty(buf.shape, device="cuda")
        src = torch.empty_like(dst)
        buf.read_into(dst).get(timeout=60)  # opens the handle
        times: dict[str, list[float]] = {"read": [], "write": [], "local": []}

        def block(kind: str) -> None:
            for _ in range(PER_BLOCK):
                t0 = time.perf_counter()
                if kind == "read":
                    buf.read_into(dst).get(timeout=60)
                elif kind == "write":
                    buf.write_from(src).get(timeout=60)
                else:
                    dst.copy_(src)
                    torch.cuda.current_stream().synchronize()
                times[kind].append(time.perf_counter() - t0)

        for _ in range(BLOCKS):
            for kind in ("local", "read", "local", "write"):
                block(kind)
        return times


def bench_buffer() -> None:
    procs = am.this_host().spawn_procs(per_host={"ranks": 2})
    try:
        owner = procs.slice(ranks=0).spawn("owner", Owner)
        reader = procs.slice(ranks=1).spawn("reader", Reader)
        rtt = []
        for _ in range(200):
            t0 = time.perf_counter()
            reader.noop.call_one().get(timeout=60)
            rtt.append(time.perf_counter() - t0)
        print(
            f"\ncall_one no-op round trip, controller to the reader: "
            f"{statistics.median(rtt) * 1e6:.0f} us (median of 200)"
        )
        print(
            "\n| size | local D2D copy GB/s (µs) | read_into GB/s (% of D2D; µs) "
            "| write_from GB/s (% of D2D; µs) |"
        )
        print("| --- | --- | --- | --- |")
        for name, nbytes in SIZES.items():
            buf = owner.share.call_one(nbytes).get(timeout=120)
            times = reader.measure.call_one(buf).get(timeout=600)
            med = {k: statistics.median(v) for k, v in times.items()}
            rate = {k: nbytes / t / 1e9 for k, t in med.items()}
            print(
                f"| {name} | {rate['local']:.1f} ({med['local'] * 1e6:.0f}) | "
                f"{rate['read']:.1f} ({100 * rate['read'] / rate['local']:.0f} %; "
                f"{med['read'] * 1e6:.0f}) | {rate['write']:.1f} "
                f"({100 * rate['write'] / rate['local']:.0f} %; {med['write'] * 1e6:.0f}) |",
                flush=True,
            )
    finally:
        procs.stop().get(timeout=60)


class AllReducer(am.Actor):
    @am.endpoint
    def measure(self, nbytes: int, iters: int, bench_dir: str) -> float:
        sys.path.insert(0, bench_dir)
        from gpu_allreduce_spmd import time_allreduce

        return time_allreduce(nbytes, iters)


def spmd_allreduce(n: int) -> float:
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}",
         str(HERE / "gpu_allreduce_spmd.py"), str(ALLREDUCE_BYTES), str(ALLREDUCE_ITERS)],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    last = [line for line in out.stdout.splitlines() if line.startswith("{")][-1]
    return float(json.loads(last)["seconds"])


def bench_allreduce() -> None:
    n = len(visible_gpus())
    procs = am.this_host().spawn_procs(per_host={"gpus": n})
    try:
        members = am.init_process_group(procs).get(timeout=180).values()
        reducers = procs.spawn("reducer", AllReducer)
        ours, theirs = [], []
        for _ in range(3):
            per_rank = reducers.measure.call(ALLREDUCE_BYTES, ALLREDUCE_ITERS, str(HERE))
            ours.append(max(per_rank.get(timeout=300).values()))
            theirs.append(spmd_allreduce(n))
    finally:
        procs.stop().get(timeout=60)
    a, b = statistics.median(ours), statistics.median(theirs)
    print(
        f"\n256 MB all-reduce, {n} rank(s), backend {members[0].backend}: actormesh "
        f"{a * 1e3:.3f} ms, torchrun {b * 1e3:.3f} ms, ratio {a / b:.3f} "
        f"(runs: {[round(x * 1e3, 3) for x in ours]} vs {[round(x * 1e3, 3) for x in theirs]})"
    )


def main() -> None:
    which = sys.argv[1:] or ["buffer", "allreduce"]
    print(
        f"card: {torch.cuda.get_device_name(0)} x {len(visible_gpus())}, torch "
        f"{torch.__version__}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}"
    )
    if "buffer" in which:
        bench_buffer()
    if "allreduce" in which:
        bench_allreduce()


if __name__ == "__main__":
    main()
