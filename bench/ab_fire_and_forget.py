"""A/B of two commits of actormesh on fire-and-forget: ``bench_actormesh.py``'s workload (10,000
``incr.broadcast()`` to one actor, the clock stopped when ``count`` says 10,000), run
alternately with each commit's ``actormesh/`` first on the path (A B B A A B ...), plus two
mixes that the batching of one-way messages meets in real code: a broadcast to one actor then a
``call_one`` to another (``bcast+call``), and a broadcast to a mesh of 2 then its ``call`` every
100 broadcasts (``bcast2+call/100``).

Run:  python bench/ab_fire_and_forget.py A B [--runs 4] [--msgs 10000]
(A, B: anything ``git archive`` takes; ``WORKTREE`` means the working tree as it is.)
Each run is a fresh controller with its own 3-rank mesh, started from a temporary directory
(workers start as ``python -m``, which puts the working directory first on ``sys.path``).
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

from ab_commits import checkout  # the same checkout of a commit's actormesh/

WORKLOAD = r"""
import json, sys, time
import actormesh as am

MSGS = int(sys.argv[1])


class Sink(am.Actor):
    def __init__(self):
        self.n = 0

    @am.endpoint
    def incr(self):
        self.n += 1

    @am.endpoint
    def count(self):
        return self.n

    @am.endpoint
    def reset(self):
        self.n = 0


def rate(fn, msgs):
    t0 = time.perf_counter()
    fn(msgs)
    return msgs / (time.perf_counter() - t0)


def main():
    procs = am.this_host().spawn_procs(per_host={"gpus": 3})
    sinks = procs.spawn("sink", Sink)
    one, other, two = sinks.slice(gpus=0), sinks.slice(gpus=1), sinks.slice(gpus=slice(1, 3))

    def ff(n):  # bench_actormesh.py's fire-and-forget
        for _ in range(n):
            one.incr.broadcast()
        while one.count.call_one().get(timeout=60) < n:
            pass

    def bcast_call(n):
        for _ in range(n):
            one.incr.broadcast()
            other.count.call_one().get(timeout=60)
        while one.count.call_one().get(timeout=60) < n:
            pass

    def bcast2_call(n):
        for i in range(n):
            two.incr.broadcast()
            if i % 100 == 99:
                two.count.call().get(timeout=60)
        while min(two.count.call().get(timeout=60).values()) < n:
            pass

    out = {"file": am.__file__}
    for name, fn, n in (("ff", ff, MSGS), ("bcast+call", bcast_call, MSGS // 10),
                        ("bcast2+call/100", bcast2_call, MSGS)):
        fn(max(n // 10, 1))  # warm-up
        rates = []
        for _ in range(3):
            sinks.reset.call().get(timeout=60)
            rates.append(rate(fn, n))
        out[name] = sorted(rates)[1]
    procs.stop().get(timeout=30)
    print(json.dumps(out))


main()
"""


def run_once(path: str, msgs: int, cwd: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.run(
        [sys.executable, "-c", WORKLOAD, str(msgs)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    out: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    file = str(out.pop("file"))
    if not os.path.realpath(file).startswith(os.path.realpath(path) + os.sep):
        raise SystemExit(f"the run imported {file}, not the actormesh under {path}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="fire-and-forget rates of two commits, A B B A ...")
    ap.add_argument("a", help="a commit (or WORKTREE)")
    ap.add_argument("b", help="another commit (or WORKTREE)")
    ap.add_argument("--runs", type=int, default=4, help="runs of each side")
    ap.add_argument("--msgs", type=int, default=10000, help="broadcasts per measurement")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="am-ab-ff-")
    paths = {
        "A": checkout(args.a, os.path.join(tmp, "A")),
        "B": checkout(args.b, os.path.join(tmp, "B")),
    }
    results: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    try:
        for r in range(args.runs):
            for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
                out = run_once(paths[side], args.msgs, tmp)
                results[side].append(out)
                print(
                    f"run {r} {side}: msg/s { ({k: round(v) for k, v in out.items()}) }",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary: dict[str, object] = {"a": args.a, "b": args.b, "runs": args.runs}
    for k in results["A"][0]:
        a = [o[k] for o in results["A"]]
        b = [o[k] for o in results["B"]]
        pairs = [y / x for x, y in zip(a, b, strict=True)]
        summary[k] = {
            "A_median_msg_s": round(statistics.median(a)),
            "B_median_msg_s": round(statistics.median(b)),
            "B_over_A_median_of_pairs": round(statistics.median(pairs), 3),
        }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
