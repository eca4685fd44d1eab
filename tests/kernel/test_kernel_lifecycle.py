"""The kernel's lifetime and streams: restart and SIGKILL leave no worker; output arrives before
idle; the input history reaches its database; ``%load_ext`` in a stock kernel; the kernelspec
from pip (shared-data) and from the CLI."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from kernel_support import Kernel, alive, spawn_code, start_kernel, wait_gone
from support import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _mesh_pids(kernel: Kernel, n: int) -> list[int]:
    """The kernel's children and grandchildren once its mesh of ``n`` ranks is up."""
    wait_until(lambda: len(kernel.tree()) >= n + 3, 30, f"agent, fork server and {n} workers")
    return [p for p in kernel.tree() if p != kernel.pid]


def test_restart_stops_every_mesh(kernel: Kernel) -> None:
    kernel.ok(spawn_code(4))
    workers = kernel.ok("print(*procs._procs.pids)").stream().split()
    below = _mesh_pids(kernel, 4)
    assert {int(w) for w in workers} <= set(below)
    old_kernel = kernel.pid
    kernel.km.restart_kernel(now=False)
    wait_gone([old_kernel, *below], 30, "the old kernel, its agent and its workers to exit")
    kernel.kc.wait_for_ready(timeout=60)
    assert kernel.ok("'procs' in dir()").value == "False"  # a fresh kernel
    kernel.ok(spawn_code(2))  # and it can spawn again
    assert kernel.ok("%%mesh procs\nrank").value == "ValueMesh({gpus=0: 0, gpus=1: 1})"


def test_shutdown_stops_every_mesh() -> None:
    k = start_kernel()
    k.ok(spawn_code(3))
    tree = k.tree()
    assert len(alive(tree)) >= 6
    k.kc.stop_channels()
    k.km.shutdown_kernel(now=False)  # a shutdown_request: the kernel stops its meshes
    wait_gone(tree, 30, "every process of the kernel to exit after shutdown")


def test_sigkill_of_the_kernel_leaves_no_worker() -> None:
    k = start_kernel()
    try:
        k.ok(spawn_code(4))
        k.ok("%%mesh procs\nx = rank")  # executors up too
        tree = [k.pid, *_mesh_pids(k, 4)]
        os.kill(k.pid, signal.SIGKILL)
        wait_gone(tree, 15, "the agent and workers of a SIGKILLed kernel to exit")
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)


def test_load_ext_in_a_stock_ipython_kernel() -> None:
    k = start_kernel("python3")
    try:
        assert k.kc.kernel_info(reply=True, timeout=30)["content"]["implementation"] == "ipython"
        assert k.execute("%%mesh procs\n1").stream("stderr").startswith("UsageError: Cell magic")
        k.ok("%load_ext actormesh")
        k.ok(spawn_code(2))
        r = k.ok("%%mesh procs\nprint('hi')\nrank")
        assert "[gpus=0-1] hi" in r.stream()
        assert r.value == "ValueMesh({gpus=0: 0, gpus=1: 1})"
        k.ok("procs.stop().get(timeout=20)")
    finally:
        k.shutdown()


def test_cli_installs_the_same_kernelspec_that_pip_ships(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "actormesh", "install-kernel", "--prefix", str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    installed = tmp_path / "share" / "jupyter" / "kernels" / "actormesh" / "kernel.json"
    assert str(installed.parent) in out.stdout
    shipped = ROOT / "share" / "jupyter" / "kernels" / "actormesh" / "kernel.json"
    spec = json.loads(installed.read_text())
    # This interpreter's absolute path, not "python" (which a Jupyter in another environment
    # replaces with its own interpreter, where actormesh is missing); the rest as shipped.
    assert spec["argv"][0] == sys.executable and os.path.isabs(spec["argv"][0])
    assert spec == {**json.loads(shipped.read_text()), "argv": spec["argv"]}
    assert spec["argv"][1:3] == ["-m", "actormesh.kernel"]
    assert spec["interrupt_mode"] == "message"
    for logo in ("logo-32x32.png", "logo-64x64.png"):
        data = (installed.parent / logo).read_bytes()
        assert data.startswith(b"\x89PNG\r\n") and data == (shipped.parent / logo).read_bytes()
    # pip installs it through hatch's shared-data.
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = pyproject.split("[tool.hatch.build.targets.wheel.shared-data]", 1)[1]
    mapping = '"share/jupyter/kernels/actormesh" = "share/jupyter/kernels/actormesh"'
    assert mapping in section.split("\n[", 1)[0]
    bad = subprocess.run(
        [sys.executable, "-m", "actormesh", "install-kernel", "--user", "--sys-prefix"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "not allowed with" in bad.stderr


def test_output_arrives_before_idle_with_flushes_that_skip_empty_streams(kernel: Kernel) -> None:
    # The kernel's streams skip a flush only when nothing is left to send (kernel/iostream.py):
    # text written anywhere, by any thread, still reaches the client before the cell's idle.
    assert kernel.ok("import sys\ntype(sys.stdout).__name__").value == (
        "'OutStreamSkippingEmptyFlushes'"
    )
    code = (
        "import sys, threading\n"
        "sys.stdout.flush(); sys.stderr.flush()\n"  # nothing written yet: returns at once
        "t = threading.Thread(target=lambda: print('from a thread', end='|'))\n"
        "t.start(); t.join()\n"
        "print('from the cell', end='|'); sys.stdout.flush()\n"
        "print('after the flush', end='|')\n"
        "print('to stderr', end='|', file=sys.stderr)\n"
    )
    for _ in range(3):
        result = kernel.ok(code)
        assert result.stream() == "from a thread|from the cell|after the flush|"
        assert result.stream("stderr") == "to stderr|"


def _history_file(kernel: Kernel) -> tuple[str, int]:
    code = "hm = get_ipython().history_manager\nprint(hm.hist_file, hm.session_number, end='')"
    path, session = kernel.ok(code).stream().rsplit(" ", 1)
    assert Path(path).is_file(), f"the kernel keeps its history in {path!r}, not a file"
    return path, int(session)


def _history_rows(path: str, session: int) -> set[str]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        rows = db.execute("SELECT source_raw FROM history WHERE session = ?", (session,))
        return {row[0] for row in rows}
    finally:
        db.close()


def test_history_reaches_its_database_once_the_kernel_is_idle(kernel: Kernel) -> None:
    # The kernel writes the input history after a cell's idle, not as it starts (kernel.py).
    path, session = _history_file(kernel)
    kernel.ok("a = 1")
    kernel.ok("b = 2")
    wait_until(
        lambda: {"a = 1", "b = 2"} <= _history_rows(path, session),
        10,
        "both inputs in the history database",
    )


def test_history_of_a_cell_just_before_shutdown_is_kept(kernel: Kernel) -> None:
    path, session = _history_file(kernel)
    kernel.ok("last = 'cell before shutdown'")
    kernel.shutdown()  # at once: before the kernel's idle-time write is due
    assert "last = 'cell before shutdown'" in _history_rows(path, session)
