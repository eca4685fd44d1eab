"""A paused rank's debugger session belongs to the kernel: another local user cannot take it,
and a lost connection is attached again with the rank still paused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from kernel_support import Kernel
from support import wait_until

# Connects to the rank's debugger port as another user (nobody), then reports whether the rank
# closed the connection ("closed") or kept it ("open": pydevd took it as its new client).
ATTACKER = """
import encodings.idna, os, socket, sys  # before setuid: nobody cannot read the interpreter
os.setgid(65534)
os.setuid(65534)
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
s.settimeout(5)
try:
    print("closed" if s.recv(1) == b"" else "data")
except socket.timeout:
    print("open")
"""


def _paused_port(k: Kernel) -> int:
    value = k.ok(
        "from actormesh.debugger.session import get_debugger\n"
        "[rd.port for rd in get_debugger().paused()]"
    ).value
    ports = eval(value or "[]")
    assert len(ports) == 1, value
    return int(ports[0])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_another_user_cannot_take_a_paused_ranks_session(dbg4: Kernel) -> None:
    dbg4.ok("%%mesh procs\nif rank == 1:\n    breakpoint()\n    z = 5\nprint('done', rank)\n")
    port = _paused_port(dbg4)
    attacker = subprocess.run(
        [sys.executable, "-c", ATTACKER, str(port)], capture_output=True, text=True, timeout=30
    )
    assert attacker.stdout.strip() == "closed", attacker.stdout + attacker.stderr
    listing = dbg4.ok("%mesh dbg list").stream()
    assert "rank 1 {gpus=1}: paused at" in listing, listing
    assert dbg4.ok("%mesh dbg eval -r 1 rank").value.endswith(": 1})")
    done = dbg4.ok("%mesh dbg continue -r 1\n_mesh.get(timeout=30)")
    assert "[gpus=1] done 1" in done.stream(), done.stream()


def test_a_lost_debugger_connection_is_attached_again(dbg4: Kernel) -> None:
    dbg4.ok("%%mesh procs\nif rank == 2:\n    breakpoint()\n    z = 5\nprint('done', rank)\n")
    _paused_port(dbg4)
    dbg4.ok(
        "import socket\n"
        "rd = get_debugger().paused()[0]\n"
        "old = rd.client\n"
        "old._sock.shutdown(socket.SHUT_RDWR)  # the connection is lost (not detached)"
    )
    wait_until(
        lambda: dbg4.ok("rd.client not in (None, old) and rd.status == 'paused'").value == "True",
        20,
        "the rank to be attached again, still paused",
    )
    listing = dbg4.ok("%mesh dbg list").stream()
    assert "rank 2 {gpus=2}: paused at" in listing, listing
    done = dbg4.ok("%mesh dbg continue -r 2\n_mesh.get(timeout=30)")
    assert "[gpus=2] done 2" in done.stream(), done.stream()
