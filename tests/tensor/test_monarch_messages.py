"""MeshTensors passed to ``spawn(...)`` and to endpoint calls, temporaries included, inside and
outside ``activate()``, on 4 real ranks (gloo): each actor gets its rank's value, read after the
ops issued before the call, however soon the controller drops the MeshTensor; and every rank
lets it go once its actor read it (or at once, when no actor of that rank reads it)."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
import torch

import actormesh as am
from actormesh.tensor import distribute, live

WAIT = 60


class Counter(am.Actor):
    def __init__(self, start: torch.Tensor) -> None:
        self.total = start.double().clone()

    @am.endpoint
    def incr(self, by: torch.Tensor) -> float:
        self.total = self.total + by.double().sum()
        return float(self.total)

    @am.endpoint
    def value(self) -> float:
        return float(self.total)


def settled(mesh: Any) -> list[int]:
    gc.collect()
    return live(mesh).values()


def test_temporaries_reach_spawn_and_endpoints(mesh: Any) -> None:
    baseline = settled(mesh)
    with mesh.activate():
        # A temporary per rank: 10 * (2 * dp + tp), gone on the controller once pickled.
        counters = mesh.spawn("counters", Counter, mesh.rank(("dp", "tp")) * 10.0)
        first = counters.incr.call(torch.ones(())).get(timeout=WAIT)
        second = counters.incr.call(torch.ones(2, 2)).get(timeout=WAIT)
    assert first.values() == [1.0, 11.0, 21.0, 31.0]
    assert second.values() == [5.0, 15.0, 25.0, 35.0]
    with mesh.activate():
        t = torch.full((3,), 2.0)
    # Outside activate(): a per-rank temporary and a global one (each rank gets its shard).
    third = counters.incr.call(t * 2).get(timeout=WAIT)
    assert third.values() == [17.0, 27.0, 37.0, 47.0]
    x = torch.arange(8.0).reshape(4, 2)
    fourth = counters.incr.call(distribute(x, mesh, sharding_spec=["dp", None]) + 1).get(
        timeout=WAIT
    )
    # dp=0 holds rows 0-1 (+1: sum 10), dp=1 rows 2-3 (+1: sum 26)
    assert fourth.values() == [27.0, 37.0, 63.0, 73.0]
    del t
    counters.stop().get(timeout=WAIT)
    assert settled(mesh) == baseline  # every rank let its pins go


def test_a_call_to_some_ranks_pins_only_there(mesh: Any) -> None:
    counters = mesh.spawn("some", Counter, torch.zeros(()))
    counters.initialized.get(timeout=WAIT)
    baseline = settled(mesh)
    with mesh.activate():
        one = counters.slice(dp=1, tp=0).incr.call_one(torch.full((), 5.0)).get(timeout=WAIT)
        counters.incr.broadcast(torch.ones(()))  # fire and forget, still read in order
    assert one == 5.0
    assert counters.value.call().get(timeout=WAIT).values() == [1.0, 1.0, 6.0, 1.0]
    assert settled(mesh) == baseline
    counters.stop().get(timeout=WAIT)


def test_unsent_and_failed_values(mesh: Any) -> None:
    counters = mesh.spawn("failing", Counter, torch.zeros(()))
    counters.initialized.get(timeout=WAIT)
    baseline = settled(mesh)
    with mesh.activate():
        with pytest.raises(TypeError):  # a lock cannot be pickled: nothing is sent
            counters.incr.call(torch.ones(()), threading.Lock())
        bad = torch.ones(2)[torch.tensor([5])]  # fails on every rank
        with pytest.raises(am.ActorError, match="out of bounds"):
            counters.incr.call(bad).get(timeout=WAIT)
        del bad
    assert counters.value.call().get(timeout=WAIT).values() == [0.0] * 4
    assert settled(mesh) == baseline
    counters.stop().get(timeout=WAIT)
