"""Distributed tensors in the actormesh kernel (issue 19; TENSORS.md §5, §8 tests 7-8), through
one real kernel: the op stream is sent after every cell, ``%mesh push`` hands each rank its
DTensor, ``%mesh dbg inspect`` summarises shards on the ranks and flags the odd ones, and the
sidebar shows a rank busy in the tensor engine with the op it runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_support import Kernel
from panel_support import Panel, ranks_of
from support import wait_until

pytest.importorskip("torch")

WAIT = 120  # forming the process group and the engines on a loaded 2-core machine


def test_kernel_mesh_tensor(panel_kernel: tuple[Kernel, Panel], tmp_path: Path) -> None:
    kernel, panel = panel_kernel
    # The kernel does not load the tensor layer (nor torch) until a notebook uses it.
    kernel.ok("import sys\nassert 'actormesh.tensor' not in sys.modules, sorted(sys.modules)")
    kernel.ok(
        "import torch, actormesh as am\n"
        "import actormesh.tensor.controller.idle_flush as idle_flush\n"
        "idle_flush.IDLE_FLUSH = 3600.0  # no idle flush: only the end of the cell sends the ops\n"
        "procs = am.this_host().spawn_procs(per_host={'dp': 2, 'tp': 2})\n"
        "x = torch.arange(64.0).reshape(8, 8)\n"
        "dt = am.distribute(x, procs, sharding_spec=['dp', None])\n"
        "y = dt * 2\n"
        "tm = dt.mesh\n"
        "assert tm.stream.ops, 'the ops are still buffered while the cell runs'",
        timeout=WAIT,
    )
    # The end of the previous cell sent them: nothing left, and a message went out.
    kernel.ok("assert tm.stream.ops == [] and tm.stream.batches >= 1, tm.stream.ops")

    # %mesh push: each rank gets its own DTensor (no copy of the full tensor).
    kernel.ok("%mesh push procs dt")
    out = kernel.ok(
        "%%mesh procs\n"
        "print(f'rank {rank}: {type(dt).__name__} {tuple(dt.to_local().shape)} "
        "{dt.to_local()[0, 0].item():g}')"
    ).stream()
    for r, first in [(0, 0), (1, 0), (2, 32), (3, 32)]:
        assert f"rank {r}: DTensor (4, 8) {first}" in out, out

    # %mesh dbg inspect on a MeshTensor: one column per rank, norms of the real shards.
    table = kernel.ok("%mesh dbg inspect dt").value or ""
    assert "{dp=1, tp=1}" in table and "norm" in table and "flagged" not in table, table
    kernel.ok(
        "cmp = get_ipython().run_line_magic('mesh', 'dbg inspect dt')\n"
        "for d in range(2):\n"
        "    for p in range(2):\n"
        "        s = cmp.summaries[f'{{dp={d}, tp={p}}}']\n"
        "        shard = am.fetch(dt, dp=d, tp=p).get(timeout=60)\n"
        "        assert s['shape'] == [4, 8], s\n"
        "        assert abs(s['norm'] - torch.linalg.norm(shard).item()) < 1e-3, (s, shard)\n"
        "assert cmp.flagged == []"
    )
    # Inf on one rank only: that rank is flagged.
    kernel.ok(
        "with procs.activate():\n"
        "    bad = torch.ones(2, 3) / (am.tensor.rank(procs, ('dp', 'tp')) - 2)\n"
        "cmp = get_ipython().run_line_magic('mesh', 'dbg inspect bad')\n"
        "assert cmp.flagged == ['{dp=1, tp=0}'], cmp"
    )

    # A module from module_to_mesh: parameters (and grads) per rank; a diverged replica is
    # flagged, the others are not.
    kernel.ok(
        "torch.manual_seed(0)\n"
        "model = am.module_to_mesh(torch.nn.Linear(4, 2), procs)\n"
        "loss = model(torch.randn(8, 4)).square().mean()\n"
        "loss.backward()\n"
        "print(loss.item())\n"
        "cmp = get_ipython().run_line_magic('mesh', 'dbg inspect model')\n"
        "rows = dict(cmp.rows)\n"
        "assert cmp.flagged == [] and rows['weight grad norm'], cmp\n"
        "@am.remote(propagate='inspect')\n"
        "def nudge(t):\n"
        "    import torch.distributed as dist\n"
        "    if dist.get_rank() == 3:\n"
        "        t.to_local().add_(1.0)\n"
        "nudge(model.weight)\n"
        "cmp = get_ipython().run_line_magic('mesh', 'dbg inspect model')\n"
        "assert cmp.flagged == ['{dp=1, tp=1}'], cmp",
        timeout=WAIT,
    )

    # The sidebar: ranks busy in the tensor engine say which op.
    panel.ok("subscribe", client=panel.client)
    panel.wait("a snapshot", lambda m: m["type"] == "snapshot" and m["meshes"])
    gate = tmp_path / "go"
    kernel.ok(
        "@am.remote(propagate='inspect')\n"
        "def hold(t, path):\n"
        "    import os, time\n"
        "    deadline = time.monotonic() + 60\n"
        "    while not os.path.exists(path) and time.monotonic() < deadline:\n"
        "        time.sleep(0.01)  # a poll of the test's gate, bounded\n"
        f"held = hold(dt, {str(gate)!r})"
    )

    def in_engine(ranks: list[dict[str, object]]) -> bool:
        return len(ranks) == 4 and all(
            isinstance(r["busy"], dict)
            and str(r["busy"]["what"]).startswith("tensor engine: op ")
            and "remote function hold" in str(r["busy"]["what"])
            for r in ranks
        )

    try:
        snap = panel.snapshot("4 ranks busy in the tensor engine", in_engine)
        assert ranks_of(snap)[0]["state"] == "busy"
        shown = kernel.ok("%mesh status procs").displays()
        status = "".join(d["text/plain"] for d in shown)
        assert "tensor engine: op " in status, status
    finally:
        gate.touch()
    assert kernel.ok("print(am.inspect(y).sum().item())").stream().strip() == "4032.0"


def test_adopt_values_a_mesh_cell_made(kernel: Kernel) -> None:
    kernel.ok(
        "import torch, actormesh as am\n"
        "procs = am.this_host().spawn_procs(per_host={'dp': 2, 'tp': 2})\n"
        "dt = am.distribute(torch.ones(4, 4), procs, sharding_spec=['dp', None])",
        timeout=WAIT,
    )
    kernel.ok("%mesh push procs dt")
    kernel.ok(
        "%%mesh procs\n"
        "import torch\n"
        "from torch.distributed.tensor import DTensor, Shard\n"
        "block = torch.full((2, 3), float(rank))\n"
        "made = DTensor.from_local(block, dt.device_mesh, [Shard(0), Shard(1)], run_check=False)\n"
        "mine = torch.arange(3.0) + rank\n"
        "odd = torch.zeros(rank + 1)\n"
        "word = 'not a tensor'"
    )
    # A DTensor over the engine's mesh: a global MeshTensor, its blocks where the cells put them.
    kernel.ok(
        "made = am.tensor.adopt(procs, 'made')\n"
        "assert isinstance(made, am.MeshTensor) and made.shape == (4, 6) and not made.per_rank\n"
        "want = torch.zeros(4, 6)\n"
        "for d in range(2):\n"
        "    for p in range(2):\n"
        "        want[2 * d:2 * d + 2, 3 * p:3 * p + 3] = 2 * d + p\n"
        "assert torch.equal(am.inspect(made), want), am.inspect(made)\n"
        "assert torch.equal(am.inspect(made @ made.T), want @ want.T)  # a collective on it",
        timeout=WAIT,
    )
    # A plain tensor: a per-rank MeshTensor, the cell's own tensor (a later cell changes it).
    kernel.ok(
        "mine = am.tensor.adopt(procs, 'mine')\n"
        "assert mine.per_rank and mine.shape == (3,)\n"
        "assert torch.equal(am.fetch(mine, dp=1, tp=0).get(timeout=60), torch.arange(3.0) + 2)\n"
        "total = am.inspect(mine.reduce(('dp', 'tp'), 'sum'))\n"
        "assert torch.equal(total, 4 * torch.arange(3.0) + 6), total"
    )
    kernel.ok("%%mesh procs\nmine.add_(100)")
    kernel.ok("assert torch.equal(am.fetch(mine, tp=1).get(timeout=60), torch.arange(3.0) + 101)")
    # Bad input: clear errors, and nothing kept.
    kernel.ok(
        "try:\n"
        "    am.tensor.adopt(procs, 'odd')\n"
        "except am.MeshUsageError as e:\n"
        "    assert 'do not make one MeshTensor' in str(e), e\n"
        "    assert '{dp=1, tp=1}: tensor [4] torch.float32' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('values of different shapes were adopted')\n"
        "try:\n"
        "    am.tensor.adopt(procs, 'nowhere')\n"
        "except am.ActorError as e:\n"
        "    assert len(e.failures) == 4 and e.exc_type == 'NameError', e\n"
        "    assert \"'nowhere' is not defined in the %%mesh namespace\" in str(e), e\n"
        "else:\n"
        "    raise AssertionError('an undefined name was adopted')\n"
        "try:\n"
        "    am.tensor.adopt(procs, 'word')\n"
        "except am.ActorError as e:\n"
        "    assert \"'word' on {dp=0, tp=0} is a str, not a tensor\" in str(e), e\n"
        "else:\n"
        "    raise AssertionError('a str was adopted')\n"
        "try:\n"
        "    am.tensor.adopt(procs, 'not a name')\n"
        "except am.MeshUsageError as e:\n"
        "    assert 'must be the Python name' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('a bad name was accepted')\n"
        "base = am.tensor.live(procs).values()\n"
        "assert am.inspect(made.sum()).item() == want.sum().item()\n"
        "assert am.tensor.live(procs).values() == base  # the refused adoptions left nothing"
    )


def _push_a_dtensor(kernel: Kernel) -> None:
    """``procs`` {dp: 2, tp: 2}, ``x`` (8x8) and ``dt``, x split over dp, pushed to the ranks."""
    kernel.ok(
        "import torch, actormesh as am\n"
        "procs = am.this_host().spawn_procs(per_host={'dp': 2, 'tp': 2})\n"
        "x = torch.arange(64.0).reshape(8, 8)\n"
        "dt = am.distribute(x, procs, sharding_spec=['dp', None])\n"
        "assert am.inspect(dt).sum().item() == x.sum().item()",
        timeout=WAIT,
    )
    kernel.ok("%mesh push procs dt")


def test_a_mesh_cell_waits_for_the_engines_batch(kernel: Kernel, tmp_path: Path) -> None:
    """A cell that touches engine values runs between the engine's batches on every rank, so its
    collectives and the engine's never interleave: it waits for the batch sent before it."""
    gate, log = tmp_path / "go", tmp_path / "log"
    _push_a_dtensor(kernel)
    kernel.ok(
        "class Peek(am.Actor):\n"
        "    @am.endpoint\n"
        "    def waiting(self):  # is a thread of this rank in CellTurn's wait?\n"
        "        import sys, traceback\n"
        "        return any(\n"
        "            f.filename.endswith('tensor/worker/local.py') and f.name == '__enter__'\n"
        "            for frame in sys._current_frames().values()\n"
        "            for f in traceback.extract_stack(frame)\n"
        "        )\n"
        "peek = procs.spawn('peek', Peek)\n"
        "assert not any(peek.waiting.call().get(timeout=30).values())"
    )
    kernel.ok(
        "@am.remote(propagate='inspect')\n"
        "def hold(t, gate, log):\n"
        "    import os, time\n"
        "    import torch.distributed as dist\n"
        "    deadline = time.monotonic() + 60\n"
        "    while not os.path.exists(gate) and time.monotonic() < deadline:\n"
        "        time.sleep(0.01)  # a poll of the test's gate, bounded\n"
        "    with open(f'{log}.{dist.get_rank()}', 'a') as f:\n"
        "        f.write('engine\\n')\n"
        f"held = hold(dt, {str(gate)!r}, {str(log)!r})\n"
        "square = dt @ dt.T  # the engine's collective, in the same batch"
    )
    try:
        kernel.ok(
            "%%mesh procs --noblock -o job\n"
            f"with open(f'{log}.{{rank}}', 'a') as f:\n"
            "    f.write('cell\\n')\n"
            "dt.full_tensor().sum().item()  # the cell's collective"
        )
        # Every rank's cell waits for its engine (busy in hold) before it starts.
        wait_until(
            lambda: kernel.ok("all(peek.waiting.call().get(timeout=10).values())").value == "True",
            60,
            "the cells on all 4 ranks to wait for the engine",
        )
        assert not any(tmp_path.glob("log.*")), "a cell ran while its engine ran a batch"
    finally:
        gate.touch()
    values = kernel.ok("job.get(timeout=60).values()", timeout=WAIT).value
    assert values == "[2016.0, 2016.0, 2016.0, 2016.0]", values
    for rank in range(4):
        assert (tmp_path / f"log.{rank}").read_text() == "engine\ncell\n"
    kernel.ok("assert torch.equal(am.inspect(square), x @ x.T)")
    # A cell that touches no engine value does not wait for the engine.
    kernel.ok("%%mesh procs\nprint(rank)")


