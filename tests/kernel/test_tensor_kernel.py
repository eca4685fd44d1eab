"""Distributed tensors in the actormesh kernel (issue 19; TENSORS.md §5, §8 tests 7-8), through
one real kernel: the op stream is sent after every cell, ``%mesh push`` hands each rank its
DTensor, ``%mesh dbg inspect`` summarises shards on the ranks and flags the odd ones, and the
sidebar shows a rank busy in the tensor engine with the op it runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_support import Kernel
from panel_support import Panel, ranks_of

pytest.importorskip("torch")

WAIT = 120  # forming the process group and the engines on a loaded 2-core machine


def test_kernel_mesh_tensor(panel_kernel: tuple[Kernel, Panel], tmp_path: Path) -> None:
    kernel, panel = panel_kernel
    # The kernel does not load the tensor layer (nor torch) until a notebook uses it.
    kernel.ok("import sys\nassert 'actormesh.tensor' not in sys.modules, sorted(sys.modules)")
    kernel.ok(
        "import torch, actormesh as am\n"
        "import actormesh.tensor.stream as stream\n"
        "stream.IDLE_FLUSH = 3600.0  # no idle flush: only the end of the cell sends the ops\n"
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
