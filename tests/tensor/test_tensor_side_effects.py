"""Failures of ops that work by side effect (TENSORS.md §3): an op with no outputs, or one that
writes into its arguments, poisons what it changed, so that the failure surfaces at the next sync
point that reads it (naming the ranks, the op, the remote traceback and the issuing line), not at
the fault hook; one that no sync point reads still reaches the fault hook."""

from __future__ import annotations

import gc
import sys
from typing import Any

import pytest
import torch

import actormesh as am
from actormesh.tensor import RemoteTensorError, distribute, fetch, inspect

WAIT = 60
ALL_RANKS = ["{dp=0, tp=0}", "{dp=0, tp=1}", "{dp=1, tp=0}", "{dp=1, tp=1}"]


def line_after() -> int:
    return sys._getframe(1).f_lineno + 1


def test_cholesky_of_a_matrix_that_is_not_positive_definite(
    mesh: Any, unhandled_failures: list[object]
) -> None:
    # torch.linalg.cholesky records linalg_cholesky_ex, then an error check with no outputs:
    # the check fails on the workers, and the factor the user holds carries its failure.
    a = distribute(-torch.eye(4), mesh)
    line = line_after()
    factor = torch.linalg.cholesky(a)
    with pytest.raises(RemoteTensorError) as info:
        inspect(factor)
    err = info.value
    assert isinstance(err, am.ActorError)
    assert err.ranks == ALL_RANKS and len(err.groups()) == 1
    assert err.op == "aten._linalg_check_errors.default"
    assert "not positive-definite" in str(err)
    assert "_LinAlgError" in err.remote_traceback
    assert err.site == f"{__file__}:{line}"
    # Reading it again raises the same failure; values that do not depend on it are fine.
    with pytest.raises(RemoteTensorError, match="not positive-definite"):
        (factor @ factor.T).sum().item()
    assert inspect(a.sum()).item() == -4.0
    good = torch.linalg.cholesky(distribute(4 * torch.eye(3), mesh))
    assert torch.equal(inspect(good), 2 * torch.eye(3))
    assert unhandled_failures == []


def test_cholesky_failing_on_one_rank_then_a_collective(
    mesh: Any, unhandled_failures: list[object]
) -> None:
    with mesh.activate():
        r = am.tensor.rank(mesh, ("dp", "tp"))
        m = torch.eye(3) * (1.0 - 2.0 * (r == 3))  # not positive-definite on rank 3 only
        line = line_after()
        factor = torch.linalg.cholesky(m)
        total = factor.reduce(("dp", "tp"), "sum")  # every rank takes part: no hang
        fine = m.reduce(("dp", "tp"), "sum")
    with pytest.raises(RemoteTensorError) as info:
        fetch(total).get(timeout=WAIT)
    err = info.value
    assert err.ranks == ["{dp=1, tp=1}"]
    assert err.op == "aten._linalg_check_errors.default" and err.site == f"{__file__}:{line}"
    assert torch.equal(fetch(fine).get(timeout=WAIT), torch.eye(3) * 2)
    assert unhandled_failures == []


@am.remote(propagate=lambda t: None)
def scribble_then_fail_on_rank2(t: Any) -> None:
    import torch.distributed as dist

    t.to_local().fill_(7.0)
    if dist.get_rank() == 2:
        raise ValueError("scribble failed on rank 2")


def test_function_without_outputs_poisons_its_arguments(
    mesh: Any, unhandled_failures: list[object]
) -> None:
    b = distribute(torch.ones(4, 4), mesh, sharding_spec=["dp", None])
    untouched = distribute(torch.ones(4, 4), mesh, sharding_spec=["dp", None])
    line = line_after()
    assert scribble_then_fail_on_rank2(b) is None  # a side effect only: nothing to hand back
    after = (b * 2) @ b.T  # a collective over the written value: rank 2 still takes part
    with pytest.raises(RemoteTensorError) as info:
        fetch(after).get(timeout=WAIT)
    err = info.value
    assert err.ranks == ["{dp=1, tp=0}"]
    assert "scribble_then_fail_on_rank2" in err.op and err.site == f"{__file__}:{line}"
    assert 'raise ValueError("scribble failed on rank 2")' in err.remote_traceback
    with pytest.raises(RemoteTensorError, match="scribble failed on rank 2"):
        inspect(b, dp=0, tp=0)  # rank 2 reports the failure whichever rank's shard is read
    assert torch.equal(inspect(untouched @ untouched.T), torch.full((4, 4), 4.0))
    assert unhandled_failures == []


def test_failed_in_place_op_poisons_its_target(mesh: Any, unhandled_failures: list[object]) -> None:
    index = distribute(torch.tensor([0, 9]), mesh)  # 9 is out of range: only the data says so
    d = distribute(torch.zeros(4, 4), mesh, sharding_spec=[None, "tp"])
    line = line_after()
    d.index_fill_(0, index, 1.0)
    e = d + 1
    with pytest.raises(RemoteTensorError) as info:
        inspect(e)
    err = info.value
    assert err.ranks == ALL_RANKS
    assert err.op == "aten.index_fill_.int_Scalar" and err.site == f"{__file__}:{line}"
    assert "out of range" in str(err) or "out of bounds" in str(err), str(err)
    assert unhandled_failures == []


def test_failure_in_place_inherited_by_a_list_op_without_outputs(
    mesh: Any, unhandled_failures: list[object]
) -> None:
    # _foreach_add_ returns nothing and writes into its first list: run on a poisoned input,
    # it passes the original failure on to what it wrote, and not to what it only read.
    index = distribute(torch.tensor([7]), mesh)
    bad = distribute(torch.zeros(4), mesh)
    line = line_after()
    bad.index_fill_(0, index, 1.0)
    target, other = distribute(torch.ones(4), mesh), distribute(torch.ones(4), mesh)
    torch._foreach_add_([target], [bad])
    torch._foreach_add_([other], [target])
    with pytest.raises(RemoteTensorError) as info:
        inspect(other)
    assert info.value.op == "aten.index_fill_.int_Scalar"
    assert info.value.site == f"{__file__}:{line}"
    fine = distribute(torch.ones(4), mesh)
    torch._foreach_add_([fine], [fine])
    assert torch.equal(inspect(fine), torch.full((4,), 2.0))
    assert unhandled_failures == []


def test_side_effect_failure_nobody_reads_reaches_the_fault_hook(
    mesh: Any, unhandled_failures: list[object]
) -> None:
    a = distribute(-torch.eye(2), mesh)
    factor = torch.linalg.cholesky(a)
    del factor, a
    gc.collect()
    assert inspect(distribute(torch.ones(2), mesh).sum()).item() == 2.0  # the next sync point
    assert len(unhandled_failures) == 1
    err = unhandled_failures[0]
    assert isinstance(err, RemoteTensorError) and err.op == "aten._linalg_check_errors.default"
    unhandled_failures.clear()
