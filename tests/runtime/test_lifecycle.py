"""Controller scripts as users run them: __main__ actors, and no worker outliving the controller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
import zmq
from support import wait_until

import actormesh as am
from actormesh.runtime.messaging.codec import Signer, new_id
from actormesh.runtime.messaging.protocol import shape_state
from actormesh.runtime.procs.controller import get_controller

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import actormesh as am

    class Greeter(am.Actor):          # defined in __main__: pickled by value
        def __init__(self, greeting):
            self.greeting = greeting

        @am.endpoint
        def greet(self, name):
            print(f"{self.greeting}, {name} from {am.current_rank()['gpus']}")
            return os.getpid()

        @am.endpoint
        def nap(self):
            time.sleep(600)

    procs = am.this_host().spawn_procs(per_host={"gpus": 3})
    greeters = procs.spawn("greeter", Greeter, "hello")
    pids = greeters.greet.call("world").get(timeout=60).values()
    print("PIDS", " ".join(map(str, pids)), flush=True)
    mode = sys.argv[1]
    if mode == "exit":
        sys.exit(0)
    if mode == "raise":
        raise RuntimeError("controller failed")
    if mode == "call":   # blocked in get(), reading the reply inbox, when Ctrl-C comes
        print("WAITING", flush=True)
        greeters.slice(gpus=0).nap.call_one().get()
    time.sleep(600)   # wait to be killed
    """
)


def _run_controller(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], list[int]]:
    script = tmp_path / "controller.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert proc.stdout is not None
    pids: list[int] = []
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("PIDS"):
            pids = [int(p) for p in line.split()[1:]]
            break
    assert pids, f"controller printed no pids: {lines} {proc.stderr.read() if proc.poll() else ''}"
    proc.lines = lines  # type: ignore[attr-defined]
    return proc, pids


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def _family(proc: subprocess.Popen[str]) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "SIGINT", "exit", "raise"])
def test_no_worker_outlives_the_controller(tmp_path: Path, how: str) -> None:
    """However the controller ends; SIGINT (Ctrl-C) comes while it waits in a call's get()."""
    mode = {"exit": "exit", "raise": "raise", "SIGINT": "call"}.get(how, "wait")
    proc, pids = _run_controller(tmp_path, mode)
    family = _family(proc) + pids  # agent, fork server and workers
    assert "hello, world from 0" in "".join(proc.lines)  # type: ignore[attr-defined]
    if how == "SIGINT":
        assert proc.stdout is not None
        assert proc.stdout.readline() == "WAITING\n"
    if how.startswith("SIG"):
        proc.send_signal(getattr(signal, how))
    try:
        proc.wait(timeout=30)
        wait_until(lambda: _gone(family), timeout=10, what=f"processes {family} to exit")
    finally:
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait()
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        stderr = proc.stderr.read()
        proc.stderr.close()
    if how == "exit":
        assert proc.returncode == 0
    if how == "raise":
        assert proc.returncode == 1
    if how == "SIGINT":
        # The wait was interrupted: KeyboardInterrupt ended the script (Python then exits by
        # SIGINT, as a shell expects of a program that Ctrl-C stopped).
        assert proc.returncode == -signal.SIGINT
        assert "KeyboardInterrupt" in stderr, stderr


AFTER_SHUTDOWN = textwrap.dedent(
    """
    import time
    import actormesh as am

    class A(am.Actor):
        @am.endpoint
        def ping(self):
            return 1

    host = am.this_host()
    procs = host.spawn_procs(per_host={"gpus": 1})
    actors = procs.spawn("a", A)
    assert actors.ping.call_one().get(timeout=60) == 1
    am.shutdown_context().get(timeout=60)
    attempts = {
        "this_host": lambda: am.this_host().spawn_procs(per_host={"gpus": 1}),
        "an earlier host mesh": lambda: host.spawn_procs(per_host={"gpus": 1}),
        "this_proc": lambda: am.this_proc().spawn("b", A),
        "an earlier proc mesh": lambda: procs.spawn("c", A),
        "an earlier actor mesh": lambda: actors.ping.call_one().get(timeout=60),
    }
    for what, attempt in attempts.items():
        started = time.monotonic()
        try:
            attempt()
        except am.MeshClosedError as exc:
            print(what, "refused in", round(time.monotonic() - started, 3), "s:", exc)
        else:
            print(what, "was not refused")
    """
)


