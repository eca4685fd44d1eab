"""A/B of two commits of actormesh on this machine: ``bench_message_path.py`` run alternately
with each commit's ``actormesh/`` first on the path (A B B A A B ...), each run timing
actormesh interleaved with raw pyzmq between the same processes.

A run's *added time* (actormesh minus raw pyzmq, per block pair) is what is compared: it is
measured against the floor within the run, so it survives the VM's drift between runs far
better than raw latencies do. Reported per commit: the median over runs of each measurement's
added µs (and its ratio), and the median of the per-run-pair differences B - A.

Run:  python bench/ab_commits.py A B [--runs 4] [--only call_one,call_all_8]
(A, B: anything ``git archive`` takes; ``WORKTREE`` means the working tree as it is.)
The benchmark script itself is always the working tree's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

CPU = "added_cpu_us_over_raw_tcp"
MAIN = "controller: main thread"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def checkout(rev: str, into: str) -> str:
    """``actormesh/`` of ``rev`` under ``into``; the path to put first on PYTHONPATH."""
    if rev == "WORKTREE":
        return REPO
    os.makedirs(into, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", REPO, "archive", rev, "actormesh"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def run_once(path: str, only: str, quick: bool, cwd: str) -> dict:
    env = dict(os.environ, PYTHONPATH=path, BENCH_ONLY=only)
    if quick:
        env["BENCH_QUICK"] = "1"
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env["BENCH_OUT"] = f.name
        subprocess.run(
            [sys.executable, os.path.join(HERE, "bench_message_path.py")],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=900,
            # Not the checkout: workers start as ``python -m``, which puts the working
            # directory first on sys.path, before PYTHONPATH. Run from the repository, every
            # worker imported the working tree's actormesh whichever commit was asked for (only
            # the controller ran the other), so the A/B compared controllers alone.
            cwd=cwd,
        )
        with open(f.name) as g:
            out: dict = json.load(g)
    for side, file in out["actormesh_files"].items():
        if not os.path.realpath(file).startswith(os.path.realpath(path) + os.sep):
            raise SystemExit(f"the {side} ran {file}, not the actormesh under {path}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--only", default="call_one,call_all_8")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="am-ab-")
    paths = {
        "A": checkout(args.a, os.path.join(tmp, "A")),
        "B": checkout(args.b, os.path.join(tmp, "B")),
    }
    names = args.only.split(",")
    results: dict[str, list[dict]] = {"A": [], "B": []}
    try:
        alternate(args, paths, names, results, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(args, names, results)


def alternate(
    args: argparse.Namespace,
    paths: dict[str, str],
    names: list[str],
    results: dict[str, list[dict]],
    tmp: str,
) -> None:
    """The runs, A B B A A B ..., each side's results appended in order."""
    for r in range(args.runs):
        for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
            out = run_once(paths[side], args.only, args.quick, tmp)
            results[side].append(out)
            row = {
                k: (
                    round(out[k]["added_us_over_raw_tcp"], 1),
                    out[k].get(CPU),
                    out[k].get("cpu_us_per_call", {}).get("actormesh", {}).get(MAIN),
                )
                for k in names
                if k in out
            }
            print(
                f"run {r} {side}: added µs, added CPU µs, main thread CPU µs {row}",
                file=sys.stderr,
                flush=True,
            )


def per_thread_diffs(k: str, results: dict[str, list[dict]]) -> dict[str, float]:
    """Per thread of actormesh's processes (``zmq I/O``: libzmq's threads), the median of the
    per-run-pair differences B - A of its CPU per call."""
    diffs: dict[str, list[float]] = {}
    for a, b in zip(results["A"], results["B"], strict=True):
        if "cpu_us_per_call" not in a[k] or "cpu_us_per_call" not in b[k]:
            continue
        cpu_a, cpu_b = a[k]["cpu_us_per_call"]["actormesh"], b[k]["cpu_us_per_call"]["actormesh"]
        for thread in cpu_a.keys() & cpu_b.keys():
            diffs.setdefault(thread, []).append(cpu_b[thread] - cpu_a[thread])
    return {t: round(statistics.median(d), 1) for t, d in sorted(diffs.items())}


def report(args: argparse.Namespace, names: list[str], results: dict[str, list[dict]]) -> None:
    summary: dict = {"a": args.a, "b": args.b, "runs": args.runs}
    for k in names:
        per = {}
        for side in ("A", "B"):
            added = [o[k]["added_us_over_raw_tcp"] for o in results[side]]
            ratio = [o[k]["ratio_over_raw_tcp"] for o in results[side]]
            floor = [o[k]["raw_tcp"]["median_us"] for o in results[side]]
            cpu = [o[k].get("added_cpu_us_over_raw_tcp") for o in results[side]]
            per[side] = {
                "added_us_median": round(statistics.median(added), 1),
                "added_cpu_us_median": None if None in cpu else round(statistics.median(cpu), 1),
                "added_us_runs": [round(x, 1) for x in added],
                "ratio_median": round(statistics.median(ratio), 3),
                "floor_us_median": round(statistics.median(floor), 1),
            }
        diffs = [
            b[k]["added_us_over_raw_tcp"] - a[k]["added_us_over_raw_tcp"]
            for a, b in zip(results["A"], results["B"], strict=True)
        ]
        per["B_minus_A_added_us_median"] = round(statistics.median(diffs), 1)
        cpu_diffs = [
            b[k]["added_cpu_us_over_raw_tcp"] - a[k]["added_cpu_us_over_raw_tcp"]
            for a, b in zip(results["A"], results["B"], strict=True)
            if "added_cpu_us_over_raw_tcp" in a[k] and "added_cpu_us_over_raw_tcp" in b[k]
        ]
        if cpu_diffs:
            per["B_minus_A_added_cpu_us_median"] = round(statistics.median(cpu_diffs), 1)
        by_thread = per_thread_diffs(k, results)
        if MAIN in by_thread:  # the thread that makes the call and reads its replies
            per["B_minus_A_main_thread_cpu_us_median"] = by_thread[MAIN]
        if by_thread:
            per["B_minus_A_cpu_us_by_thread_median"] = by_thread
        summary[k] = per
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