def test_a_noblock_cell_and_the_ops_issued_while_it_runs_keep_one_order(kernel: Kernel) -> None:
    """Ops the controller issues while a ``--noblock`` cell that runs collectives still runs
    reach every rank's engine after that rank's cell: each launch, then at once ``dt @ dt.T``
    and its fetch (both run collectives on the same groups as the cell's ``full_tensor()``).
    Before the order was carried to the ranks, some ranks' engines ran the batch before their
    cell and others after: wrong values, or a hang that the short group timeout below turns
    into a failure within seconds."""
    _push_a_dtensor(kernel)
    kernel.ok(
        "%%mesh procs\n"
        "import datetime, torch.distributed as dist\n"
        "for group in list(dist.distributed_c10d._world.pg_map):  # the mesh's groups too\n"
        "    group.set_timeout(datetime.timedelta(seconds=10))  # a hang fails fast\n"
        "import actormesh.tensor.worker.local as local\n"
        "local.LOCAL_VALUE_WAIT = 20.0  # an engine waiting for a cell that never releases too"
    )
    kernel.ok(
        "mesh = get_ipython().find_cell_magic('mesh')\n"
        "for round in range(12):\n"
        "    job = mesh('procs --noblock', 'for _ in range(5):\\n"
        "    total = dt.full_tensor().sum().item()\\n"
        "total')\n"
        "    square = am.inspect(dt @ dt.T)  # issued while the cell may still run\n"
        "    assert torch.equal(square, x @ x.T), (round, square)\n"
        "    totals = job.get(timeout=60).values()\n"
        "    assert totals == [2016.0] * 4, (round, totals)",
        timeout=WAIT,
    )
    # A cell that raises, after touching dt or touching nothing, lets the ops after it run.
    kernel.ok(
        "for source in ['dt.full_tensor()\\nraise ValueError(rank)', 'raise KeyError(rank)']:\n"
        "    job = mesh('procs --noblock', source)\n"
        "    assert torch.equal(am.inspect(dt @ dt.T), x @ x.T), source\n"
        "    try:\n"
        "        job.get(timeout=60)\n"
        "    except Exception as failed:\n"
        "        assert 'ValueError' in str(failed) or 'KeyError' in str(failed), failed\n"
        "    else:\n"
        "        raise AssertionError(f'{source!r} did not fail')",
        timeout=WAIT,
    )
