"""The ``Counter`` actor of Monarch's ``python/tests/test_python_actors.py``, which several of
its tests use."""

from __future__ import annotations

from actormesh import Actor, endpoint


class Counter(Actor):
    def __init__(self, v: int) -> None:
        self.v = v

    @endpoint
    async def incr(self) -> None:
        self.v += 1

    @endpoint
    async def value(self) -> int:
        return self.v
