"""The table of op kinds (``tensor/wire/kinds.py``) is the truth about the tensor stream: real
programs record only ops of its shapes, from the modules it names, and the workers run each kind
with the function it names. With ``ACTORMESH_CHECK_PROTOCOL=1`` (tests/conftest.py) every op any
tensor test records is checked; the program here records every kind."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel

import actormesh as am
from actormesh import config
from actormesh.tensor import (
    activate,
    adopt,
    distribute,
    fetch,
    inspect,
    module_to_mesh,
    randn,
    rank,
    remote,
)
from actormesh.tensor.controller import packing
from actormesh.tensor.wire import kinds
from actormesh.tensor.wire.kinds import KINDS, OpKindError, check_op
from actormesh.tensor.wire.ops import IN, Ref
from actormesh.tensor.worker.handlers import HANDLERS

WAIT = 60


@remote
def halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return t * 0.5, t.sum()


@remote
def positives(t: torch.Tensor) -> torch.Tensor:
    return t[t > 0]  # data-dependent: rank 0 describes its result (remote_call, then unpack)


@remote(propagate="inspect")
def norm(t: torch.Tensor) -> float:
    local = t.to_local() if hasattr(t, "to_local") else t
    return float(local.norm())


class CellLike(am.Actor):
    """Holds a namespace as the kernel's ``%%mesh`` executor does (what ``adopt`` reads)."""

    runs_user_code = True

    def __init__(self) -> None:
        self.ns: dict[str, Any] = {}

    @am.endpoint
    def make(self, name: str) -> None:
        import torch.distributed as dist

        self.ns[name] = torch.full((2,), float(dist.get_rank()))

    @am.endpoint
    def scale(self, t: torch.Tensor, k: float) -> torch.Tensor:
        return t * k


def test_every_kind_has_its_handler_and_every_handler_its_kind() -> None:
    assert set(HANDLERS) == set(KINDS)
    for name, kind in KINDS.items():
        fn = HANDLERS[name]
        where = f"{fn.__module__.removeprefix('actormesh.tensor.')}:{fn.__qualname__}"
        assert where == kind.handler, name
        for module in kind.emitted_by:
            __import__(f"actormesh.tensor.{module}")
    assert packing.PLAIN_KINDS is kinds.PLAIN_KINDS  # the C pickler's kinds come from here


def test_an_op_unlike_its_kind_is_refused_saying_what_differs() -> None:
    good = ("aten", (3,), (1,), (((2,), torch.float32, False),),
            ("aten.neg.default", (IN,), {}, None, (1,)), "x.py:1")  # fmt: skip
    check_op(good, "controller.recording")
    general = (*good[:4], ("aten.neg.default", (Ref(1),), {}, None), good[5])
    with pytest.raises(OpKindError, match=r"payload is \(name, args, kwargs, seed, inputs\)"):
        check_op(general)
    with pytest.raises(OpKindError, match=r"recorded by controller\.remote"):
        check_op(good, "controller.remote")
    with pytest.raises(OpKindError, match="unknown op kind 'matmul'"):
        check_op(("matmul", *good[1:]))
    with pytest.raises(OpKindError, match="kind 'placements' names 1 output"):
        check_op(("placements", (4, 5), (1,), (None, None), (Ref(1),), "x.py:1"))
    with pytest.raises(OpKindError, match="field 'seed: int\\|None' got a str"):
        check_op((*good[:4], ("aten.neg.default", (IN,), {}, "7", (1,)), good[5]))


