"""The order of ``%%mesh`` cells and a tensor engine's messages, decided on the controller (the
stream names the cells launched before its next message) and kept on each rank (the engine
waits for that cell to take its turn in its process): local.py, without a kernel. Cells are
played by an actor that releases a cell number, as the kernel's executor does."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import wait_until

import actormesh as am
from actormesh.tensor import distribute, fetch, inspect

WAIT = 60  # seconds: every wait here is bounded


class Cells(am.Actor):
    """What the kernel's executor does on a rank, one step at a time."""

    @am.endpoint
    def release(self, cell: int) -> None:
        from actormesh.tensor.worker.local import release_cell

        release_cell(cell)

    @am.endpoint
    def engine_waits(self) -> bool:
        """Whether a thread of this process (the engine's) waits for a cell's turn."""
        import sys
        import traceback

        return any(
            f.filename.endswith("actormesh/tensor/worker/local.py") and f.name == "wait_for_cell"
            for frame in sys._current_frames().values()
            for f in traceback.extract_stack(frame)
        )

    @am.endpoint
    def set_wait(self, seconds: float) -> None:
        import actormesh.tensor.worker.local as local

        local.LOCAL_VALUE_WAIT = seconds


def test_the_engines_next_message_waits_for_the_cell_on_its_processes(mesh: Any) -> None:
    x = torch.arange(32.0).reshape(8, 4)
    dt = distribute(x, mesh, sharding_spec=["dp", None])
    assert torch.equal(inspect(dt), x)
    cells = mesh.spawn("cells", Cells)
    stream = dt.mesh.stream
    # A cell launched on rank {dp=0, tp=0} only (a --ranks selection): its process's engine
    # waits for it; the other ranks' engines do not.
    before = stream.batches
    assert stream.cell_launched(1_000, "<cell under test>", {stream.mailboxes[0]}) == before
    reply = fetch(dt * 3)  # the batch and its fetch: one message, naming the cell
    wait_until(
        lambda: cells.engine_waits.call().get(timeout=WAIT).values() == [True, False, False, False],
        WAIT,
        "rank {dp=0, tp=0}'s engine to wait for the cell, and only that one",
    )
    assert not reply.done()
    cells.slice(dp=0, tp=0).release.call_one(1_000).get(timeout=WAIT)
    assert torch.equal(reply.get(timeout=WAIT), x * 3)
    # The stream forgot the cell once it sent its message; a cell that releases before the
    # engine's message arrives costs it no wait.
    assert stream.cells == {}
    stream.cell_launched(1_001, "<cell 2>", set(stream.mailboxes))
    cells.release.call(1_001).get(timeout=WAIT)
    assert torch.equal(inspect(dt + 1), x + 1)


def test_an_engine_that_waits_too_long_for_a_cell_names_it(spawn_procs: Any) -> None:
    procs = spawn_procs(per_host={"dp": 2})
    dt = distribute(torch.ones(4, 2), procs, sharding_spec=["dp", None])
    assert inspect(dt).sum().item() == 8
    cells = procs.spawn("cells", Cells)
    cells.set_wait.call(0.5).get(timeout=WAIT)
    stream = dt.mesh.stream
    stream.cell_launched(7, "<mesh-cell-7>", {stream.mailboxes[1]})
    with pytest.raises(am.MeshError) as failed:
        fetch(dt * 2).get(timeout=WAIT)  # its cell never comes to {dp=1}
    message = str(failed.value)
    assert "dp=1" in message and "<mesh-cell-7>" in message, message
    assert "waited 0.5 s" in message, message
