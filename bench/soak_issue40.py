"""Soak of issue 40's fixes, longer than the tests: each part repeats one attack many times and
prints its figures (JSON on stdout, a summary on stderr).

- ``interrupts``: Ctrl-C at random points of a loop of in-place, out-of-place and collective
  tensor ops and sync points (``pthread_kill`` SIGINT and ``interrupt_main``, alternately), on
  a {dp: 2, tp: 2} mesh; at the end every rank's values are compared (they must agree, and lie
  between the ops the loop counted and that plus the interrupts).
- ``replies``: an endpoint answers and its process exits 1-5 ms later while the caller is busy;
  every reply must arrive (the rank is healed between rounds).
- ``order``: pipelined ``call_one``s whose replies alternate between 100 kB (the process inbox)
  and small (datagrams); every round must complete in order.
- ``lane``: 80 unread 1 MiB messages to a rank that is then killed; the controller's lane must
  be free again each time.

At the end it checks that nothing of its own is left in ``/dev/shm`` or ``/tmp``: files of its
processes (by pid) and run directories it made.

Run:  python bench/soak_issue40.py [--interrupts 1000] [--replies 100] [--order 20] [--lane 5]
"""

from __future__ import annotations

import _thread
import argparse
import glob
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from functools import partial
from typing import Any

import psutil
import torch

import actormesh as am
from actormesh.runtime.messaging.node import current_node
from actormesh.tensor import distribute, inspect

WAIT = 60


def soak_interrupts(count: int) -> dict[str, Any]:
    procs = am.this_host().spawn_procs(per_host={"dp": 2, "tp": 2})
    try:
        x = distribute(torch.arange(16.0, dtype=torch.float64).reshape(4, 4), procs, ["dp", None])
        acc = distribute(torch.zeros((), dtype=torch.float64), procs)
        total = distribute(torch.zeros((), dtype=torch.float64), procs)
        chain = acc + 0
        warm = (chain + 1, total + x.sum(), acc + 1)  # first uses import lazily: not interrupted
        assert [v.item() for v in warm] == [1.0, 120.0, 1.0]
        del warm
        caught, done = threading.Event(), threading.Event()
        unanswered = [0]

        def pester() -> None:
            rng = random.Random(40)
            main = threading.main_thread().ident
            assert main is not None
            for i in range(count):
                time.sleep(rng.uniform(0, 0.003))  # a random point, not synchronisation
                if i % 2:
                    signal.pthread_kill(main, signal.SIGINT)
                else:
                    _thread.interrupt_main()
                if not caught.wait(5):
                    unanswered[0] += 1  # a destructor got it: Python prints and drops it
                caught.clear()
            done.set()

        adds = steps = sums = interrupted = k = 0
        landed: Counter[str] = Counter()
        start = time.monotonic()
        threading.Thread(target=pester, daemon=True).start()
        while not done.is_set():
            try:
                while not done.is_set():
                    acc.add_(1)
                    adds += 1
                    chain = chain + 1
                    steps += 1
                    k += 1
                    if k % 20 == 0:
                        total.add_(x.sum())
                        sums += 1
                    if k % 50 == 0:
                        acc.item()
            except KeyboardInterrupt as exc:
                interrupted += 1
                tb = exc.__traceback__
                while tb is not None and tb.tb_next is not None:
                    tb = tb.tb_next
                landed[tb.tb_frame.f_code.co_filename.rsplit("/", 1)[-1] if tb else "?"] += 1
                caught.set()
        seconds = time.monotonic() - start
        sizes = procs.sizes

        def ranks(t: Any) -> list[float]:
            return [
                inspect(t, dp=d, tp=p).item()
                for d in range(sizes["dp"])
                for p in range(sizes["tp"])
            ]

        values = {"acc": ranks(acc), "chain": ranks(chain), "total": ranks(total)}
        counted = {"acc": adds, "chain": steps, "total": 120 * sums}
        agree = all(len(set(v)) == 1 for v in values.values())
        within = all(
            counted[n] <= v[0] <= counted[n] + interrupted * (120 if n == "total" else 1)
            for n, v in values.items()
        )
        return {
            "interrupts_sent": count,
            "caught": interrupted,
            "dropped_by_python_in_a_destructor": unanswered[0],
            "landed_in": dict(landed.most_common()),
            "ops_recorded_in_loop": acc.mesh.stream.recorded,
            "seconds": round(seconds, 1),
            "values_on_every_rank": values,
            "counted_by_the_loop": counted,
            "ranks_agree": agree,
            "within_bounds": within,
            "stream_lost": repr(acc.mesh.stream.lost),
        }
    finally:
        procs.stop().get(timeout=WAIT)


class Quitter(am.Actor):
    @am.endpoint
    def answer_then_exit(self, delay: float) -> str:
        threading.Timer(delay, os._exit, (9,)).start()
        return "answered"


