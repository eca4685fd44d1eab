"""Where the time of one message goes: ``call_one``, ``call`` to 8 and 1 MB / 64 MB payloads
beside raw pyzmq between the very same processes, with a per-thread and per-step breakdown.

Four parts, all in one controller process and one mesh of 8 workers:

1. **Interleaved end to end.** Each worker also runs the floor's raw pyzmq worker
   (``peers/bench_limits.py``'s ``worker_main``: a DEALER that echoes pickled calls, takes
   zero-copy frames and sends them back) on a thread of its own, connected to a ROUTER of this
   process. Its payloads are torch tensors at both ends, as an endpoint's are: the sender sends
   a tensor's memory (its numpy view) zero-copy, and the receiver makes a tensor of the frame
   (``torch.frombuffer``, one call; before 2026-11-27 it sent a numpy array and the receiver
   held a numpy array or a bare frame). So the floor and actormesh run between the same two
   processes, and the two sides alternate in short blocks (the first side of a pair alternates
   too). Reported:
   the median of all samples per side, the ratio, and the **added time** in µs (the median of
   the per-block-pair differences), which holds across the VM's fast and slow regimes.
   The floor's transport is tcp://127.0.0.1 (as in ``bench_limits.py``) and, for payloads,
   also ipc:// (what actormesh uses on one host).
2. **CPU per call and thread** (from ``/proc/<pid>/task/<tid>/schedstat``, ns): the
   controller's and worker 0's threads during the blocks of each side (for the call to 8, the
   controller's and all eight workers', added up by kind);
   the *added CPU* is actormesh's total minus the floor's, far less noisy than wall time. Added wall
   time minus added CPU is time spent waiting for a thread to be woken and scheduled.
3. **Steps.** The runtime's own functions timed alone on realistic inputs (a loop of each,
   median of repeats): signing, verifying, envelopes, pickling, futures, the context, the
   output flush. These do not add up to the whole: what is left is ZeroMQ, the wake-ups and
   the glue between the steps.
4. **Profile** (``--profile``, instrumented, so only for attribution): the functions with the
   most own time per call, on the controller's main thread and on the actor's thread.

Parts 1 and 2 time the un-instrumented path.

Run:  python bench/bench_message_path.py [--profile]   (BENCH_QUICK=1: fewer samples)
Prints one JSON object (``BENCH_OUT=path`` also writes it) and a Markdown summary on stderr.
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import pickle
import pstats
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import bench_limits as floor
import common as C
import zmq

import actormesh as am
from actormesh import config as am_config

N = 8
QUICK = C.QUICK
# (blocks, calls per block)
SHAPES = {
    "call_one": (10, 40) if QUICK else (60, 100),
    "call_all_8": (6, 20) if QUICK else (30, 40),
    "send_1MB": (4, 10) if QUICK else (30, 20),
    "fetch_1MB": (4, 10) if QUICK else (30, 20),
    "fetch_64MB": (2, 2) if QUICK else (10, 3),
}
MB = 1 << 20
TIMEOUT = 60.0
# BENCH_ONLY=call_one,call_all_8: only these measurements (the A/B runs of ab_commits.py)
ONLY = set(filter(None, os.environ.get("BENCH_ONLY", "").split(",")))


def wanted(name: str) -> bool:
    return not ONLY or name in ONLY


class Pinger(am.Actor):
    def __init__(self) -> None:
        import torch

        self.held = torch.ones(MB // 4)
        self.prof: cProfile.Profile | None = None

    @am.endpoint
    def ping(self, i: int) -> int:
        return i

    @am.endpoint
    def sink(self, t: Any) -> int:
        return int(t.nbytes)

    @am.endpoint
    def hold(self, nbytes: int) -> None:
        import torch

        self.held = torch.ones(nbytes // 4)

    @am.endpoint
    def fetch(self) -> Any:
        return self.held

    @am.endpoint
    def start_raw(self, endpoints: list[str], ident: str) -> None:
        """The floor's worker loop, on threads of this process (one per floor transport)."""
        for i, ep in enumerate(endpoints):
            args = (ep, f"{ident}{os.getpid()}-{i}")  # ROUTER identities must differ
            raw = threading.Thread(target=floor.worker_main, args=args, name=f"raw{i}")
            raw.daemon = True
            raw.start()

    @am.endpoint
    def threads(self) -> dict[str, Any]:
        tids = {t.name: t.native_id for t in threading.enumerate()}
        return {"pid": os.getpid(), "tids": tids, "actormesh": am.__file__}

    @am.endpoint
    def profile(self, on: bool) -> tuple[list[tuple[str, float, int]], tuple[int, int]]:
        """Start profiling this actor's thread, or stop and give the top functions."""
        if on:
            self.prof = cProfile.Profile()
            self.prof.enable()  # stays on for this thread's next messages
            return [], (0, 0)
        assert self.prof is not None
        self.prof.disable()
        return top_functions(self.prof), calls_made(self.prof)


