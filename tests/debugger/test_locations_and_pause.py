"""Breakpoints by location on chosen ranks, pausing a busy rank, and tensor summaries."""

from __future__ import annotations

from kernel_support import Kernel


def listing(k: Kernel) -> str:
    return k.ok("%mesh dbg list").stream()


def test_breakpoint_by_location_in_an_actor_class_defined_in_a_cell(dbg4: Kernel) -> None:
    r = dbg4.ok(
        "class Doubler(am.Actor):\n"
        "    @am.endpoint\n"
        "    def work(self, x):\n"
        "        y = x * 2\n"
        "        z = y + 1\n"
        "        return z\n"
    )
    n = r.reply["content"]["execution_count"]
    dbg4.ok("doublers = procs.spawn('doublers', Doubler)")
    out = dbg4.ok(f"%mesh dbg break In[{n}]:5 -r 0,3").stream()
    assert f"breakpoint set at In [{n}]:5 on ranks 0, 3" in out, out
    dbg4.ok("pending = doublers.work.call(7)")
    dbg4.ok("%mesh dbg wait -r 0,3 -t 30")
    text = listing(dbg4)
    for rank in (0, 3):
        assert f"rank {rank} {{gpus={rank}}}: paused at In [{n}]:5 in work" in text, text
    for rank in (1, 2):
        assert f"rank {rank} {{gpus={rank}}}: running" in text, text
    assert dbg4.ok("v = %mesh dbg eval -r 0,3 y\nv.values()").value == "[14, 14]"
    # Labelled with the ranks' own coordinates, not their positions in the selection.
    assert dbg4.ok("v").value == "ValueMesh({gpus=0: 14, gpus=3: 14})"
    assert dbg4.ok("%mesh dbg eval -r 3 y").value == "ValueMesh({gpus=3: 14})"
    # The source of the cell is shown on the ranks, though its file exists only in the kernel.
    where = dbg4.ok("%mesh dbg where -r 0,3").stream()
    assert "=== ranks 0, 3 ===" in where and "z = y + 1" in where, where
    dbg4.ok(f"%mesh dbg break In[{n}]:5 -r 0,3 --clear")
    dbg4.ok("%mesh dbg continue")
    assert dbg4.ok("pending.get(timeout=30).values()").value == "[15, 15, 15, 15]"
    assert "no rank is paused" in listing(dbg4)


def test_pause_stops_a_busy_rank_and_where_shows_the_loop(dbg4: Kernel) -> None:
    dbg4.ok(
        "%%mesh procs --ranks 1 --noblock -o spin\n"
        "stop = False\n"
        "n = 0\n"
        "while not stop:\n"
        "    n += 1\n"
    )
    out = dbg4.ok("%mesh dbg pause -r 1").stream()
    assert "rank 1 {gpus=1}: paused at In [" in out, out
    where = dbg4.ok("%mesh dbg where -r 1").stream()
    assert "while not stop" in where or "n += 1" in where, where
    assert "paused at" in where
    status = dbg4.ok("%mesh status").displays()[0]["text/plain"]  # a paused rank answers
    assert "busy" in status.splitlines()[2], status
    stacks = dbg4.ok("%mesh stacks").stream()
    assert "paused at" in stacks and "in the debugger" in stacks, stacks
    assert dbg4.ok("%mesh dbg eval -r 1 n > 0").value is not None
    dbg4.ok("%mesh dbg eval -r 1 stop = True")
    dbg4.ok("%mesh dbg continue -r 1")
    dbg4.ok("spin.get(timeout=30)")
    # The other ranks were never paused.
    assert dbg4.ok("%%mesh procs --ranks 0 -o free\n'free'\n").value is not None


def test_tensor_summaries_flag_the_rank_with_a_nan(dbg4: Kernel) -> None:
    dbg4.ok("%%mesh procs\nt = torch.ones(8)\nif rank == 1:\n    t[3] = float('nan')\n")
    r = dbg4.ok("c = %mesh dbg inspect t\nprint(repr(c))\nc.flagged")
    assert r.value == "['rank 1 {gpus=1}']", r.stream()
    table = r.stream()
    assert "shape" in table and "(8)" in table and "nan" in table, table
    html = dbg4.ok("c._repr_html_()").value
    assert html is not None and "jp-actormesh-odd" in html


def test_module_summaries_flag_the_rank_whose_parameters_differ(dbg4: Kernel) -> None:
    dbg4.ok(
        "%%mesh procs\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(3, 2)\n"
        "model(torch.ones(1, 3)).sum().backward()\n"
        "if rank == 3:\n"
        "    with torch.no_grad():\n"
        "        model.weight.add_(1.0)\n"
    )
    r = dbg4.ok("c = %mesh dbg inspect model\nprint(repr(c))\nc.flagged")
    assert r.value == "['rank 3 {gpus=3}']", r.stream()
    assert "weight norm" in r.stream() and "bias grad norm" in r.stream()


def test_a_plain_cell_waiting_on_an_endpoint_paused_in_breakpoint_returns(dbg4: Kernel) -> None:
    r = dbg4.ok(
        "class Stepper(am.Actor):\n"
        "    @am.endpoint\n"
        "    def step(self, x):\n"
        "        if am.current_rank().rank == 2:\n"
        "            breakpoint()\n"
        "        return x + 1\n"
    )
    n = r.reply["content"]["execution_count"]
    dbg4.ok("steppers = procs.spawn('steppers', Stepper)")
    r = dbg4.execute("result = steppers.step.call(1)\nresult.get(timeout=60)")
    assert r.status == "error" and r.ename == "RanksPaused", r.traceback
    assert f"rank 2 {{gpus=2}} paused at In [{n}]:6 in step" in r.traceback, r.traceback
    dbg4.ok("%mesh dbg continue")
    assert dbg4.ok("result.get(timeout=30).values()").value == "[2, 2, 2, 2]"


def test_breakpoint_by_location_in_a_function_of_a_mesh_cell(dbg4: Kernel) -> None:
    r = dbg4.ok("%%mesh procs\ndef f(v):\n    w = v + 1\n    return w * 2\n")
    n = r.reply["content"]["execution_count"]
    assert "on ranks 1" in dbg4.ok(f"%mesh dbg break In[{n}]:3 -r 1").stream()
    out = dbg4.ok("%%mesh procs\nf(rank)\n").stream()
    assert f"rank 1 {{gpus=1}} paused at In [{n}]:3 in f" in out, out
    assert str(dbg4.ok("%mesh dbg eval -r 1 w").value).endswith(": 2})")
    dbg4.ok(f"%mesh dbg break In[{n}]:3 -r 1 --clear")
    assert dbg4.ok("%mesh dbg continue\n_mesh.get(timeout=30).values()").value == "[2, 4, 6, 8]"


def test_dbg_on_attaches_every_rank_without_pausing_any(dbg4: Kernel) -> None:
    out = dbg4.ok("%mesh dbg on").stream()
    assert "debugger attached to ranks 0, 1, 2, 3" in out
    listing = dbg4.ok("%mesh dbg list").stream()
    assert listing.count(": running") == 4 and "no rank is paused" in listing
    assert dbg4.ok("%%mesh procs\nrank * 3").value == (
        "ValueMesh({gpus=0: 0, gpus=1: 3, gpus=2: 6, gpus=3: 9})"
    )