def soak_replies(rounds: int) -> dict[str, Any]:
    from actormesh.runtime.faults import supervision

    previous = supervision.set_fault_hook(lambda failure: None)  # the deaths themselves
    procs = am.this_host().spawn_procs(per_host={"gpus": 1})
    lost = 0
    try:
        for attempt in range(rounds):
            quitter = procs.spawn(f"quitter{attempt}", Quitter)
            quitter.initialized.get(timeout=WAIT)
            reply = quitter.answer_then_exit.call_one(0.001 * (1 + attempt % 5))
            deadline = time.monotonic() + WAIT
            while procs.health().values()[0] == "alive" and time.monotonic() < deadline:
                time.sleep(0.01)  # busy elsewhere while the reply comes and the rank exits
            try:
                reply.get(timeout=WAIT)
            except am.SupervisionError:
                lost += 1
            procs.heal().get(timeout=WAIT)
    finally:
        procs.stop().get(timeout=WAIT)
        supervision.set_fault_hook(previous)
    return {"rounds": rounds, "replies_lost": lost}


class Echo(am.Actor):
    @am.endpoint
    def echo(self, index: int, size: int) -> tuple[int, bytes]:
        return index, b"x" * size


def _append_index(out: list[int], future: Any) -> None:
    out.append(future.get()[0])


def soak_order(rounds: int) -> dict[str, Any]:
    procs = am.this_host().spawn_procs(per_host={"gpus": 1})
    bad = 0
    try:
        echo = procs.spawn("echo", Echo)
        echo.initialized.get(timeout=WAIT)
        for _ in range(rounds):
            completed: list[int] = []
            futures = [echo.echo.call_one(i, 100_000 if i % 3 == 2 else 10) for i in range(60)]
            for f in futures:
                f.add_done_callback(partial(_append_index, completed))
            for f in futures:
                f.get(timeout=WAIT)
            deadline = time.monotonic() + WAIT
            while len(completed) < 60 and time.monotonic() < deadline:
                time.sleep(0.001)
            bad += completed != list(range(60))
    finally:
        procs.stop().get(timeout=WAIT)
    return {"rounds": rounds, "calls_per_round": 60, "rounds_out_of_order": bad}


class Sink(am.Actor):
    @am.endpoint
    def hold(self, seconds: float) -> None:
        threading.Event().wait(seconds)

    @am.endpoint
    def take(self, t: torch.Tensor) -> float:
        return float(t[0])

    @am.endpoint
    def pid(self) -> int:
        return os.getpid()


def soak_lane(rounds: int) -> dict[str, Any]:
    from actormesh.runtime.faults import supervision

    lane = current_node().transport._lane  # what the soak watches
    assert lane is not None
    previous = supervision.set_fault_hook(lambda failure: None)
    procs = am.this_host().spawn_procs(per_host={"gpus": 1})
    filled, left = [], []
    try:
        for r in range(rounds):
            sink = procs.spawn(f"sink{r}", Sink)
            pid = sink.pid.call_one().get(timeout=WAIT)
            sink.hold.broadcast(600)
            for i in range(80):
                sink.take.broadcast(torch.full((1 << 18,), float(i)))
            deadline = time.monotonic() + WAIT
            while lane.unread() < 60 and time.monotonic() < deadline:
                time.sleep(0.01)
            filled.append(lane.unread())
            os.kill(pid, signal.SIGKILL)
            while procs.health().values()[0] == "alive" and time.monotonic() < deadline:
                time.sleep(0.01)
            left.append(lane.unread())
            procs.heal().get(timeout=WAIT)
    finally:
        procs.stop().get(timeout=WAIT)
        supervision.set_fault_hook(previous)
    return {"rounds": rounds, "unread_before_the_kill": filled, "unread_after": left}


def orphaned_shm() -> set[str]:
    """actormesh's files in /dev/shm whose process is gone."""
    out = set()
    for path in glob.glob("/dev/shm/actormesh-*"):
        pid = os.path.basename(path).split("-")[2]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            out.add(path)
    return out


def _live(run_dir: str) -> bool:
    """Whether the run directory's owner still runs (other jobs on this host make theirs)."""
    try:
        with open(os.path.join(run_dir, "owner")) as f:
            return psutil.pid_exists(int(f.read().split()[1]))
    except (OSError, ValueError, IndexError):
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interrupts", type=int, default=1000)
    ap.add_argument("--replies", type=int, default=100)
    ap.add_argument("--order", type=int, default=20)
    ap.add_argument("--lane", type=int, default=5)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        out: dict[str, Any] = {}
        for name, fn, n in (
            ("lane", soak_lane, args.lane),
            ("order", soak_order, args.order),
            ("replies", soak_replies, args.replies),
            ("interrupts", soak_interrupts, args.interrupts),
        ):
            if n:
                start = time.monotonic()
                out[name] = fn(n)
                out[name]["wall_s"] = round(time.monotonic() - start, 1)
                print(name, json.dumps(out[name]), file=sys.stderr, flush=True)
        print(json.dumps(out))
        return
    # The soak runs in a child, so that what it leaves behind is judged once it has ended.
    tmp_before, shm_before = set(glob.glob("/tmp/am-*")), orphaned_shm()
    child = subprocess.run(
        [sys.executable, __file__, "--child", *sys.argv[1:]],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    out = json.loads(child.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 10  # its host agent removes what its workers had
    while time.monotonic() < deadline:
        left_shm = sorted(orphaned_shm() - shm_before)
        left_tmp = sorted(d for d in set(glob.glob("/tmp/am-*")) - tmp_before if not _live(d))
        if not left_shm and not left_tmp:
            break
        time.sleep(0.1)
    out["left_behind"] = {"dev_shm_of_dead_processes": left_shm, "tmp_run_dirs": left_tmp}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
