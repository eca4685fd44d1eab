"""``controller/constants.py``'s pool of small controller tensors, found by their contents, on a
stand-in stream (no mesh)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from actormesh.tensor.controller import constants


class _Stream:
    """What ``constants`` uses of a ``Stream``."""

    def __init__(self) -> None:
        self.consts: dict[int, Any] = {}
        self.pool = constants.Pool()
        self.ops: list[Any] = []
        self.dead: list[int] = []
        self._next = 0

    def new_id(self) -> int:
        self._next += 1
        return self._next

    def record(self, op: Any) -> None:
        self.ops.append(op)

    def died(self, id: int) -> None:
        self.dead.append(id)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA controller tensor")
def test_a_small_tensor_on_a_gpu_is_found_by_its_contents() -> None:
    # A GPU mesh's MeshTensors are on cuda:0, so a forward's small tensors (GPT-2's positions)
    # are made there on the controller: before, reading their bytes through numpy raised.
    stream: Any = _Stream()
    a, b, c = (torch.arange(4.0, device="cuda") for _ in range(3))
    ids = [constants.upload(stream, x, read_only=True) for x in (a, b, c)]
    assert ids[1] == ids[2] and [op[0] for op in stream.ops] == ["constant"] * 2


def test_contents_enter_the_pool_the_second_time_they_are_seen() -> None:
    # The first tensor with some contents gets a copy of its own (dropped with it: contents
    # seen once, a training loop's random targets, are not kept on the workers); the next ones
    # share the pool's.
    stream: Any = _Stream()
    tensors = [torch.arange(4.0) for _ in range(3)] + [torch.arange(4)]
    ids = [constants.upload(stream, x, read_only=True) for x in tensors]
    assert len(set(ids)) == 3 and ids[1] == ids[2] and len(stream.ops) == 3
    assert ids[1] in stream.pool.ids and ids[0] not in stream.pool.ids
    del tensors
    assert sorted(stream.dead) == [ids[0], ids[3]]  # the copies of their own went with them