def test_nothing_starts_after_shutdown_context_and_the_error_says_why(tmp_path: Path) -> None:
    """It waited the whole spawn timeout (a new host agent, started on a closed node, could
    never report) and left a dead agent's traceback on stderr."""
    script = tmp_path / "after_shutdown.py"
    script.write_text(AFTER_SHUTDOWN)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stderr
    refusals = [line for line in result.stdout.splitlines() if "refused in" in line]
    assert len(refusals) == 5, result.stdout
    for line in refusals:
        assert "shutdown_context()" in line and "restart" in line
        seconds = float(line.split("refused in ")[1].split(" s")[0])
        assert seconds < 5, line  # refused, not timed out
    assert "Traceback" not in result.stderr


class Counter(am.Actor):
    def __init__(self) -> None:
        self.value = 0

    @am.endpoint
    def incr(self) -> None:
        self.value += 1

    @am.endpoint
    def get(self) -> int:
        return self.value


def test_forged_and_unsigned_messages_are_dropped_and_logged(shared_procs, capsys) -> None:
    counter = shared_procs.spawn("guarded", Counter)
    target = counter.slice(gpus=0)
    assert target.get.call_one().get(timeout=10) == 0
    address = shared_procs._procs.addresses[0]
    envelope = ("call", counter._key, "incr", shape_state(target._shape), None)
    payload = __import__("pickle").dumps(((), {}))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.connect(address.ipc)
    try:
        forged = Signer(os.urandom(32), new_id()).frames(address.mailbox, envelope, payload)
        sock.send_multipart(forged)
        sock.send_multipart([b"garbage", b"more garbage"])
        # The same message with the right key is executed: the test would notice a no-op.
        genuine = Signer(get_controller().key, new_id()).frames(address.mailbox, envelope, payload)
        sock.send_multipart(genuine)
        wait_until(lambda: target.get.call_one().get(timeout=10) == 1, 10, "the genuine message")
    finally:
        sock.close(linger=1000)
        ctx.term()
    assert target.get.call_one().get(timeout=10) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("[gpus=0] WARNING")]
    assert any("dropped a message that failed authentication: bad signature" in x for x in lines)
    assert any("dropped a message that failed authentication: truncated" in x for x in lines)


def test_random_frames_never_crash_a_worker_or_the_controller(shared_procs, capsys, caplog) -> None:
    import random

    counter = shared_procs.spawn("fuzzed", Counter)
    target = counter.slice(gpus=1)
    rng = random.Random(7)
    ctx = zmq.Context()
    socks = []
    try:
        for address in (shared_procs._procs.addresses[1], get_controller().node.address):
            sock = ctx.socket(zmq.PUSH)
            sock.connect(address.ipc)
            socks.append(sock)
            for _ in range(200):
                frames = [rng.randbytes(rng.randint(0, 300)) for _ in range(rng.randint(1, 4))]
                sock.send_multipart(frames)
        target.incr.broadcast()
        assert target.get.call_one().get(timeout=10) == 1  # both still serve
        # Each side says it dropped each of them (the worker through the controller's output):
        # all of that is seen here, none later in another test's output (or outside any).
        seen: list[str] = []
        wait_until(
            lambda: seen.append(capsys.readouterr().err) or _dropped("".join(seen)) >= 200,
            10,
            "the worker's 200 warnings",
        )
        assert _dropped("".join(seen)) == 200

        def controller_dropped() -> int:
            return sum(
                "dropped" in r.getMessage() for r in caplog.records if r.name.endswith("receive")
            )

        wait_until(lambda: controller_dropped() >= 200, 10, "the controller's 200 warnings")
        assert controller_dropped() == 200
    finally:
        for sock in socks:
            sock.close(linger=1000)
        ctx.term()


