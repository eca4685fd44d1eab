"""Multi-host benchmark on fake hosts (network namespaces; needs root).

- ``call`` to every rank of 3 hosts x 4 procs against the same 12 ranks on one host.
- ``--scale``: the controller's CPU time per cast on 1, 2, 4 and 8 hosts x 4 procs, with the
  per-host fan-out (one message per host, relayed by its agent) and without it (one message per
  process, as before fan-out); then 8 hosts x 4 procs x 32 actors per process = 1,024 actors:
  cast and gather to 8, 64, 256 and 1,024 actors.

Replies of a relayed ``call`` come back gathered by each host's agent (one message per host,
``relay.py``); each measurement with fan-out is also taken with ``REPLY_WINDOW = 0`` (every rank
answers the controller directly, as before gathering), in alternation within the run.

Several actors per process are several actor meshes spawned on one proc mesh; "a cast to 1,024
actors" is one cast to each of the 32 actor meshes (each sent as one message per host), all in
flight at once, then every reply gathered.

Usage: sudo .venv/bin/python bench/bench_multihost.py [--iters N] [--scale]
(``ACTORMESH_REPLY_WINDOW`` sets the agents' window; the "replies direct" variants set it to 0.)
Prints Markdown tables (for bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "multihost"))

from fakehosts import FakeNet, skip_reason

import actormesh as am
from actormesh import config
from actormesh.runtime.messaging.node import current_node

PROCS_PER_HOST = 4
ACTORS_PER_PROC = 32
ROUNDS = 5
SCALE_ROUNDS = 3
WINDOW = config.REPLY_WINDOW
LOAD = tuple(round(x, 1) for x in os.getloadavg())


class Noop(am.Actor):
    @am.endpoint
    def noop(self) -> None:
        return None


def timed(
    meshes: list[Any], iters: int, replies: bool = True, relays: Any = None
) -> tuple[float, float, float]:
    """Cast ``noop`` to every mesh of ``meshes`` at once, then gather every reply: the median
    wall time (ms), the controller's CPU time for sending the casts (the user thread's, µs per
    cast) and its whole CPU time (all threads, replies included; ms per cast).

    ``replies=False``: every rank answers directly (no gathering by the agents); ``relays``: a
    proc mesh to send to without fan-out (one message per process)."""
    gathered(replies)
    saved = direct(relays) if relays is not None else None
    try:
        return _timed(meshes, iters)
    finally:
        gathered(True)
        if saved is not None:
            relays._procs.relays = saved


def alternate(
    variants: dict[str, Callable[[], tuple[float, float, float]]], rounds: int
) -> dict[str, tuple[float, ...]]:
    """Each variant measured once per round, in turn; the median of each figure."""
    samples: dict[str, list[tuple[float, float, float]]] = {k: [] for k in variants}
    for _ in range(rounds):
        for k, measure in variants.items():
            samples[k].append(measure())
    return {
        k: tuple(statistics.median(s[i] for s in got) for i in range(3))
        for k, got in samples.items()
    }


def _timed(meshes: list[Any], iters: int) -> tuple[float, float, float]:

    def run_once() -> float:
        t = time.thread_time()
        futures = [m.noop.call() for m in meshes]
        sending = time.thread_time() - t
        for f in futures:
            f.get(timeout=60)
        return sending

    for _ in range(max(5, iters // 10)):
        run_once()
    samples = []
    sending = 0.0
    cpu0 = time.process_time()
    for _ in range(iters):
        t = time.perf_counter()
        sending += run_once()
        samples.append(time.perf_counter() - t)
    casts = iters * len(meshes)
    cpu = (time.process_time() - cpu0) / casts
    return statistics.median(samples) * 1e3, sending / casts * 1e6, cpu * 1e3


def gathered(on: bool) -> None:
    """Replies gathered per host by the agents (the default), or sent by every rank directly."""
    config.REPLY_WINDOW = WINDOW if on else 0.0


def reply_messages(meshes: list[Any], iters: int = 20) -> float:
    """Reply messages the controller handles per cast (gathered ones count once)."""
    handlers = current_node().handlers
    saved = {k: handlers[k] for k in ("reply", "replies")}
    count = [0]

    def counting(handle: Any) -> Any:
        def count_it(msg: Any) -> None:
            count[0] += 1
            handle(msg)

        return count_it

    try:
        for k, handle in saved.items():
            handlers[k] = counting(handle)
        for _ in range(iters):
            for f in [m.noop.call() for m in meshes]:
                f.get(timeout=60)
    finally:
        handlers.update(saved)
    return count[0] / (iters * len(meshes))


def direct(procs: Any) -> Any:
    """The same mesh without fan-out: every process is sent to directly (as before it)."""
    saved = procs._procs.relays
    procs._procs.relays = None
    return saved


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--scale", action="store_true", help="1-8 hosts and 1,024 actors")
    args = parser.parse_args()
    reason = skip_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    n_hosts = 8 if args.scale else 3
    net = FakeNet(n_hosts)
    agents: list[subprocess.Popen[bytes]] = []
    rows: list[tuple[str, int, float, float, float]] = []
    host_rows: list[tuple[Any, ...]] = []
    scale_rows: list[tuple[Any, ...]] = []
    try:
        listener = am.listen_for_hosts(f"{net.controller_ip}:0")
        key = listener.write_key_file(f"/tmp/am-bench-key-{os.getpid()}")
        env = dict(os.environ, ACTORMESH_KEY_FILE=key)
        agents = [net.popen(i, listener.agent_command(), env=env) for i in range(n_hosts)]

        # Every variant of one measurement is taken in alternation, ROUNDS times, and the
        # medians kept: the machine is shared, so load drifts between consecutive measurements.
        local = am.this_host().spawn_procs(per_host={"gpus": 12})
        local_mesh = local.spawn("n", Noop)
        hosts = listener.wait_for_hosts(n_hosts, timeout=120)
        if not args.scale:
            procs = hosts.spawn_procs(per_host={"gpus": PROCS_PER_HOST})
            mesh = procs.spawn("noop", Noop)
            results = alternate(
                {
                    "local": partial(timed, [local_mesh], args.iters),
                    "fan-out": partial(timed, [mesh], args.iters),
                    "replies direct": partial(timed, [mesh], args.iters, replies=False),
                    "direct": partial(timed, [mesh], args.iters, relays=procs),
                },
                ROUNDS,
            )
            names = {
                "local": ("1 host (local) x 12 procs", [local_mesh]),
                "fan-out": ("3 fake hosts x 4 procs (replies gathered per host)", [mesh]),
                "replies direct": ("3 fake hosts x 4 procs, replies direct from each rank", [mesh]),
                "direct": ("3 fake hosts x 4 procs, no fan-out (direct to each process)", [mesh]),
            }
            for k, (name, meshes) in names.items():
                wall, _, cpu = results[k]
                gathered(k != "replies direct")
                saved = direct(procs) if k == "direct" else None
                messages = reply_messages(meshes)
                if saved is not None:
                    procs._procs.relays = saved
                gathered(True)
                rows.append((name, 12, wall, cpu, messages))
            procs.stop().get(timeout=30)
        local.stop().get(timeout=30)
        if args.scale:
            for n in (1, 2, 4, 8):
                some = hosts.slice(hosts=slice(0, n))
                procs = some.spawn_procs(per_host={"gpus": PROCS_PER_HOST})
                mesh = procs.spawn("noop", Noop)
                r = alternate(
                    {
                        "gathered": partial(timed, [mesh], args.iters),
                        "replies direct": partial(timed, [mesh], args.iters, replies=False),
                        "direct": partial(timed, [mesh], args.iters, relays=procs),
                    },
                    SCALE_ROUNDS,
                )
                host_rows.append((n, n * PROCS_PER_HOST, r))
                procs.stop().get(timeout=30)
            procs = hosts.spawn_procs(per_host={"gpus": PROCS_PER_HOST})
            meshes = [procs.spawn(f"noop{i}", Noop) for i in range(ACTORS_PER_PROC)]
            for m in meshes:
                m.initialized.get(timeout=120)
            curve = [
                (8, [meshes[0].slice(hosts=slice(0, 2))]),
                (64, meshes[:2]),
                (256, meshes[:8]),
                (1024, meshes),
            ]
            for actors, chosen in curve:
                assert sum(len(m) for m in chosen) == actors
                iters = max(30, args.iters * 32 // max(actors, 32))
                r = alternate(
                    {
                        "gathered": partial(timed, chosen, iters),
                        "replies direct": partial(timed, chosen, iters, replies=False),
                    },
                    SCALE_ROUNDS,
                )
                messages = reply_messages(chosen, 10)
                gathered(False)
                messages_d = reply_messages(chosen, 10)
                gathered(True)
                scale_rows.append((actors, len(chosen), r, messages, messages_d))
            procs.stop().get(timeout=60)
        listener.close()
        for a in agents:
            a.wait(15)
        os.unlink(key)
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
        net.down()
    print(
        f"curve={am.hosts.listener.curve_wanted()} iters={args.iters} rounds={ROUNDS} "
        f"scale rounds={SCALE_ROUNDS} reply window={WINDOW * 1e3:g} ms "
        f"load average before/after={LOAD[0]}/{os.getloadavg()[0]:.1f}"
    )
    if rows:
        print(
            "| mesh | ranks | call to all + gather, median ms | controller CPU per call, ms | "
            "reply messages per call |"
        )
        print("| --- | --- | --- | --- | --- |")
        for name, ranks, wall, cpu, messages in rows:
            print(f"| {name} | {ranks} | {wall:.3f} | {cpu:.3f} | {messages:.1f} |")
        local_wall = rows[0][2]
        print()
        for name, _, wall, _, _ in rows[1:]:
            print(f"- {name}: {wall / local_wall:.2f} x of 1 host x 12 procs")
    if host_rows:
        print()
        print(
            "| hosts x 4 procs | processes | controller CPU to send one cast, fan-out, µs | "
            "same, direct to every process, µs | call + gather, fan-out, ms | "
            "same, replies direct, ms | same, no fan-out, ms | "
            "controller CPU per call, replies incl., fan-out, ms | same, replies direct, ms | "
            "same, no fan-out, ms |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for n, ranks, r in host_rows:
            g, rd, d = r["gathered"], r["replies direct"], r["direct"]
            print(
                f"| {n} | {ranks} | {g[1]:.0f} | {d[1]:.0f} | {g[0]:.3f} | {rd[0]:.3f} | "
                f"{d[0]:.3f} | {g[2]:.3f} | {rd[2]:.3f} | {d[2]:.3f} |"
            )
    if scale_rows:
        print()
        base = scale_rows[0][2]["gathered"][0]
        print(
            "| actors | casts (actor meshes) | cast + gather all, median ms | x of 8 actors | "
            "same, replies direct, ms | controller CPU to send one cast, µs | "
            "controller CPU per cast, replies incl., ms | same, replies direct, ms | "
            "reply messages per cast | same, replies direct |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for actors, casts, r, messages, messages_d in scale_rows:
            g, rd = r["gathered"], r["replies direct"]
            print(
                f"| {actors} | {casts} | {g[0]:.3f} | {g[0] / base:.1f} | {rd[0]:.3f} | "
                f"{g[1]:.0f} | {g[2]:.3f} | {rd[2]:.3f} | {messages:.1f} | {messages_d:.1f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
