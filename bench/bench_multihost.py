"""Multi-host benchmark on fake hosts (network namespaces; needs root).

- ``call`` to every rank of 3 hosts x 4 procs against the same 12 ranks on one host.
- ``--scale``: the controller's CPU time per cast on 1, 2, 4 and 8 hosts x 4 procs, with the
  per-host fan-out (one message per host, relayed by its agent) and without it (one message per
  process, as before fan-out); then 8 hosts x 4 procs x 32 actors per process = 1,024 actors:
  cast and gather to 8, 64, 256 and 1,024 actors.

Several actors per process are several actor meshes spawned on one proc mesh; "a cast to 1,024
actors" is one cast to each of the 32 actor meshes (each sent as one message per host), all in
flight at once, then every reply gathered.

Usage: sudo .venv/bin/python bench/bench_multihost.py [--iters N] [--scale]
Prints Markdown tables (for bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "multihost"))

from fakehosts import FakeNet, skip_reason

import actormesh as am

PROCS_PER_HOST = 4
ACTORS_PER_PROC = 32
ROUNDS = 5


class Noop(am.Actor):
    @am.endpoint
    def noop(self) -> None:
        return None


def timed(meshes: list[Any], iters: int) -> tuple[float, float, float]:
    """Cast ``noop`` to every mesh of ``meshes`` at once, then gather every reply: the median
    wall time (ms), the controller's CPU time for sending the casts (the user thread's, µs per
    cast) and its whole CPU time (all threads, replies included; ms per cast)."""

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
    rows: list[tuple[str, int, float, float]] = []
    host_rows: list[tuple[int, int, float, float, float, float]] = []
    scale_rows: list[tuple[int, int, float, float, float]] = []
    try:
        listener = am.listen_for_hosts(f"{net.controller_ip}:0")
        key = listener.write_key_file(f"/tmp/am-bench-key-{os.getpid()}")
        env = dict(os.environ, ACTORMESH_KEY_FILE=key)
        agents = [net.popen(i, listener.agent_command(), env=env) for i in range(n_hosts)]

        # Local, fan-out and direct measured in alternation (the machine is shared: noisy).
        local = am.this_host().spawn_procs(per_host={"gpus": 12})
        local_mesh = local.spawn("n", Noop)
        hosts = listener.wait_for_hosts(n_hosts, timeout=120)
        if not args.scale:
            procs = hosts.spawn_procs(per_host={"gpus": PROCS_PER_HOST})
            mesh = procs.spawn("noop", Noop)
            results: dict[str, list[tuple[float, float, float]]] = {}
            for _ in range(ROUNDS):
                results.setdefault("local", []).append(timed([local_mesh], args.iters))
                results.setdefault("fan-out", []).append(timed([mesh], args.iters))
                saved = direct(procs)
                results.setdefault("direct", []).append(timed([mesh], args.iters))
                procs._procs.relays = saved
            names = {
                "local": ("1 host (local) x 12 procs", 12),
                "fan-out": ("3 fake hosts x 4 procs", 12),
                "direct": ("3 fake hosts x 4 procs, no fan-out (direct to each process)", 12),
            }
            for k, (name, ranks) in names.items():
                wall = statistics.median(r[0] for r in results[k])
                cpu = statistics.median(r[2] for r in results[k])
                rows.append((name, ranks, wall, cpu))
            procs.stop().get(timeout=30)
        local.stop().get(timeout=30)
        if args.scale:
            for n in (1, 2, 4, 8):
                some = hosts.slice(hosts=slice(0, n))
                procs = some.spawn_procs(per_host={"gpus": PROCS_PER_HOST})
                mesh = procs.spawn("noop", Noop)
                wall, send, _ = timed([mesh], args.iters)
                saved = direct(procs)
                wall_d, send_d, _ = timed([mesh], args.iters)
                procs._procs.relays = saved
                host_rows.append((n, n * PROCS_PER_HOST, send, send_d, wall, wall_d))
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
                wall, send, cpu = timed(chosen, iters)
                scale_rows.append((actors, len(chosen), wall, send, cpu))
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
    print(f"curve={am.hosts.listener.curve_wanted()} iters={args.iters} rounds={ROUNDS}")
    if rows:
        print("| mesh | ranks | call to all + gather, median ms | controller CPU per call, ms |")
        print("| --- | --- | --- | --- |")
        for name, ranks, wall, cpu in rows:
            print(f"| {name} | {ranks} | {wall:.3f} | {cpu:.3f} |")
    if host_rows:
        print()
        print(
            "| hosts x 4 procs | processes | controller CPU to send one cast, fan-out, µs | "
            "same, direct to every process, µs | call + gather, fan-out, ms | same, direct, ms |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for n, ranks, send, send_d, wall, wall_d in host_rows:
            print(f"| {n} | {ranks} | {send:.0f} | {send_d:.0f} | {wall:.3f} | {wall_d:.3f} |")
    if scale_rows:
        print()
        base = scale_rows[0][2]
        print(
            "| actors | casts (actor meshes) | cast + gather all, median ms | x of 8 actors | "
            "controller CPU to send one cast, µs | controller CPU per cast, replies incl., ms |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for actors, casts, wall, send, cpu in scale_rows:
            print(
                f"| {actors} | {casts} | {wall:.3f} | {wall / base:.1f} | {send:.0f} | {cpu:.3f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