def test_programs_of_every_kind_record_only_ops_of_the_table(
    mesh: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    assert kinds.CHECK, "tests/conftest.py sets ACTORMESH_CHECK_PROTOCOL=1 before the import"
    before = Counter(kinds.seen)
    x = torch.arange(16.0).reshape(4, 4)
    dt = distribute(x, mesh, sharding_spec=["dp", None])  # distribute
    y = dt @ dt.T  # aten, general path: the first op of its signature
    y = dt @ dt.T  # aten, fast path: its plan
    z = dt + torch.ones(4)  # aten with a controller tensor: constant
    moved = dt.redistribute(sharding_spec=[None, "tp"])  # redistribute
    places = dt.placements().get(timeout=WAIT)  # placements
    r = randn(4, 2, mesh=mesh, sharding_spec=["dp", None])  # random
    monkeypatch.setattr(config, "TENSOR_SHARD_BYTES", 8)
    big = distribute(x, mesh, sharding_spec=["dp", "tp"])  # distribute_staged
    monkeypatch.undo()
    with activate(mesh):
        ones = torch.ones(2, 2)  # factory
        coords = rank(mesh, "dp")  # rank
        total = (ones * coords).reduce("dp", "sum")  # reduce
        ramp = torch.arange(-2.0, 3.0)
    half, sums = halves(dt)  # define, remote_call
    pos = positives(ramp)  # remote_call (whole), unpack
    n = norm(dt)  # remote_call, inspect
    actors = mesh.spawn("cells", CellLike)
    scaled = actors.scale.rref(ones, 3.0)  # rref, unpack
    actors.make.call("made").get(timeout=WAIT)
    passed = actors.scale.call(ones + 1, 2.0).get(timeout=WAIT)  # pin
    with activate(mesh.rename(dp="kinds_dp")):  # mesh_view (a shape no other test uses)
        view_total = torch.ones(2).reduce("kinds_dp")
    adopted = adopt(mesh, "made")  # no op: the engine takes the cell's value
    plan = {"": ColwiseParallel()}
    model = module_to_mesh(nn.Linear(4, 2), mesh, tp_plan=plan)  # module_build
    loss = model(x).sum()  # distribute (the batch, from controller.module), relayout
    loss.backward()  # grad_sync
    # link, send, recv (link: once per pair of engines, so a slice no other test sends to)
    across = dt.to_mesh(mesh.slice(dp=1), [None, "tp"])
    am.checkpoint.save({"model": model}, checkpoint_id=tmp_path / "c")  # checkpoint_save
    am.checkpoint.load({"model": model}, checkpoint_id=tmp_path / "c")  # checkpoint_load
    am.FaultTolerant({"model": model}).commit()  # snapshot
    w = distribute(x, mesh)
    for _ in range(3):  # the same run of ops three times: the second defines a program
        w = ((w * 0.5 + 1.0) * 2.0 - 1.0).abs().neg().neg().relu()
        inspect(w)  # program (the third: by reference)
    # The values are right, too: a wrong number would mean a payload read wrongly.
    assert torch.equal(inspect(y), x @ x.T)
    assert torch.equal(inspect(z), x + 1) and torch.equal(inspect(moved), x)
    assert len(places) == 2 and inspect(r).shape == (4, 2) and torch.equal(inspect(big), x)
    assert torch.equal(fetch(total, dp=1).get(timeout=WAIT), torch.ones(2, 2))
    assert torch.equal(inspect(half), x * 0.5) and inspect(sums).item() == x.sum().item()
    assert torch.equal(inspect(pos), torch.tensor([1.0, 2.0]))
    assert fetch(n, dp=1).get(timeout=WAIT) == pytest.approx(float(x[2:].norm()))
    assert torch.equal(fetch(scaled, dp=1).get(timeout=WAIT), torch.full((2, 2), 3.0))
    assert all(torch.equal(v, torch.full((2, 2), 4.0)) for v in passed.values())
    assert torch.equal(fetch(view_total, kinds_dp=1).get(timeout=WAIT), torch.full((2,), 2.0))
    assert torch.equal(fetch(adopted, dp=1, tp=1).get(timeout=WAIT), torch.full((2,), 3.0))
    assert torch.equal(inspect(adopted * 2), torch.zeros(2))  # rank 0's value
    assert model.weight.grad is not None and inspect(model.weight.grad).shape == (2, 4)
    assert inspect(loss).shape == ()
    assert torch.equal(inspect(across), x)
    assert torch.equal(inspect(w), x + 3)
    recorded = Counter(kinds.seen) - before
    # restore and allocate run only on an engine restarted by recovery: test_recovery.py
    # records them.
    missing = set(KINDS) - set(recorded) - {"restore", "allocate"}
    assert not missing, f"kinds no program here recorded: {missing}"
