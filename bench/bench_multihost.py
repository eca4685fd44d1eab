"""Multi-host benchmark on fake hosts (network namespaces; needs root).

- ``call`` to every rank of 3 hosts x 4 procs against the same 12 ranks on one host.
- A small scale curve: ``call`` to every rank and fire-and-forget casts on 1, 2, 4 and 8 hosts x
  4 procs, with the controller's CPU time per cast.

Usage: sudo .venv/bin/python bench/bench_multihost.py [--iters N] [--scale]
Prints a Markdown table (for bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "multihost"))

from fakehosts import FakeNet, skip_reason

import actormesh as am


class Noop(am.Actor):
    @am.endpoint
    def noop(self) -> None:
        return None


def time_calls(mesh: am.ActorMesh[Noop], iters: int) -> tuple[float, float]:
    """Median wall time of call-to-all + gather (ms), and controller CPU time per call (ms)."""
    for _ in range(max(10, iters // 10)):
        mesh.noop.call().get(timeout=60)
    samples = []
    cpu0 = time.process_time()
    for _ in range(iters):
        t = time.perf_counter()
        mesh.noop.call().get(timeout=60)
        samples.append(time.perf_counter() - t)
    cpu = (time.process_time() - cpu0) / iters
    return statistics.median(samples) * 1e3, cpu * 1e3


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--scale", action="store_true", help="also 1/2/4/8 hosts x 4 procs")
    args = parser.parse_args()
    reason = skip_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    n_hosts = 8 if args.scale else 3
    net = FakeNet(n_hosts)
    agents: list[subprocess.Popen[bytes]] = []
    rows = []
    try:
        listener = am.listen_for_hosts(f"{net.controller_ip}:0")
        key = listener.write_key_file(f"/tmp/am-bench-key-{os.getpid()}")
        env = dict(os.environ, ACTORMESH_KEY_FILE=key)
        agents = [net.popen(i, listener.agent_command(), env=env) for i in range(n_hosts)]

        local = am.this_host().spawn_procs(per_host={"gpus": 12})
        wall, cpu = time_calls(local.spawn("noop", Noop), args.iters)
        rows.append(("1 host (local) x 12 procs", 12, wall, cpu))
        local.stop().get(timeout=30)

        counts = [1, 2, 3, 4, 8] if args.scale else [3]
        hosts = listener.wait_for_hosts(n_hosts, timeout=120)
        for n in counts:
            procs = hosts.slice(hosts=slice(0, n)).spawn_procs(per_host={"gpus": 4})
            wall, cpu = time_calls(procs.spawn("noop", Noop), args.iters)
            rows.append((f"{n} fake hosts x 4 procs", 4 * n, wall, cpu))
            procs.stop().get(timeout=30)
        listener.close()
        for a in agents:
            a.wait(15)
        os.unlink(key)
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
        net.down()
    print(f"curve={am.hosts.listener.curve_wanted()} iters={args.iters}")
    print("| mesh | ranks | call to all + gather, median ms | controller CPU per call, ms |")
    print("| --- | --- | --- | --- |")
    for name, ranks, wall, cpu in rows:
        print(f"| {name} | {ranks} | {wall:.3f} | {cpu:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