def _dropped(err: str) -> int:
    return sum(
        1 for line in err.splitlines() if line.startswith("[gpus=1] WARNING") and "dropped" in line
    )


def test_python_logging_in_an_endpoint_reaches_the_controller(shared_procs, capsys) -> None:
    class Logs(am.Actor):
        @am.endpoint
        def log(self) -> None:
            import logging

            logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
            logging.getLogger("training").info("step done")

    shared_procs.spawn("logs", Logs).slice(gpus=3).log.call_one().get(timeout=10)
    assert "[gpus=3] INFO step done" in capsys.readouterr().err


def test_sigint_does_not_kill_a_worker_and_stderr_arrives_once(shared_procs, capsys) -> None:
    class Pid(am.Actor):
        @am.endpoint
        def pid(self) -> int:
            import sys

            print("complaint", file=sys.stderr, flush=True)
            return os.getpid()

        @am.endpoint
        def raw(self) -> None:
            os.write(2, b"raw marker\n")  # only the host agent sees this: it comes after

    p = shared_procs.spawn("pid", Pid).slice(gpus=2)
    pid = p.pid.call_one().get(timeout=10)
    os.kill(pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole process group
    assert p.pid.call_one().get(timeout=10) == pid
    p.raw.call_one().get(timeout=10)
    seen: list[str] = []
    wait_until(
        lambda: seen.append(capsys.readouterr().err) or "raw marker" in "".join(seen),
        10,
        "the agent to forward the raw line",
    )
    # The agent forwards fd 2 in order: a duplicate of the earlier lines would be here by now.
    assert "".join(seen).count("[gpus=2] complaint") == 2


class Insides(am.Actor):
    @am.endpoint
    def look(self) -> dict[str, object]:
        import gc
        import threading

        return {
            "debugger_modules": sorted(m for m in ("debugpy", "pydevd") if m in sys.modules),
            "trace": sys.gettrace() is not None or threading.gettrace() is not None,
            "frozen": gc.get_freeze_count() > 0,
        }

    @am.endpoint
    def scheduling(self) -> tuple[int, int]:
        """The scheduling policy of this endpoint's thread and of the process's main thread."""
        return os.sched_getscheduler(0), os.sched_getscheduler(os.getpid())


def test_workers_of_a_controller_without_the_debugger_never_import_it(shared_procs) -> None:
    """The debugger is the kernel's: a plain controller's ranks load nothing of it, and start
    with what their fork server imported frozen out of the collector's way."""
    looks = shared_procs.spawn("insides", Insides).look.call().get(timeout=30)
    for _, seen in looks.items():
        assert seen == {"debugger_modules": [], "trace": False, "frozen": True}


def test_workers_run_under_sched_batch_and_the_controller_does_not(shared_procs) -> None:
    policies = shared_procs.spawn("sched", Insides).scheduling.call().get(timeout=30)
    assert set(policies.values()) == {(os.SCHED_BATCH, os.SCHED_BATCH)}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_worker_sched_other_keeps_the_default_policy_and_a_bad_value_is_refused(
    tmp_path: Path,
) -> None:
    script = tmp_path / "sched.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            import actormesh as am

            class Policy(am.Actor):
                @am.endpoint
                def get(self):
                    return os.sched_getscheduler(0)

            if __name__ == "__main__":
                with am.this_host().spawn_procs(per_host={"gpus": 2}) as procs:
                    print(sorted(set(procs.spawn("p", Policy).get.call().get(timeout=30).values())))
            """
        )
    )
    env = {**os.environ, "ACTORMESH_WORKER_SCHED": "other"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([os.SCHED_OTHER])
    env["ACTORMESH_WORKER_SCHED"] = "fifo"
    bad = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 1
    assert "ACTORMESH_WORKER_SCHED='fifo': use 'batch' or 'other'" in bad.stderr
