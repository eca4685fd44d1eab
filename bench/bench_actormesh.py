"""actormesh benchmark: the peers' workloads, through actormesh's public API only.

Same parameters (common.py) and metric names as peers/bench_monarch.py, so report.py can put
actormesh beside the floor and the peers:

- ``init_s``            ``am.this_host()`` alone
- ``spawn_{n}``         ``spawn_procs(per_host={"gpus": n})`` + ``spawn`` + first ``call`` returning
                        from all n actors (each imports torch in ``__init__``), for n = 2, 4, 8
                        in that order in one controller process (as the peers measure it)
- ``spawn_cold_8``      the same for 8, ``this_host()`` included, in a fresh controller process
                        started first (nothing of this runtime warm yet)
- ``call_all_{n}``      ``actors.ping.call(i).get()`` on all n actors (ValueMesh gathered)
- ``call_one``          ``actors.slice(gpus=0).ping.call_one(i).get()``
- ``ff_rep{k}``         10,000 ``incr.broadcast()`` to one actor until ``count`` returns 10,000
- ``send_{1MB,64MB}``   ``nbytes.call_one(t)`` with a float32 tensor (controller -> actor)
- ``fetch_{1MB,64MB}``  ``produce.call_one().get()`` returns a tensor (actor -> controller)

Optional (recorded as errors when the API is missing or fails; they never stop the run):

- ``a2a_msg_{64MB,256MB}``     actor B's endpoint calls ``A.produce.call_one().get()``
- ``a2a_buffer_{64MB,256MB}``  A returns ``am.TensorBuffer(t)``, B calls ``buf.read_into(dst)``
- ``stacks_8``                 ``procs.stacks()`` on the 8-proc mesh
- ``fault_detect_s``           SIGKILL of a worker with a call pending -> the caller's error

Run:  BENCH_OUT=out.json bench/.venvs/actormesh/bin/python bench/bench_actormesh.py
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/
import common as C
import torch

import actormesh as am

# A phase that runs longer than this is reported as hung: the JSON is saved and the process
# exits, so one hang does not cost the whole run (run.sh has an outer limit too).
PHASE_TIMEOUT_S = float(os.environ.get("BENCH_PHASE_TIMEOUT", "240"))


class Worker(am.Actor):
    def __init__(self) -> None:
        import torch as _t  # torch imported in every worker, like the peers

        self._torch = _t
        self.n = 0
        self.t: Any = None
        self.dst: dict[int, Any] = {}
        self.buf: Any = None

    @am.endpoint
    def ready(self) -> int:
        return os.getpid()

    @am.endpoint
    def ping(self, i: int) -> int:
        return i

    @am.endpoint
    def incr(self) -> None:
        self.n += 1

    @am.endpoint
    def count(self) -> int:
        return self.n

    @am.endpoint
    def reset(self) -> None:
        self.n = 0

    @am.endpoint
    def nbytes(self, t: Any) -> int:  # controller -> actor, small ack
        return t.numel() * t.element_size()

    @am.endpoint
    def make(self, nbytes: int) -> int:
        self.t = self._torch.ones(nbytes // 4, dtype=self._torch.float32)
        return nbytes

    @am.endpoint
    def produce(self) -> Any:  # actor -> caller
        return self.t

    @am.endpoint
    def pull(self, other: Any, nbytes: int) -> int:  # actor -> actor by message
        t0 = time.perf_counter_ns()
        t = other.produce.call_one().get()
        assert t.numel() * 4 == nbytes
        return time.perf_counter_ns() - t0

    @am.endpoint
    def make_buffer(self, nbytes: int) -> Any:
        self.t = self._torch.ones(nbytes // 4, dtype=self._torch.float32)
        self.buf = am.TensorBuffer(self.t)
        return self.buf

    @am.endpoint
    def read_buffer(self, buf: Any, nbytes: int) -> int:
        dst = self.dst.get(nbytes)
        if dst is None:
            dst = self.dst[nbytes] = self._torch.zeros(nbytes // 4, dtype=self._torch.float32)
        t0 = time.perf_counter_ns()
        r = buf.read_into(dst)
        if hasattr(r, "get"):
            r.get()
        el = time.perf_counter_ns() - t0
        # Each read must land: its first and last elements are checked, then zeroed for the
        # next read (zeroing all 256 MB here would be timed by the caller's round trip).
        assert float(dst[0]) == 1.0 and float(dst[-1]) == 1.0
        dst[0] = dst[-1] = 0
        return el

    @am.endpoint
    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


class Watchdog:
    """Per-phase deadline: on expiry, record the hang, dump every stack, save, exit(3)."""

    def __init__(self, R: C.Results) -> None:
        self.R = R

    def _expire(self, name: str, seconds: float) -> None:
        self.R.error(name, f"hung: no result after {seconds:.0f} s (stacks in the log)")
        faulthandler.dump_traceback(all_threads=True)
        self.R.save()
        os._exit(3)

    @contextlib.contextmanager
    def phase(self, name: str, seconds: float = PHASE_TIMEOUT_S) -> Iterator[None]:
        timer = threading.Timer(seconds, self._expire, args=(name, seconds))
        timer.daemon = True
        timer.start()
        try:
            yield
        except NotImplementedError as e:
            self.R.error(name, f"not measured: {e}")
        except Exception as e:
            traceback.print_exc()
            self.R.error(name, e)
        finally:
            timer.cancel()


def resolve(x: Any) -> Any:
    """Value of ``x``, waiting on it if it is a Future (for APIs whose return type may vary)."""
    return x.get() if hasattr(x, "get") and callable(x.get) else x


def bench_spawn(R: C.Results, host: Any, n: int, mesh: dict[str, Any]) -> None:
    """Spawn n procs + one Worker each, until the first call returns; fills ``mesh``."""
    t0 = time.perf_counter()
    procs = mesh["procs"] = host.spawn_procs(per_host={"gpus": n})
    t1 = time.perf_counter()
    actors = mesh["actors"] = procs.spawn(f"w{n}", Worker)
    t2 = time.perf_counter()
    pids = actors.ready.call().get()
    t3 = time.perf_counter()
    values = list(pids.values())
    R.add(
        f"spawn_{n}",
        {
            "seconds": t3 - t0,
            "n": len(set(values)),
            "spawn_procs_s": t1 - t0,
            "spawn_s": t2 - t1,
            "first_call_s": t3 - t2,
        },
    )
    if len(set(values)) != n:
        R.error(f"spawn_{n}", f"expected {n} distinct worker pids, got {values!r}")


def bench_ff(R: C.Results, one: Any) -> None:
    for _ in range(C.FF_WARMUP):
        one.incr.broadcast()
    one.count.call_one().get()
    for rep in range(C.FF_REPEATS):
        one.reset.call_one().get()
        t0 = time.perf_counter_ns()
        for _ in range(C.FF_MSGS):
            one.incr.broadcast()
        t_send = time.perf_counter_ns() - t0
        while (got := one.count.call_one().get()) < C.FF_MSGS:
            pass
        t_all = time.perf_counter_ns() - t0
        R.add(
            f"ff_rep{rep}",
            {
                "msgs_per_s": C.FF_MSGS / (t_all / 1e9),
                "send_msgs_per_s": C.FF_MSGS / (t_send / 1e9),
                "seconds": t_all / 1e9,
            },
        )
        if got != C.FF_MSGS:
            R.error(f"ff_rep{rep}", f"count returned {got}, expected {C.FF_MSGS}")


def bench_payload(R: C.Results, one: Any, name: str, size: tuple[int, int, int]) -> None:
    nb, w, it = size
    x = torch.ones(nb // 4, dtype=torch.float32)
    with watchdog.phase(f"send_{name}"):
        R.add(f"send_{name}", C.time_loop(lambda i: one.nbytes.call_one(x).get(), w, it, nb))

    def fetch(i: int) -> None:
        t = one.produce.call_one().get()
        assert t.numel() * 4 == nb

    with watchdog.phase(f"fetch_{name}"):
        one.make.call_one(nb).get()
        R.add(f"fetch_{name}", C.time_loop(fetch, w, it, nb))


def bench_a2a(R: C.Results, a: Any, b: Any, name: str, size: tuple[int, int, int]) -> None:
    nb, w, it = size
    with watchdog.phase(f"a2a_msg_{name}"):
        a.make.call_one(nb).get()
        inner: list[int] = []
        st = C.time_loop(lambda i: inner.append(b.pull.call_one(a, nb).get()), w, it, nb)
        st["inner"] = C.stats_ns(inner[w:], nb)
        R.add(f"a2a_msg_{name}", st)
    with watchdog.phase(f"a2a_buffer_{name}"):
        if not hasattr(am, "TensorBuffer"):
            raise NotImplementedError("actormesh has no TensorBuffer yet")
        buf = a.make_buffer.call_one(nb).get()
        inner_b: list[int] = []
        st = C.time_loop(lambda i: inner_b.append(b.read_buffer.call_one(buf, nb).get()), w, it, nb)
        st["inner"] = C.stats_ns(inner_b[w:], nb)
        R.add(f"a2a_buffer_{name}", st)
    with watchdog.phase(f"a2a_free_{name}"):
        a.make.call_one(8).get()  # free the big tensor


def bench_stacks(R: C.Results, procs: Any, n: int) -> None:
    if not hasattr(procs, "stacks"):
        raise NotImplementedError("ProcMesh has no stacks() yet")
    w, it = (1, 2) if C.QUICK else (1, 5)
    R.add(f"stacks_{n}", C.time_loop(lambda i: resolve(procs.stacks()), w, it))
    # The figure: every rank busy in a long endpoint while its stack is taken.
    busy = actors_of[id(procs)].sleep.call(5.0)
    time.sleep(0.3)  # let the calls reach the actors (benchmark pacing, not a test)
    R.add(f"stacks_busy_{n}", C.time_loop(lambda i: resolve(procs.stacks()), w, it))
    procs.interrupt()
    try:
        busy.get(timeout=30.0)
    except Exception:
        pass  # interrupted, as intended


actors_of: dict[int, Any] = {}


def bench_fault(R: C.Results, actors: Any, n: int, procs: Any = None) -> None:
    """SIGKILL a worker while a call to it is pending; time until the caller gets its error."""
    victim = actors.slice(gpus=n - 1)
    pid = victim.ready.call_one().get()
    fut = victim.sleep.call_one(30.0)
    time.sleep(0.5)  # let the call reach the actor
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    try:
        fut.get(timeout=30.0)
    except Exception as e:
        dt = time.perf_counter() - t0
        R.add("fault_detect_s", {"seconds": dt, "error": f"{type(e).__name__}: {e}"[:500]})
        R.note(f"SIGKILL test: the pending call raised {type(e).__name__}: {e}"[:500])
    else:
        R.error("fault_detect_s", "the pending call returned a value after its worker was killed")
        return
    t1 = time.perf_counter()
    try:
        victim.ping.call_one(1).get(timeout=30.0)
    except Exception as e:
        R.add(
            "fault_next_call_s",
            {"seconds": time.perf_counter() - t1, "error": f"{type(e).__name__}: {e}"[:500]},
        )
    else:
        R.error("fault_next_call_s", "a call to the killed actor returned a value")
        return
    if procs is not None and hasattr(procs, "heal"):
        t2 = time.perf_counter()
        procs.heal().get(timeout=60.0)
        victim.ping.call_one(1).get(timeout=30.0)
        R.add("heal_one_s", {"seconds": time.perf_counter() - t2})


def bench_mesh(R: C.Results, host: Any, n: int) -> None:
    mesh: dict[str, Any] = {}
    with watchdog.phase(f"spawn_{n}"):
        bench_spawn(R, host, n, mesh)
    if f"spawn_{n}" in R.data["metrics"]:
        bench_actors(R, mesh["procs"], mesh["actors"], n)
    if "procs" in mesh:
        with watchdog.phase(f"stop_{n}"):
            try:
                mesh["procs"].stop().get()
            except Exception as e:
                if "fault_detect_s" not in R.data["metrics"]:
                    raise
                R.note(f"stop_{n} after the SIGKILL test raised {type(e).__name__}: {e}"[:500])


def bench_actors(R: C.Results, procs: Any, actors: Any, n: int) -> None:
    with watchdog.phase(f"call_all_{n}"):
        R.add(
            f"call_all_{n}",
            C.time_loop(lambda i: actors.ping.call(i).get(), C.ALL_WARMUP, C.ALL_ITERS),
        )
    if n == 2:
        a = actors.slice(gpus=0)
        b = actors.slice(gpus=1)
        with watchdog.phase("call_one"):
            R.add(
                "call_one",
                C.time_loop(lambda i: a.ping.call_one(i).get(), C.RTT_WARMUP, C.RTT_ITERS),
            )
        with watchdog.phase("ff"):
            bench_ff(R, a)
        for name, size in C.PAYLOADS.items():
            bench_payload(R, a, name, size)
        for name, size in C.A2A_PAYLOADS.items():
            bench_a2a(R, a, b, name, size)
    if n == max(C.MESH_SIZES):
        actors_of[id(procs)] = actors
        with watchdog.phase(f"stacks_{n}"):
            bench_stacks(R, procs, n)
        with watchdog.phase("fault_detect_s", 90):  # last: it kills one worker of this mesh
            bench_fault(R, actors, n, procs)


def cold_spawn_main(n: int) -> None:
    """``--cold-spawn N``: this process is a fresh controller; print its spawn timings as JSON."""
    t0 = time.perf_counter()
    host = am.this_host()
    t1 = time.perf_counter()
    procs = host.spawn_procs(per_host={"gpus": n})
    actors = procs.spawn(f"cold{n}", Worker)
    pids = actors.ready.call().get()
    t2 = time.perf_counter()
    procs.stop().get()
    n_pids = len(set(pids.values()))
    print(json.dumps({"seconds": t2 - t0, "init_s": t1 - t0, "spawn_s": t2 - t1, "n": n_pids}))


def bench_cold_spawn(R: C.Results, n: int) -> None:
    """Run ``cold_spawn_main`` in a child process (imports are done before its clock starts)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--cold-spawn", str(n)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=PHASE_TIMEOUT_S)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-1500:]}")
    lines = [x for x in p.stdout.splitlines() if x.startswith('{"seconds"')]
    R.add(f"spawn_cold_{n}", json.loads(lines[-1]))


def versions() -> dict[str, str]:
    def v(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    return {
        "actormesh": v("actormesh"),
        "actormesh_path": os.path.dirname(am.__file__ or ""),
        "pyzmq": v("pyzmq"),
        "cloudpickle": v("cloudpickle"),
        "torch": torch.__version__,
    }


# One run per process: the results and the watchdog are module-level so every phase can use them.
R = C.Results("actormesh")
watchdog = Watchdog(R)


def main() -> None:
    R.data["versions"] = versions()
    n_cold = max(C.MESH_SIZES)
    with watchdog.phase(f"spawn_cold_{n_cold}"):
        bench_cold_spawn(R, n_cold)
    with watchdog.phase("init_s"):
        t0 = time.perf_counter()
        host = am.this_host()
        R.add("init_s", {"seconds": time.perf_counter() - t0})
    if "init_s" in R.data["metrics"]:
        for n in C.MESH_SIZES:
            bench_mesh(R, host, n)
    R.save()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--cold-spawn":
        cold_spawn_main(int(sys.argv[2]))
    else:
        main()
