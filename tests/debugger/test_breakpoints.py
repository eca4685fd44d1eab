"""``breakpoint()`` on one rank of a real 4-rank mesh, then list / eval / next / continue."""

from __future__ import annotations

import re

from kernel_support import Kernel, spawn_code
from support import wait_until

# How pydevd starts its log lines ("0.85s - ..."), after the rank prefix of a mesh cell.
PYDEVD_LOG = re.compile(r"^\[[^\]]*\] \d+\.\d+s - ", re.MULTILINE)


def count(result: object) -> int:
    return int(result.reply["content"]["execution_count"])  # type: ignore[attr-defined]


def test_breakpoint_in_a_cell_pauses_one_rank_and_the_cell_returns(dbg4: Kernel) -> None:
    r = dbg4.ok(
        "%%mesh procs\n"
        "x = rank * 10\n"
        "if rank == 2:\n"
        "    breakpoint()\n"
        "    y = x + 1\n"
        "    print('after', y)\n"
        "print('done', rank)\n"
    )
    n = count(r)
    out = r.stream()
    for rank in (0, 1, 3):
        assert f"done {rank}" in out
    assert "done 2" not in out
    assert f"rank 2 {{gpus=2}} paused at In [{n}]:4 in <module>" in out, out

    listing = dbg4.ok("%mesh dbg list").stream()
    assert f"rank 2 {{gpus=2}}: paused at In [{n}]:4 in <module>" in listing, listing
    assert "rank 0 {gpus=0}: running" in listing and "1 paused" in listing

    assert dbg4.ok("v = %mesh dbg eval -r 2 x\nv.values()").value == "[20]"
    # Waiting for the cell's paused rank would block the notebook: it says so instead.
    early = dbg4.execute("_mesh.get(timeout=60)")
    assert early.ename == "RanksPaused" and "rank 2 {gpus=2} paused at" in early.traceback
    stepped = dbg4.ok("%mesh dbg next -r 2").stream()
    assert f"paused at In [{n}]:5 in <module>" in stepped, stepped
    assert dbg4.ok("%mesh dbg eval -r 2 y + 1").value == "ValueMesh({gpus=2: 22})"

    # In one cell: rank 2's remaining output arrives while it waits, so it is this cell's
    # (output that lands as a cell ends is shown under that cell, which a test cannot see).
    rest = dbg4.ok("%mesh dbg continue -r 2\n_mesh.get(timeout=30)")
    out = rest.stream()
    assert "[gpus=2] after 21" in out and "[gpus=2] done 2" in out, out
    assert rest.value == "ValueMesh({gpus=0: None, gpus=1: None, gpus=2: None, gpus=3: None})"
    wait_until(
        lambda: "no rank is paused" in dbg4.ok("%mesh dbg list").stream(),
        10,
        "rank 2 to be running again",
    )


def test_the_first_pause_of_a_mesh_shows_no_pydevd_warning(dbg4: Kernel) -> None:
    """The first breakpoint() of a mesh spawns the kernel's ``_mesh_debug`` actor there. When
    its thread started as the rank stopped, pydevd printed "thread._ident is None in
    _get_related_thread!" into the cell: about one mesh in three, hence the fresh meshes."""
    for attempt in range(16):
        dbg4.ok(spawn_code(1, "fresh"))
        cells = []
        try:
            cells.append(dbg4.ok("%%mesh fresh\nbefore = 1\nbreakpoint()\nafter = 2\n"))
            assert "paused at In [" in cells[0].stream(), cells[0].stream()
            cells.append(dbg4.ok("%mesh dbg list"))
            cells.append(dbg4.ok("%mesh dbg continue\n_mesh.get(timeout=30)"))
        finally:
            cells.append(dbg4.ok("fresh.stop().get(timeout=30)"))
        out = "".join(c.stream() + c.stream("stderr") for c in cells)
        assert "_get_related_thread" not in out and not PYDEVD_LOG.search(out), (attempt, out)


def test_a_paused_rank_in_a_process_group_warns_of_its_timeout(dbg4: Kernel) -> None:
    dbg4.ok(
        "from actormesh.runtime.dataplane.distributed import init_process_group\n"
        "pair = am.this_host().spawn_procs(per_host={'gpus': 2})\n"
        "init_process_group(pair, timeout=600).get(timeout=60)"
    )
    try:
        r = dbg4.ok("%%mesh pair --ranks 1\nbreakpoint()\nafter = 1\n")
        text = r.stream() + r.stream("stderr")
        assert "process group with a 600 s timeout" in text, text
        assert "(process group timeout in " in dbg4.ok("%mesh dbg list").stream()
        # Several meshes now: -m picks one; without it the mesh with paused ranks is meant.
        assert dbg4.ok("%mesh dbg eval -m pair -r 1 1 + 1").value is not None
        dbg4.ok("%mesh dbg continue")
        dbg4.ok("_mesh.get(timeout=30)")
    finally:
        dbg4.ok("pair.stop().get(timeout=30)")


