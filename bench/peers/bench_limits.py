"""The floor: lower bounds on this machine for what an actor runtime does.

Raw pyzmq (ROUTER in the controller, DEALER in worker processes that import torch), bare
``subprocess.Popen`` spawn, ``multiprocessing.Pipe``, memcpy and shared-memory handoff.
Adapted from shared/peers/bench_limits.py (same metric names and parameters) with the floors
the DESIGN.md §7 targets need:

- ``zmq_tcp_rtt_pickle``     pickled (method, args) call round trip      (call_one target)
- ``zmq_tcp_call_all_8``     pickled call fanned out to 8 workers + gather (call target)
- ``zmq_tcp_ff_rep*``        fire-and-forget rate until confirmed         (broadcast target)
- ``zmq_tcp_send_64MB``      64 MB controller -> worker, zero-copy + ack   (ctrl->actor target)
- ``memcpy_np_256MB``        256 MB memcpy into an existing buffer         (actor->actor target)
- ``zmq_spawn_8`` / ``popen_spawn_8``  8 workers importing torch          (spawn context)

Run:  BENCH_OUT=out.json bench/.venvs/limits/bin/python bench/peers/bench_limits.py
Worker processes are this same file started with ``--worker``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
import common as C
import numpy as np
import zmq

HERE = os.path.abspath(__file__)


# ------------------------------------------------------------------------------------------
# worker process: DEALER connected to the controller's ROUTER
# ------------------------------------------------------------------------------------------
def worker_main(endpoint: str, ident: str) -> None:
    import torch  # same "torch importable" condition as the actor systems

    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, ident.encode())
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    s.send_multipart([b"ready", str(os.getpid()).encode()])
    count = 0
    held = None
    held_tensor = torch.ones(0)
    while True:
        fr = s.recv_multipart(copy=False)
        k = fr[0].bytes
        if k == b"p":  # raw small echo
            s.send_multipart([b"p", fr[1]], copy=False)
        elif k == b"k":  # pickled call -> pickled result
            _meth, args = pickle.loads(fr[1].buffer)
            s.send_multipart([b"k", pickle.dumps(args[0], protocol=5)])
        elif k == b"f":  # fire and forget
            count += 1
        elif k == b"q":
            s.send_multipart([b"q", struct.pack("<q", count)])
        elif k == b"r":
            count = 0
            s.send_multipart([b"r", b""])
        elif k == b"d":  # payload in, small ack out
            buf = fr[1].buffer  # zero-copy view of the received message
            s.send_multipart([b"a", struct.pack("<q", len(buf))])
        elif k == b"m":  # make a payload to be fetched
            n = struct.unpack("<q", fr[1].bytes)[0]
            held = np.ones(n // 4, dtype=np.float32)
            s.send_multipart([b"m", b""])
        elif k == b"g":  # fetch: send held payload zero-copy
            s.send_multipart([b"g", held], copy=False)
        # The same payloads as torch tensors at both ends, as an actor's endpoint takes and
        # returns them (bench_message_path.py): the receiver holds a usable tensor.
        elif k == b"D":  # a tensor in, small ack out
            got = torch.frombuffer(fr[1], dtype=torch.float32)
            s.send_multipart([b"a", struct.pack("<q", got.nbytes)])
            del got
        elif k == b"M":  # make a tensor to be fetched
            n = struct.unpack("<q", fr[1].bytes)[0]
            held_tensor = torch.ones(n // 4)
            s.send_multipart([b"m", b""])
        elif k == b"G":  # fetch: send the held tensor's memory zero-copy
            s.send_multipart([b"g", held_tensor.numpy()], copy=False)
        elif k == b"x":
            break
    s.close()
    ctx.term()


class ZPool:
    """Controller side: ROUTER bound on an endpoint, N worker processes."""

    def __init__(self, transport: str, n: int) -> None:
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if transport == "tcp":
            port = self.sock.bind_to_random_port("tcp://127.0.0.1")
            self.ep = f"tcp://127.0.0.1:{port}"
        else:
            path = f"/tmp/bench-zmq-{os.getpid()}-{n}-{time.monotonic_ns()}.ipc"
            self.ep = f"ipc://{path}"
            self.sock.bind(self.ep)
        t0 = time.perf_counter()
        self.procs = [
            subprocess.Popen([sys.executable, HERE, "--worker", self.ep, f"w{i}"]) for i in range(n)
        ]
        self.ids: list[bytes] = []
        for _ in range(n):
            ident, kind, _pid = self.sock.recv_multipart()
            assert kind == b"ready"
            self.ids.append(ident)
        self.ids.sort()
        self.spawn_s = time.perf_counter() - t0

    def req(self, ident: bytes, kind: bytes, body: Any = b"", copy: bool = True) -> list[Any]:
        self.sock.send_multipart([ident, kind, body], copy=copy)
        return self.sock.recv_multipart(copy=False)

    def close(self) -> None:
        for ident in self.ids:
            self.sock.send_multipart([ident, b"x", b""])
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.sock.close()
        if self.ep.startswith("ipc://"):
            with contextlib.suppress(OSError):
                os.unlink(self.ep[len("ipc://") :])


def call_pickled(pool: ZPool, ident: bytes, i: int) -> None:
    """The ``call_one`` floor: a pickled (method, args) call to one worker and its reply."""
    fr = pool.req(ident, b"k", pickle.dumps(("ping", (i,)), protocol=5))
    assert pickle.loads(fr[2].buffer) == i


def call_all(pool: ZPool, i: int) -> None:
    """The ``call`` floor: one pickled call sent to every worker, then every reply gathered."""
    body = pickle.dumps(("ping", (i,)), protocol=5)
    for ident in pool.ids:
        pool.sock.send_multipart([ident, b"k", body])
    out = [pickle.loads(pool.sock.recv_multipart(copy=False)[2].buffer) for _ in pool.ids]
    assert len(out) == len(pool.ids)


def _zmq_payload(R: C.Results, pool: ZPool, pre: str, name: str, size: tuple[int, int, int]):
    """Controller -> worker (zero-copy send, 8-byte ack), and fetch back."""
    nb, w, it = size
    a = pool.ids[0]
    x = np.ones(nb // 4, dtype=np.float32)

    def send(i: int) -> None:
        fr = pool.req(a, b"d", x, copy=False)
        assert struct.unpack("<q", fr[2].bytes)[0] == nb

    R.add(f"{pre}_send_{name}", C.time_loop(send, w, it, nb))
    pool.req(a, b"m", struct.pack("<q", nb))

    def fetch(i: int) -> None:
        fr = pool.req(a, b"g")
        arr = np.frombuffer(fr[2].buffer, dtype=np.float32)
        assert arr.nbytes == nb

    R.add(f"{pre}_fetch_{name}", C.time_loop(fetch, w, it, nb))
    pool.req(a, b"m", struct.pack("<q", 8))


def zmq_suite(R: C.Results, transport: str) -> None:
    pre = f"zmq_{transport}"
    pool = ZPool(transport, 2)
    a = pool.ids[0]
    try:
        sock = pool.sock
        small = struct.pack("<q", 7)
        R.add(
            f"{pre}_rtt_raw",
            C.time_loop(lambda i: pool.req(a, b"p", small), C.RTT_WARMUP, C.RTT_ITERS),
        )

        R.add(
            f"{pre}_rtt_pickle",
            C.time_loop(lambda i: call_pickled(pool, a, i), C.RTT_WARMUP, C.RTT_ITERS),
        )

        # fire-and-forget: pickled one-way calls, the clock stops when the counter confirms
        for i in range(C.FF_WARMUP):
            sock.send_multipart([a, b"f", pickle.dumps(("recv", (i,)), protocol=5)])
        pool.req(a, b"q")
        for rep in range(C.FF_REPEATS):
            pool.req(a, b"r")
            t0 = time.perf_counter_ns()
            for i in range(C.FF_MSGS):
                sock.send_multipart([a, b"f", pickle.dumps(("recv", (i,)), protocol=5)])
            t_send = time.perf_counter_ns() - t0
            while struct.unpack("<q", pool.req(a, b"q")[2].bytes)[0] < C.FF_MSGS:
                pass
            t_all = time.perf_counter_ns() - t0
            R.add(
                f"{pre}_ff_rep{rep}",
                {
                    "msgs_per_s": C.FF_MSGS / (t_all / 1e9),
                    "send_msgs_per_s": C.FF_MSGS / (t_send / 1e9),
                    "seconds": t_all / 1e9,
                },
            )
        sizes = dict(C.PAYLOADS)
        for k, v in C.A2A_PAYLOADS.items():
            sizes.setdefault(k, v)
        for name, size in sizes.items():
            _zmq_payload(R, pool, pre, name, size)
    finally:
        pool.close()


def _zmq_mesh(R: C.Results, n: int) -> None:
    pool = ZPool("tcp", n)
    try:
        R.add(f"zmq_spawn_{n}", {"seconds": pool.spawn_s, "n": n})
        R.add(
            f"zmq_tcp_call_all_{n}",
            C.time_loop(lambda i: call_all(pool, i), C.ALL_WARMUP, C.ALL_ITERS),
        )
    finally:
        pool.close()


def zmq_spawn_and_all(R: C.Results) -> None:
    for n in C.MESH_SIZES:
        _zmq_mesh(R, n)


def popen_spawn(R: C.Results, n: int = 8) -> None:
    """Bare floor for spawn: N ``python -c 'import torch'`` started at once, until all exit."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", "import torch"]) for _ in range(n)]
    rcs = [p.wait() for p in procs]
    R.add(f"popen_spawn_{n}", {"seconds": time.perf_counter() - t0, "n": n, "rcs": rcs})


