"""Failures on the workers (TENSORS.md §3 and §8 tests 4, 5): poisoned values carry the original
failure, stand-ins keep healthy ranks out of a hung collective, the mesh stays usable."""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

import pytest
import torch

import actormesh as am
from actormesh.tensor import RemoteTensorError, distribute, fetch, inspect

WAIT = 60


@am.remote(propagate=lambda t: t)
def boom_on_rank3(t: Any) -> Any:
    import torch.distributed as dist

    if dist.get_rank() == 3:
        raise ValueError("boom on rank 3")
    return t * 1


@am.remote(propagate=lambda t: t)
def same(t: Any) -> Any:
    return t * 1


@am.remote(propagate=lambda t: t)
def always_fails(t: Any) -> Any:
    raise KeyError("no such key on any rank")


def test_error_one_rank(mesh: Any) -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 8)
    a = distribute(x, mesh, sharding_spec=["dp", None])
    # Warm: the first ops of a new engine (and of each kind) take seconds on a loaded host; the
    # 5 s below is about not hanging, not about start-up.
    assert torch.allclose(inspect(same(a) @ a.T + 1), x @ x.T + 1, atol=1e-5)
    line = sys._getframe().f_lineno + 1
    bad = boom_on_rank3(a)
    dep = bad @ bad.T  # a collective (all_gather) in which rank 3 has only a stand-in
    ok = a + 1
    healthy = a @ a.T
    start = time.monotonic()
    assert torch.allclose(fetch(ok).get(timeout=5), x + 1)
    assert torch.allclose(fetch(healthy).get(timeout=5), x @ x.T, atol=1e-5)
    assert time.monotonic() - start < 5
    with pytest.raises(RemoteTensorError) as info:
        fetch(dep).get(timeout=5)
    err = info.value
    assert isinstance(err, am.ActorError)
    assert err.rank == "{dp=1, tp=1}" and err.ranks == ["{dp=1, tp=1}"]
    assert "boom_on_rank3" in err.op  # the original failure, not the matmul that depended on it
    assert 'raise ValueError("boom on rank 3")' in err.remote_traceback
    assert err.site == f"{__file__}:{line}"
    assert err.site in str(err) and "boom on rank 3" in str(err)
    # Fetching rank 0's shard of the failed value raises too: rank 3 reports its failure.
    with pytest.raises(RemoteTensorError, match="boom on rank 3"):
        fetch(dep, dp=0, tp=0).get(timeout=5)
    # The mesh is still usable, collectives included.
    assert torch.allclose(inspect(a @ a.T), x @ x.T, atol=1e-5)


def test_failure_everywhere_is_one_traceback_and_dependents_inherit_it(mesh: Any) -> None:
    a = distribute(torch.ones(4, 4), mesh, sharding_spec=["dp", "tp"])
    dependent = (always_fails(a) + 1).sum()  # ops after the failure, a collective in sum
    with pytest.raises(RemoteTensorError) as info:
        dependent.item()
    err = info.value
    assert len(err.failures) == 4 and len(err.groups()) == 1
    assert str(err).count("Remote traceback") == 1
    assert "always_fails" in err.op and err.exc_type == "KeyError"
    assert inspect(a.sum()).item() == 16.0


def test_failure_nobody_fetches_reaches_the_fault_hook(
    mesh: Any, unhandled_failures: list[object]
) -> None:
    a = distribute(torch.ones(4, 4), mesh)
    bad = always_fails(a)
    del bad
    gc.collect()
    assert inspect(a * 2).sum().item() == 32.0  # the next sync point reports it
    assert len(unhandled_failures) == 1
    err = unhandled_failures[0]
    assert isinstance(err, RemoteTensorError) and len(err.failures) == 4
    assert "always_fails" in err.op
    unhandled_failures.clear()