def test_state_api_for_the_sidebar_pause_resume_and_listen(dbg4: Kernel) -> None:
    dbg4.ok("%%mesh procs --ranks 3 --noblock -o loop3\ngo = True\nk = 0\nwhile go:\n    k += 1\n")
    dbg4.ok(
        "from actormesh.debugger import state\n"
        "changes = []\n"
        "unsubscribe = state.add_listener(lambda: changes.append(len(state.paused_ranks())))\n"
        "mesh_id = procs._procs.mesh_id\n"
        "state.pause(mesh_id, [3])"  # returns at once; the listener hears of the pause
    )
    wait_until(lambda: dbg4.ok("len(state.paused_ranks())").value == "1", 30, "rank 3 to be paused")
    paused = dbg4.ok("p = state.paused_ranks()[0]\n(p.mesh_id == mesh_id, p.rank, p.function)")
    assert paused.value == "(True, 3, '<module>')"
    assert dbg4.ok("p.file.startswith('In [') and p.line in (3, 4)").value == "True"
    assert dbg4.ok("1 in changes").value == "True"
    dbg4.ok("%mesh dbg eval -r 3 go = False")
    dbg4.ok("state.resume(mesh_id, [3])")
    dbg4.ok("loop3.get(timeout=30)")
    assert dbg4.ok("state.paused_ranks()").value == "[]"
    assert dbg4.ok("unsubscribe(); changes[-1]").value == "0"


def test_after_dbg_off_a_breakpoint_pauses_again(dbg4: Kernel) -> None:
    # debugpy keeps running on a rank once started there; its own breakpoint hook would drop
    # a breakpoint() while no client is attached.
    assert "debugger attached to ranks 0, 1, 2, 3" in dbg4.ok("%mesh dbg on").stream()
    dbg4.ok("%mesh dbg off")
    # A rank's debug port is open to every local user; without the token it obeys nobody.
    r = dbg4.ok(
        "from actormesh.debugger.dap import DapError, connect\n"
        "dbg = __import__('actormesh').kernel.debugger_seam.installed().debugger\n"
        "port = next(rd.port for rd in dbg.ranks.values() if rd.port)\n"
        "intruder = connect('127.0.0.1', port, lambda *a: None)\n"
        "try:\n"
        "    intruder.request('evaluate', {'expression': '1'})\n"
        "except DapError as exc:\n"
        "    print(exc)\n"
        "intruder.close()"
    )
    assert "Client not authenticated" in r.stream(), r.stream()
    r = dbg4.ok("%%mesh procs --ranks 0\nbreakpoint()\nagain = 1\n")
    assert "rank 0 {gpus=0} paused at In [" in r.stream(), r.stream()
    dbg4.ok("%mesh dbg continue")
    dbg4.ok("_mesh.get(timeout=30)")


def test_a_mesh_that_never_debugs_runs_nothing_of_the_debugger(dbg4: Kernel) -> None:
    """With the debugger on, the fork server imports pydevd ahead for its ranks; until a rank
    is debugged nothing of it runs there, and breakpoint() still goes by PYTHONBREAKPOINT."""
    dbg4.ok("quiet = am.this_host().spawn_procs(per_host={'gpus': 1})")
    try:
        r = dbg4.ok(
            "%%mesh quiet\n"
            "import sys, threading, traceback\n"
            "from _pydevd_bundle.pydevd_constants import get_global_debugger\n"
            "# pydevd hides its threads from threading.enumerate(), not their stacks\n"
            "stacks = [traceback.extract_stack(f) for f in sys._current_frames().values()]\n"
            "ours = [s for s in stacks if any('pydevd' in f.filename for f in s)]\n"
            "print('debugger', get_global_debugger() is not None, 'pydevd threads', len(ours),\n"
            "      'trace', sys.gettrace() is not None or threading.gettrace() is not None,\n"
            "      'own hook', sys.breakpointhook is not sys.__breakpointhook__)\n"
        )
        out = r.stream()
        assert "debugger False pydevd threads 0 trace False own hook False" in out, out
    finally:
        dbg4.ok("quiet.stop().get(timeout=30)")
