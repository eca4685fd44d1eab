"""Checked by mypy in test_typing.py, never run: typed endpoint calls on an ``ActorMesh[T]``.

A line that must fail ends with ``# E: <mypy error code>``; every other line must pass. Not
named ``test_*``, so pytest does not collect it.
"""

from __future__ import annotations

from typing import Any

import actormesh as am
from actormesh.runtime.actors.future import Future
from actormesh.runtime.meshes.actor_mesh import ActorMesh
from actormesh.runtime.meshes.collect import Stream
from actormesh.runtime.meshes.value_mesh import ValueMesh


class Trainer(am.Actor):
    @am.endpoint
    def step(self, lr: float, *, momentum: float = 0.9) -> int:
        return 0

    @am.endpoint()
    async def evaluate(self, batch: int) -> str:
        return str(batch)

    @am.endpoint
    def anything(self, name: str) -> Any:
        return name

    def helper(self) -> None:
        pass

    @am.endpoint(explicit_response_port=True)
    def answer(self, port: am.Port, x: int) -> None:
        port.send(x)


def correct(mesh: ActorMesh[Trainer]) -> None:
    losses: Future[ValueMesh[int]] = mesh.step.call(lr=0.1)
    one: Future[int] = mesh.slice(gpus=0).step.call_one(0.1, momentum=0.5)
    chosen: Future[int] = mesh.step.choose(1.0)
    mesh.step.broadcast(0.1)
    replies: Stream[int] = mesh.step.stream(lr=0.2)
    text: Future[str] = mesh.evaluate.call_one(3)  # an async endpoint gives what it returns
    mesh.anything.call_one("x")
    ready: Future[ValueMesh[None]] = mesh.initialized  # the mesh's own, not endpoints
    stopped: Future[None] = mesh.stop()
    mesh.answer.call_one(1)  # the port is the runtime's to pass
    del losses, one, chosen, replies, text, ready, stopped


def wrong(mesh: ActorMesh[Trainer]) -> None:
    mesh.step.call(lr="fast")  # E: arg-type
    mesh.step.call(rate=0.1)  # E: call-arg
    mesh.step.call_one()  # E: call-arg
    mesh.evaluate.broadcast("3")  # E: arg-type
    not_int: Future[str] = mesh.step.call_one(0.1)  # E: assignment
    mesh.helper.call()  # E: attr-defined
    mesh.stepp.call(0.1)  # E: attr-defined
    mesh.anything.call_one(1)  # E: arg-type
    mesh.answer.call_one("1")  # E: arg-type
    del not_int


def inside_the_actor(trainer: Trainer) -> None:
    # On an instance an endpoint is the plain method.
    n: int = trainer.step(0.1)
    trainer.step("x")  # E: arg-type
    del n