def top_functions(prof: cProfile.Profile, n: int = 25) -> list[tuple[str, float, int]]:
    """(function, own time in s, calls) with the most own time."""
    st = pstats.Stats(prof)
    rows = []
    for (file, line, fn), (_cc, nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        where = f"{os.path.basename(file)}:{line}({fn})" if line else fn
        rows.append((where, tt, nc))
    rows.sort(key=lambda r: -r[1])
    return rows[:n]


def calls_made(prof: cProfile.Profile) -> tuple[int, int]:
    """(Python functions, builtins and C methods) called while profiling: the glue a message
    costs is mostly the number of Python calls it makes."""
    python = builtin = 0
    for (file, _line, _fn), (_cc, nc, _tt, _ct, _callers) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        if file == "~":
            builtin += nc
        else:
            python += nc
    return python, builtin


# -- the floor between the same processes --------------------------------------------------


class RawPool:
    """The floor's ROUTER; its DEALERs are threads of the actormesh workers."""

    def __init__(self, transport: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if transport == "tcp":
            self.ep = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        else:
            self.ep = f"ipc:///tmp/am-msgpath-{os.getpid()}-{transport}"
            self.sock.bind(self.ep)
        self.ids: list[bytes] = []
        self.pids: dict[int, bytes] = {}  # worker pid -> its DEALER's identity

    def close(self) -> None:
        """Stop the workers' DEALER threads, close the socket, remove an ipc socket's file."""
        for ident in self.ids:
            self.sock.send_multipart([ident, b"x", b""])
        self.sock.close(linger=100)
        if self.ep.startswith("ipc://"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.ep.removeprefix("ipc://"))

    def wait_ready(self, n: int) -> None:
        for _ in range(n):
            ident, kind, pid = self.sock.recv_multipart()
            assert kind == b"ready"
            self.ids.append(ident)
            self.pids[int(pid)] = ident
        self.ids.sort()

    def req(self, ident: bytes, kind: bytes, body: Any = b"", copy: bool = True) -> list[Any]:
        self.sock.send_multipart([ident, kind, body], copy=copy)
        return self.sock.recv_multipart(copy=False)  # type: ignore[no-any-return]


# -- interleaving ----------------------------------------------------------------------------


def interleave(
    sides: dict[str, Callable[[int], object]],
    shape: tuple[int, int],
    nbytes: int = 0,
    on_block: Callable[[str, Callable[[], list[int]]], list[int]] | None = None,
) -> dict[str, Any]:
    """Time each side in ``shape`` = (blocks, calls per block), rotating which goes first.
    The first side is actormesh; every other one is a floor it is compared with."""
    blocks, per_block = shape
    names = list(sides)
    for name in names:
        C.timed(sides[name], 0, max(5, per_block // 2))  # warm-up
    samples: dict[str, list[int]] = {k: [] for k in names}
    block_medians: dict[str, list[float]] = {k: [] for k in names}
    for b in range(blocks):
        order = names[b % len(names) :] + names[: b % len(names)]
        for name in order:

            def run(name: str = name, start: int = b * per_block) -> list[int]:
                return C.timed(sides[name], start, per_block)

            got = on_block(name, run) if on_block else run()
            samples[name] += got
            block_medians[name].append(statistics.median(got))
    ours = names[0]
    out: dict[str, Any] = {"blocks": blocks, "per_block": per_block}
    for name in names:
        out[name] = C.stats_ns(samples[name], nbytes or None)
    for base in names[1:]:
        added = [a - f for a, f in zip(block_medians[ours], block_medians[base], strict=True)]
        out[f"added_us_over_{base}"] = statistics.median(added) / 1e3
        out[f"ratio_over_{base}"] = out[ours]["median_us"] / out[base]["median_us"]
        if nbytes:
            out[f"bandwidth_pct_of_{base}"] = 100 * out[base]["median_us"] / out[ours]["median_us"]
    return out


# -- CPU per thread -------------------------------------------------------------------------


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """Time on a CPU per thread of ``pid``, in ns (schedstat's first field)."""
    out = {}
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except OSError:
            continue
    return out


def thread_names(pid: int, known: dict[int, str]) -> dict[int, str]:
    names = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        t = int(tid)
        if t in known:
            names[t] = known[t]
            continue
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        names[t] = "zmq I/O" if comm.startswith("ZMQbg") else "other"
    return names


class CpuMeter:
    """Sums CPU per named thread of several processes over the blocks of each side."""

    def __init__(self, procs: list[tuple[str, int, dict[int, str]]]) -> None:
        # (label, pid, tid -> thread name); processes with one label add up (the workers)
        self.procs = procs
        self.cpu: dict[str, dict[str, int]] = {}
        self.calls: dict[str, int] = {}

    def on_block(self, side: str, run: Callable[[], list[int]]) -> list[int]:
        before = {pid: thread_cpu_ns(pid) for _, pid, _ in self.procs}
        got = run()
        after = {pid: thread_cpu_ns(pid) for _, pid, _ in self.procs}
        acc = self.cpu.setdefault(side, {})
        for label, pid, known in self.procs:
            names = thread_names(pid, known)
            for tid, t1 in after[pid].items():
                name = f"{label}: {names.get(tid, 'other')}"
                acc[name] = acc.get(name, 0) + t1 - before[pid].get(tid, t1)
        self.calls[side] = self.calls.get(side, 0) + len(got)
        return got

    def per_call_us(self) -> dict[str, dict[str, float]]:
        out = {}
        for side, acc in self.cpu.items():
            rows = {k: round(v / self.calls[side] / 1e3, 2) for k, v in sorted(acc.items())}
            rows["total"] = round(sum(acc.values()) / self.calls[side] / 1e3, 2)
            out[side] = rows
        return out


# -- steps -----------------------------------------------------------------------------------


def per_op_us(fn: Callable[[], object], loops: int = 2000, repeats: int = 7) -> float:
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        best.append((time.perf_counter_ns() - t0) / loops / 1e3)
    return round(statistics.median(best), 2)


def steps(one: Any) -> dict[str, float]:
    """The runtime's steps of a ``call_one`` timed alone, controller and worker side."""
    from actormesh.runtime.actors import actor_context as ctxmod
    from actormesh.runtime.meshes.collect import GatherOne
    from actormesh.runtime.meshes.endpoint import pickle_arguments
    from actormesh.runtime.messaging import codec, protocol
    from actormesh.runtime.messaging.logs import flush_output
    from actormesh.runtime.messaging.node import current_node, reply_port

    ep = one.ping
    node = current_node()
    key = codec.new_key()
    me, other = codec.new_id(), codec.new_id()
    signer, verifier = codec.Signer(key, other), codec.Verifier(key, me)
    shape = ep._shape
    state = protocol.shape_state(shape)
    reply = (tuple(node.address), 1, node.address.mailbox)
    envelope = (protocol.CALL, ep._key, ep._name, state, reply)
    payload, _ = pickle_arguments((7,), {}, "x")
    frames = signer.frames(me, envelope, payload)
    reply_env = (protocol.REPLY, 1, 0, protocol.OK, 5)
    result_payload, _ = codec.dumps(7)
    reply_frames = signer.frames(me, reply_env, result_payload)
    big_verifier = codec.Verifier(key, me)

    def verify(fr: list[Any] = frames) -> None:
        big_verifier._last_seq.clear()
        big_verifier.decode(fr)

    msg = verifier.decode(frames)
    reply_msg = codec.Verifier(key, me).decode(reply_frames)
    node._handled[reply_msg.sender] = 5  # its earlier message was handled: the common case
    instance = ctxmod.ActorInstance("x", shape.point(0), "k")
    proc_table = ep._procs
    transport = node.transport
    addr = proc_table.addresses[shape.ranks()[0]]
    out = {
        "ctrl: supervision check + stopped check": per_op_us(
            lambda: (
                am.runtime.faults.supervision.raise_pending(),
                proc_table.closed,
                proc_table.stopped_actors,
            )
        ),
        "ctrl: GatherOne + Future": per_op_us(
            lambda: GatherOne(ep._what, proc_table, shape, ep._full)
        ),
        "ctrl: pickle arguments": per_op_us(lambda: pickle_arguments((7,), {}, "x")),
        "ctrl: open + close port": per_op_us(
            lambda: node.close_port(node.open_port(None, addr))  # type: ignore[arg-type]
        ),
        "ctrl: envelope tuple + shape_state": per_op_us(
            lambda: (protocol.CALL, ep._key, ep._name, protocol.shape_state(shape), reply)
        ),
        "ctrl: payload digest": per_op_us(lambda: codec.payload_digest(payload)),
        "ctrl: route_to_actor": per_op_us(lambda: transport.route_to_actor(addr, ep._key)),
        "both: sign (envelope pickle + head + HMAC)": per_op_us(
            lambda: signer.frames(me, envelope, payload)
        ),
        "both: envelope pickle alone": per_op_us(lambda: pickle.dumps(envelope, protocol=5)),
        "both: verify (HMAC + checks + envelope unpickle)": per_op_us(verify),
        "both: envelope unpickle alone": per_op_us(
            lambda: pickle.loads(pickle.dumps(envelope, protocol=5))
        )
        - per_op_us(lambda: pickle.dumps(envelope, protocol=5)),
        "worker: shape_from_state + reply_port + local_index": per_op_us(
            lambda: (
                protocol.shape_from_state(state).local_index(0),
                reply_port(reply),
            )
        ),
        "worker: Context + set_current x2": per_op_us(
            lambda: (
                ctxmod.set_current(ctxmod.Context(instance, None, shape, 0)),
                ctxmod.set_current(None),
            )
        ),
        "worker: unpickle arguments": per_op_us(msg.value),
        "worker: output flush (nothing printed)": per_op_us(flush_output),
        "worker: pickle result": per_op_us(lambda: codec.dumps(7)),
        "ctrl: verify reply": per_op_us(lambda: verify(reply_frames)),
        "ctrl: in_order (reply after an earlier message)": per_op_us(
            lambda: node.in_order(reply_msg)
        ),
    }
    return out


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    out: dict[str, Any] = {"machine": C.machine_info(), "n": N, "shapes": SHAPES}
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    out["started"] = started
    out["load_average_start"] = round(os.getloadavg()[0], 2)
    pools = {"tcp": RawPool("tcp"), "ipc": RawPool("ipc")}
    procs = am.this_host().spawn_procs(per_host={"gpus": N})
    try:
        actors = procs.spawn("pinger", Pinger)
        actors.ping.call(0).get(timeout=120)
        actors.start_raw.call([pools["tcp"].ep, pools["ipc"].ep], "w").get(timeout=60)
        for pool in pools.values():
            pool.wait_ready(N)
        one = actors.slice(gpus=0)
        tcp, ipc = pools["tcp"], pools["ipc"]
        info = one.threads.call_one().get(timeout=TIMEOUT)
        raw_id = {name: pool.pids[info["pid"]] for name, pool in pools.items()}
        # Which actormesh each side ran (ab_commits.py checks that both are the commit asked for).
        out["actormesh_files"] = {"controller": am.__file__, "worker": info["actormesh"]}

        def call_one(i: int) -> None:
            assert one.ping.call_one(i).get(timeout=TIMEOUT) == i

        def raw_call(i: int) -> None:
            floor.call_pickled(tcp, raw_id["tcp"], i)

        # The floor again, its waiting thread spinning as actormesh's does for a call_one's
        # reply (ACTORMESH_WAIT_SPIN_US): what the spin gains a bare socket, for comparison.
        # (The same window for a commit from before the spin: ab_commits.py runs both alike.)
        spin_ns = int(getattr(am_config, "WAIT_SPIN_US", 300.0) * 1000)

        def raw_call_spinning(i: int) -> None:
            sock = tcp.sock
            sock.send_multipart([raw_id["tcp"], b"k", pickle.dumps(("ping", (i,)), protocol=5)])
            until = time.perf_counter_ns() + spin_ns
            while True:
                try:
                    fr = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    break
                except zmq.Again:
                    if time.perf_counter_ns() >= until:
                        fr = sock.recv_multipart(copy=False)
                        break
            assert pickle.loads(fr[2].buffer) == i

        ctrl_tids = {t.native_id: f"main/{t.name}" for t in threading.enumerate()}
        ctrl_tids[threading.main_thread().native_id] = "main thread"  # type: ignore[index]
        for t in threading.enumerate():
            if t.name.startswith("actormesh-io"):
                ctrl_tids[t.native_id] = "I/O thread"  # type: ignore[index]

        def worker_threads(info: dict[str, Any]) -> dict[int, str]:
            known = {}
            for name, tid in info["tids"].items():
                if name.startswith("actor-"):
                    known[tid] = "actor thread"
                elif name.startswith("actormesh-io"):
                    known[tid] = "I/O thread"
                elif name.startswith("raw"):
                    known[tid] = "raw pyzmq thread"
                else:
                    known[tid] = name
            return known

        controller = ("controller", os.getpid(), ctrl_tids)
        threads = [controller, ("worker 0", info["pid"], worker_threads(info))]
        # The call to 8: the eight workers' threads, added up by kind.
        every_worker = [controller] + [
            ("8 workers", w["pid"], worker_threads(w))
            for w in actors.threads.call().get(timeout=TIMEOUT).values()
        ]

        def metered(
            sides: dict[str, Callable[[int], object]],
            shape: tuple[int, int],
            nbytes: int = 0,
            procs: list[tuple[str, int, dict[int, str]]] = threads,
        ) -> dict[str, Any]:
            meter = CpuMeter(procs)
            result = interleave(sides, shape, nbytes, meter.on_block)
            cpu = result["cpu_us_per_call"] = meter.per_call_us()
            for base in list(sides)[1:]:
                added = cpu["actormesh"]["total"] - cpu[base]["total"]
                result[f"added_cpu_us_over_{base}"] = round(added, 1)
            return result

        if wanted("call_one"):
            sides = {"actormesh": call_one, "raw_tcp": raw_call}
            if spin_ns and len(os.sched_getaffinity(0)) >= 2:
                sides["raw_tcp_spinning"] = raw_call_spinning
            out["call_one"] = metered(sides, SHAPES["call_one"])
        if wanted("call_all_8"):
            out["call_all_8"] = metered(
                {
                    "actormesh": lambda i: actors.ping.call(i).get(timeout=TIMEOUT),
                    "raw_tcp": lambda i: floor.call_all(tcp, i),
                },
                SHAPES["call_all_8"],
                procs=every_worker,
            )
        import torch

        t1 = torch.ones(MB // 4)

        def send_am(i: int) -> None:
            assert one.sink.call_one(t1).get(timeout=TIMEOUT) == MB

        # The floor does what actormesh must: it sends a torch tensor's memory (its numpy
        # view, zero-copy) and the receiver makes a torch tensor of the frame (one call).
        def send_raw(pool: RawPool) -> Callable[[int], None]:
            ident = raw_id["tcp" if pool is tcp else "ipc"]

            def send(i: int) -> None:
                fr = pool.req(ident, b"D", t1.numpy(), copy=False)
                assert struct.unpack("<q", fr[2].bytes)[0] == MB

            return send

        if wanted("send_1MB"):
            out["send_1MB"] = metered(
                {"actormesh": send_am, "raw_tcp": send_raw(tcp), "raw_ipc": send_raw(ipc)},
                SHAPES["send_1MB"],
                MB,
            )

        def fetch_am(nbytes: int) -> Callable[[int], None]:
            def fetch(i: int) -> None:
                t = one.fetch.call_one().get(timeout=TIMEOUT)
                assert t.nbytes == nbytes

            return fetch

        def fetch_raw(pool: RawPool, nbytes: int) -> Callable[[int], None]:
            ident = raw_id["tcp" if pool is tcp else "ipc"]

            def fetch(i: int) -> None:
                fr = pool.req(ident, b"G")
                t = torch.frombuffer(fr[2], dtype=torch.float32)
                assert t.nbytes == nbytes

            return fetch

        for label, nbytes in (("fetch_1MB", MB), ("fetch_64MB", 64 * MB)):
            if not wanted(label):
                continue
            one.hold.call_one(nbytes).get(timeout=TIMEOUT)
            for name in ("tcp", "ipc"):
                pools[name].req(raw_id[name], b"M", struct.pack("<q", nbytes))
            out[label] = metered(
                {
                    "actormesh": fetch_am(nbytes),
                    "raw_tcp": fetch_raw(tcp, nbytes),
                    "raw_ipc": fetch_raw(ipc, nbytes),
                },
                SHAPES[label],
                nbytes,
            )
        if wanted("steps"):
            out["steps_us"] = steps(one)
        if "--profile" in sys.argv:
            out["profile"] = profile(one, call_one)
        out["load_average_end"] = round(os.getloadavg()[0], 2)
    finally:
        for pool in pools.values():
            pool.close()
        procs.stop().get(timeout=60)
    C.print_result(out)
    print(summary(out), file=sys.stderr)


def profile(one: Any, call_one: Callable[[int], None], n: int = 3000) -> dict[str, Any]:
    """Own time per call of the busiest functions (instrumented: for attribution only)."""
    one.profile.call_one(True).get(timeout=TIMEOUT)
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        call_one(i)
    prof.disable()
    worker, worker_calls = one.profile.call_one(False).get(timeout=TIMEOUT)

    def per_call(rows: list[tuple[str, float, int]]) -> list[tuple[str, float, float]]:
        return [(w, round(tt / n * 1e6, 2), round(nc / n, 2)) for w, tt, nc in rows]

    def calls(made: tuple[int, int]) -> dict[str, float]:
        python, builtin = made
        return {"python": round(python / n, 1), "builtin": round(builtin / n, 1)}

    return {
        "calls": n,
        "controller": per_call(top_functions(prof)),
        "worker": per_call(worker),
        # the worker's count includes the profile endpoint's own few calls: noise next to n
        "calls_per_round_trip": {
            "controller": calls(calls_made(prof)),
            "worker": calls(worker_calls),
        },
    }


def summary(out: dict[str, Any]) -> str:
    lines = ["", f"load average {out['load_average_start']} -> {out.get('load_average_end')}", ""]
    lines.append(
        "| measurement | actormesh | raw pyzmq tcp | raw ipc | added µs (tcp) | ratio | "
        "added CPU µs (tcp) |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for key in ("call_one", "call_all_8", "send_1MB", "fetch_1MB", "fetch_64MB"):
        r = out.get(key)
        if not r:
            continue

        def cell(side: str, r: dict[str, Any] = r) -> str:
            s = r.get(side)
            if not s:
                return "—"
            gb = f" ({s['median_GBps']:.2f} GB/s)" if "median_GBps" in s else ""
            return f"{s['median_us']:.1f} µs{gb}"

        lines.append(
            f"| {key} | {cell('actormesh')} | {cell('raw_tcp')} | {cell('raw_ipc')} | "
            f"{r['added_us_over_raw_tcp']:.1f} | {r['ratio_over_raw_tcp']:.2f} | "
            f"{r.get('added_cpu_us_over_raw_tcp', '—')} |"
        )
    spun = out.get("call_one", {}).get("raw_tcp_spinning")
    if spun:
        r = out["call_one"]
        lines.append(
            f"\ncall_one beside raw pyzmq tcp whose waiting thread spins as actormesh's does: "
            f"{spun['median_us']:.1f} µs, added {r['added_us_over_raw_tcp_spinning']:.1f} µs, "
            f"ratio {r['ratio_over_raw_tcp_spinning']:.2f}, added CPU "
            f"{r.get('added_cpu_us_over_raw_tcp_spinning', '—')} µs"
        )
    for key in ("call_one", "call_all_8"):
        cpu = out.get(key, {}).get("cpu_us_per_call", {})
        if not cpu:
            continue
        lines += ["", f"| thread ({key}) | " + " | ".join(cpu) + " |"]
        lines.append("|---|" + "---|" * len(cpu))
        names = sorted({k for v in cpu.values() for k in v})
        for name in names:
            lines.append(f"| {name} | " + " | ".join(str(cpu[s].get(name, 0)) for s in cpu) + " |")
    lines += ["", "| step | µs |", "|---|---|"]
    for k, v in out.get("steps_us", {}).items():
        lines.append(f"| {k} | {v:.2f} |")
    prof = out.get("profile")
    if prof:
        for side in ("controller", "worker"):
            lines += ["", f"| {side}: function (profiled) | own µs per call | calls per call |"]
            lines.append("|---|---|---|")
            for w, us, nc in prof[side][:18]:
                lines.append(f"| {w} | {us} | {nc} |")
        made = prof["calls_per_round_trip"]
        lines += ["", "| calls per round trip (profiled) | Python functions | builtins |"]
        lines.append("|---|---|---|")
        for side in ("controller", "worker"):
            lines.append(f"| {side} | {made[side]['python']} | {made[side]['builtin']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
