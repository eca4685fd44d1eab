"""A trivial cell on 8 ranks, end to end through jupyter_client: ``%%mesh`` vs ipyparallel ``%%px``.

Each sample is one execute request, timed from sending it to the kernel's ``idle`` status for
it on IOPub (what a notebook user waits for). The cell body is ``x = 1`` on every rank. A plain
``x = 1`` cell in each kernel is timed too: the kernel's own round trip, the floor of both.

    python bench/bench_kernel.py                 # with actormesh[notebook] installed
    BENCH_OUT=out.json BENCH_QUICK=1 python bench/bench_kernel.py

The actormesh kernel runs in this interpreter's environment; the ipyparallel one (a stock
IPython kernel with 8 engines started by ``ipp.Cluster``) in ``bench/.venvs/ipp``, if it exists
(``bench/setup_venvs.sh`` makes it: ipyparallel 9.2 + ipykernel). Both kernels run at once and
their samples alternate, so that the ratio is not skewed by noise on a shared machine: that is
the figure of the target. Two more regimes follow, with the same cells: ``*_back_to_back``, ten
cells in a row per kernel (as "Run All" runs them: processes and caches stay warm), and
``*_after_pause``, each cell after 0.1 s of idle time (as a user runs cells one by one: idle
cores and cold caches are woken first). Prints JSON (and writes it to ``BENCH_OUT`` when set).
``BENCH_QUICK=1``: fewer samples.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/
import common as C

HERE = Path(__file__).resolve().parent
RANKS = 8
QUICK = os.environ.get("BENCH_QUICK") == "1"
WARMUP, ITERS = (3, 10) if QUICK else (10, 50)
BODY = "x = 1"
BLOCK = 10  # cells in a row per kernel, for the back-to-back figures
PAUSE_S = 0.1  # idle time before each cell, for the after-a-pause figures


def stats(samples_ns: list[int]) -> dict[str, Any]:
    xs = sorted(samples_ns)
    return {
        "n": len(xs),
        "median_ms": statistics.median(xs) / 1e6,
        "p90_ms": xs[min(len(xs) - 1, round(0.9 * (len(xs) - 1)))] / 1e6,
        "min_ms": xs[0] / 1e6,
    }


def run_once(kc: Any, code: str, timeout: float = 60) -> int:
    """Send ``code``; return ns until its idle status. Fails on an error reply."""
    t0 = time.perf_counter_ns()
    msg_id = kc.execute(code)
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            raise RuntimeError(f"{code!r} failed: {msg['content']['evalue']}")
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            elapsed = time.perf_counter_ns() - t0
            break
    reply = kc.get_shell_msg(timeout=timeout)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed: {reply['content']}")
    return elapsed


def start(kernel_name: str) -> tuple[Any, Any]:
    from jupyter_client.manager import start_new_kernel

    return start_new_kernel(kernel_name=kernel_name, startup_timeout=120)


def install_specs(prefix: str, ipp_python: Path | None) -> None:
    """The actormesh kernelspec from the CLI (this checkout, whatever pip did), and one that
    runs a stock IPython kernel in the ipyparallel venv."""
    subprocess.run(
        [sys.executable, "-m", "actormesh", "install-kernel", "--prefix", prefix],
        check=True,
        capture_output=True,
        timeout=60,
    )
    if ipp_python is not None:
        spec_dir = Path(prefix, "share", "jupyter", "kernels", "ipp-bench")
        spec_dir.mkdir(parents=True)
        argv = [str(ipp_python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        spec = {"argv": argv, "display_name": "ipyparallel bench", "language": "python"}
        (spec_dir / "kernel.json").write_text(json.dumps(spec))
    os.environ["JUPYTER_PATH"] = os.path.join(prefix, "share", "jupyter")


SETUP = {
    "actormesh": (
        f"import actormesh as am\nprocs = am.this_host().spawn_procs(per_host={{'gpus': {RANKS}}})"
    ),
    "ipp": (
        "import ipyparallel as ipp\n"
        f"cluster = ipp.Cluster(n={RANKS}, log_level=40)\n"
        "rc = cluster.start_and_connect_sync()\n"
        f"rc.wait_for_engines({RANKS}, timeout=300)\n"
        "rc.activate()\n"
    ),
}
CELLS = {
    "actormesh": {"mesh_cell": f"%%mesh procs\n{BODY}", "plain_cell": BODY},
    "ipp": {"px_cell": f"%%px\n{BODY}", "plain_cell": BODY},
}


def main() -> None:
    """Both kernels run side by side; their samples alternate, so both see the same noise."""
    ipp_python = HERE / ".venvs" / "ipp" / "bin" / "python"
    have_ipp = ipp_python.exists()
    out: dict[str, Any] = {"ranks": RANKS, "body": BODY, "warmup": WARMUP, "iters": ITERS}
    kernels: dict[str, tuple[Any, Any]] = {}
    with tempfile.TemporaryDirectory() as prefix:
        install_specs(prefix, ipp_python if have_ipp else None)
        try:
            kernels["actormesh"] = start("actormesh")
            if have_ipp:
                kernels["ipp"] = start("ipp-bench")
            for system, (_, kc) in kernels.items():
                run_once(kc, SETUP[system], timeout=300)
            jobs = [
                (system, name, kernels[system][1], code)
                for system in kernels
                for name, code in CELLS[system].items()
            ]
            for _ in range(WARMUP):
                for _system, _name, kc, code in jobs:
                    run_once(kc, code)
            samples: dict[tuple[str, str], list[int]] = defaultdict(list)
            for _ in range(ITERS):
                for system, name, kc, code in jobs:
                    samples[system, name].append(run_once(kc, code))
            # Two regimes beside the alternating one, to show how much of a cell's time is the
            # machine's: caches and idle cores woken by the other kernel's cells or by a pause.
            for _ in range(ITERS // BLOCK):
                for system, name, kc, code in jobs:  # as "Run All" does
                    for _ in range(BLOCK):
                        samples[system, f"{name}_back_to_back"].append(run_once(kc, code))
            for _ in range(ITERS // 2):
                for system, name, kc, code in jobs:  # as a user does, cell by cell
                    time.sleep(PAUSE_S)
                    samples[system, f"{name}_after_pause"].append(run_once(kc, code))
            for (system, name), xs in samples.items():
                out.setdefault(system, {})[name] = stats(xs)
        finally:
            if "ipp" in kernels:
                try:
                    run_once(kernels["ipp"][1], "cluster.stop_cluster_sync()", timeout=120)
                except Exception as exc:
                    out["ipp_stop_error"] = repr(exc)
            for km, kc in kernels.values():
                kc.stop_channels()
                km.shutdown_kernel(now=False)
    if have_ipp:
        mesh = out["actormesh"]["mesh_cell"]["median_ms"]
        px = out["ipp"]["px_cell"]["median_ms"]
        out["mesh_over_px"] = round(mesh / px, 3)
        for regime in ("back_to_back", "after_pause"):
            m = out["actormesh"][f"mesh_cell_{regime}"]["median_ms"]
            p = out["ipp"][f"px_cell_{regime}"]["median_ms"]
            out[f"mesh_over_px_{regime}"] = round(m / p, 3)
        out["target"] = "mesh_cell <= 0.25 x px_cell"
        out["target_met"] = mesh / px <= 0.25
    C.print_result(out)


if __name__ == "__main__":
    main()
