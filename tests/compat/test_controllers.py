"""docs/monarch.md: ``get_or_spawn_controller`` and ``as_endpoint``."""

from __future__ import annotations

import os

import pytest

from actormesh import (
    Actor,
    as_endpoint,
    current_actor_name,
    endpoint,
    get_or_spawn_controller,
    this_host,
)


class Registry(Actor):
    def __init__(self) -> None:
        self.names: list[str] = []

    @endpoint
    def sign_up(self, name: str) -> int:
        self.names.append(name)
        return len(self.names)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Registrant(Actor):
    @endpoint
    def register_me(self) -> int:
        registry = get_or_spawn_controller("registry", Registry).get()
        return registry.sign_up.call_one(current_actor_name()).get()

    @endpoint
    async def register_child(self) -> int:
        # A worker that spawns procs is a controller too: its child asks through it.
        async with this_host().spawn_procs(per_host={"gpus": 1}) as child_procs:
            child = child_procs.spawn("child", Registrant)
            return await child.register_me.call_one()


def test_get_or_spawn_controller() -> None:
    registry = get_or_spawn_controller("registry", Registry).get()
    assert registry.pid.call_one().get() == os.getpid()  # it lives in the controller
    # Its own procs: a rank that spawned procs keeps its host's agent until it stops.
    with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        registrants = procs.spawn("registrants", Registrant)
        assert sorted(registrants.register_me.call().get(timeout=30).values()) == [1, 2]
        assert registrants.slice(gpus=0).register_child.call_one().get(timeout=60) == 3
    again = get_or_spawn_controller("registry", Registry).get()
    assert again.sign_up.call_one("controller").get() == 4


class Plain(Actor):
    def double(self, x: int) -> int:
        return 2 * x


def test_as_endpoint(procs) -> None:
    plain = procs.spawn("plain", Plain)
    assert as_endpoint(plain.double).call(3).get().values() == [6, 6]
    with pytest.raises(TypeError):
        plain.double(3)  # not an endpoint