# ------------------------------------------------------------------------------------------
# multiprocessing.Pipe, shared memory
# ------------------------------------------------------------------------------------------
def pipe_child(conn: Connection) -> None:
    while True:
        m = conn.recv_bytes()
        if m == b"x":
            break
        if len(m) > 64:
            conn.send_bytes(struct.pack("<q", len(m)))
        else:
            conn.send_bytes(m)


def pipe_obj_child(conn: Connection) -> None:
    while True:
        m = conn.recv()
        if m is None:
            break
        conn.send(m)


def shm_child(conn: Connection) -> None:
    from multiprocessing import shared_memory

    while True:
        msg = conn.recv()
        if msg is None:
            break
        name, nb = msg
        shm = shared_memory.SharedMemory(name=name)
        arr = np.ndarray((nb // 4,), dtype=np.float32, buffer=shm.buf)
        v = float(arr[-1])
        del arr
        shm.close()
        conn.send(v)


def torch_shm_child(q_in: Any, q_out: Any) -> None:
    while True:
        t = q_in.get()
        if t is None:
            break
        q_out.put(float(t[-1]))
        del t


def _pipe_payload(R: C.Results, conn: Connection, name: str, size: tuple[int, int, int]) -> None:
    nb, w, it = size
    x = np.ones(nb // 4, dtype=np.float32)
    R.add(
        f"pipe_send_{name}",
        C.time_loop(lambda i: (conn.send_bytes(x), conn.recv_bytes()), w, it, nb),
    )


def _shm_handoff(R: C.Results, conn: Connection, name: str, size: tuple[int, int, int]) -> None:
    from multiprocessing import shared_memory

    nb, w, it = size
    src = np.ones(nb // 4, dtype=np.float32)
    writes, hand, tot = [], [], []
    for _ in range(w + it):
        t0 = time.perf_counter_ns()
        shm = shared_memory.SharedMemory(create=True, size=nb)
        dst = np.ndarray((nb // 4,), dtype=np.float32, buffer=shm.buf)
        np.copyto(dst, src)  # fresh shm pages: includes page faults
        t1 = time.perf_counter_ns()
        conn.send((shm.name, nb))
        assert conn.recv() == 1.0
        t2 = time.perf_counter_ns()
        writes.append(t1 - t0)
        hand.append(t2 - t1)
        tot.append(t2 - t0)
        del dst
        shm.close()
        shm.unlink()
    st = C.stats_ns(tot[w:], nb)
    st["write_fresh_shm"] = C.stats_ns(writes[w:], nb)
    st["handoff_only"] = C.stats_ns(hand[w:])
    R.add(f"shm_mp_{name}", st)


def _torch_shm_handoff(
    R: C.Results, q_in: Any, q_out: Any, name: str, size: tuple[int, int, int]
) -> None:
    import torch

    nb, w, it = size
    shares, hand, tot = [], [], []
    for _ in range(w + it):
        t = torch.ones(nb // 4, dtype=torch.float32)
        t0 = time.perf_counter_ns()
        t.share_memory_()  # copies into a new shm segment
        t1 = time.perf_counter_ns()
        q_in.put(t)
        assert q_out.get() == 1.0
        t2 = time.perf_counter_ns()
        shares.append(t1 - t0)
        hand.append(t2 - t1)
        tot.append(t2 - t0)
        del t
    st = C.stats_ns(tot[w:], nb)
    st["share_memory_"] = C.stats_ns(shares[w:], nb)
    st["handoff_only"] = C.stats_ns(hand[w:])
    R.add(f"shm_torch_{name}", st)


def mp_suite(R: C.Results) -> None:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    # Pipe RTT (raw bytes and pickled objects)
    p_conn, c_conn = ctx.Pipe()
    p = ctx.Process(target=pipe_child, args=(c_conn,))
    p.start()
    small = b"12345678"
    R.add(
        "pipe_rtt_bytes",
        C.time_loop(
            lambda i: (p_conn.send_bytes(small), p_conn.recv_bytes()), C.RTT_WARMUP, C.RTT_ITERS
        ),
    )
    for name, size in C.PAYLOADS.items():
        _pipe_payload(R, p_conn, name, size)
    p_conn.send_bytes(b"x")
    p.join()
    p_conn, c_conn = ctx.Pipe()
    p = ctx.Process(target=pipe_obj_child, args=(c_conn,))
    p.start()
    R.add(
        "pipe_rtt_obj",
        C.time_loop(
            lambda i: (p_conn.send(("ping", (i,))), p_conn.recv()), C.RTT_WARMUP, C.RTT_ITERS
        ),
    )
    p_conn.send(None)
    p.join()

    # multiprocessing.shared_memory handoff
    p_conn, c_conn = ctx.Pipe()
    p = ctx.Process(target=shm_child, args=(c_conn,))
    p.start()
    for name, size in C.A2A_PAYLOADS.items():
        _shm_handoff(R, p_conn, name, size)
    p_conn.send(None)
    p.join()

    # torch share_memory_ + torch.multiprocessing queue (fd passing)
    import torch
    import torch.multiprocessing as tmp

    tctx = tmp.get_context("spawn")
    q_in, q_out = tctx.Queue(), tctx.Queue()
    tp = tctx.Process(target=torch_shm_child, args=(q_in, q_out))
    tp.start()
    q_in.put(torch.ones(4).share_memory_())
    q_out.get()
    for name, size in C.A2A_PAYLOADS.items():
        _torch_shm_handoff(R, q_in, q_out, name, size)
    q_in.put(None)
    tp.join()


def memcpy_suite(R: C.Results) -> None:
    import torch

    nb = 256 << 20
    src = np.ones(nb // 4, dtype=np.float32)
    dst = np.empty_like(src)
    dst.fill(0)
    R.add("memcpy_np_256MB", C.time_loop(lambda i: np.copyto(dst, src), 1, 5, nb))
    R.add("memcpy_np_fresh_256MB", C.time_loop(lambda i: src.copy(), 1, 5, nb))
    ts = torch.ones(nb // 4, dtype=torch.float32)
    td = torch.zeros(nb // 4, dtype=torch.float32)
    R.add("memcpy_torch_256MB", C.time_loop(lambda i: td.copy_(ts), 1, 5, nb))
    R.add("memcpy_torch_fresh_256MB", C.time_loop(lambda i: ts.clone(), 1, 5, nb))
    R.data["versions"] = {
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    R = C.Results("limits")
    suites: list[tuple[str, Callable[[C.Results], None]]] = [
        ("memcpy", memcpy_suite),
        ("zmq_tcp", lambda R: zmq_suite(R, "tcp")),
        ("zmq_ipc", lambda R: zmq_suite(R, "ipc")),
        ("zmq_spawn_all", zmq_spawn_and_all),
        ("popen_spawn", popen_spawn),
        ("mp", mp_suite),
    ]
    for name, fn in suites:
        try:
            fn(R)
        except Exception as e:
            traceback.print_exc()
            R.error(name, e)
    R.save()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2], sys.argv[3])
    else:
        main()
