"""docs/monarch.md, "Failures": what ends an actor is a supervision event, as in Monarch
(``python/tests/test_actor_error.py``): its caller and every later caller get a
``SupervisionError``, which is also the ``ActorError`` actormesh code catches; an owner whose
``__supervise__`` does not handle a failure (returns a false value, or raises) fails in turn,
and so does the endpoint it is running."""

from __future__ import annotations

import asyncio

import pytest
from support import wait_until

from actormesh import (
    Actor,
    ActorError,
    MeshFailure,
    Port,
    SupervisionError,
    context,
    endpoint,
)


class ActorFailureError(BaseException):
    """A ``BaseException`` that is not an ``Exception``: it ends the actor that raises it."""


class ErrorActor(Actor):
    @endpoint
    async def fail_with_supervision_error(self) -> None:
        raise ActorFailureError("Simulated actor failure for supervision testing")

    @endpoint
    async def check(self) -> str:
        return "this is a healthy check"


class SyncErrorActor(Actor):
    @endpoint
    def fail_with_supervision_error(self) -> None:
        raise ActorFailureError("Simulated actor failure for supervision testing")

    @endpoint
    def check(self) -> str:
        return "this is a healthy check"


def _drain(unhandled_failures: list[object], what: str) -> None:
    """The script owns the failed actor: its fault hook hears of the failure too."""
    wait_until(lambda: bool(unhandled_failures), 10, what)
    unhandled_failures.clear()


@pytest.mark.parametrize("cls", [ErrorActor, SyncErrorActor])
def test_a_base_exception_raises_supervision_error_now_and_later(
    procs, unhandled_failures, cls
) -> None:
    actor = procs.slice(gpus=0).spawn(f"error_{cls.__name__.lower()}", cls)
    assert actor.check.call_one().get(timeout=30) == "this is a healthy check"
    with pytest.raises(SupervisionError, match="Simulated actor failure") as info:
        actor.fail_with_supervision_error.call_one().get(timeout=30)
    # It keeps what an ActorError carries, and code written for actormesh still catches it.
    error = info.value
    assert isinstance(error, ActorError) and isinstance(error, RuntimeError)
    assert error.exc_type.endswith("ActorFailureError") and error.rank == "{hosts=0}"
    assert "fail_with_supervision_error" in error.remote_traceback
    with pytest.raises(SupervisionError, match="stopped"):
        actor.check.call_one().get(timeout=30)
    _drain(unhandled_failures, "the supervision event")


class ExplicitPortFailingActor(Actor):
    @endpoint(explicit_response_port=True)
    async def fail(self, port: Port[None]) -> None:
        raise Exception("This is a test exception")

    @endpoint
    async def check(self) -> str:
        return "alive"


class ExplicitPortFailingActorSync(Actor):
    @endpoint(explicit_response_port=True)
    def fail(self, port: Port[None]) -> None:
        raise Exception("This is a test exception")

    @endpoint
    def check(self) -> str:
        return "alive"


@pytest.mark.parametrize("cls", [ExplicitPortFailingActor, ExplicitPortFailingActorSync])
def test_explicit_response_port_exception_kills_actor(procs, unhandled_failures, cls) -> None:
    actor = procs.slice(gpus=1).spawn(f"explicit_{cls.__name__.lower()}", cls)
    with pytest.raises(SupervisionError, match="This is a test exception"):
        actor.fail.call_one().get(timeout=30)
    with pytest.raises(SupervisionError):
        actor.check.call_one().get(timeout=30)  # the actor died
    _drain(unhandled_failures, "the supervision event")


class AbortActor(Actor):
    @endpoint
    def abort(self, reason: str | None = None) -> None:
        context().actor_instance.abort(reason)


@pytest.mark.parametrize("reason", [None, "test abort reason"])
def test_actor_abort(procs, unhandled_failures, reason) -> None:
    actor = procs.slice(gpus=0).spawn("abort", AbortActor)
    actor.abort.call(reason).get(timeout=30)
    wait_until(lambda: bool(unhandled_failures), 10, "the abort's supervision event")
    [failure] = unhandled_failures
    unhandled_failures.clear()
    report = failure.report()  # type: ignore[attr-defined]
    assert "AbortActor" in report
    assert (reason or "no reason provided") in report and "None" not in report
    assert isinstance(failure, SupervisionError)


class Supervisor(Actor):
    """Owns ``error_actor`` on the proc mesh it is given (Monarch's ErrorActorWithSupervise)."""

    def __init__(self, child_procs, should_handle: bool = True) -> None:
        self.mesh = child_procs.spawn("error_actor", ErrorActor)
        self.should_handle = should_handle
        self.failures: list[str] = []
        self.faulted = asyncio.Event()

    @endpoint
    async def subworker_fail(self, sleep: float | None = None) -> None:
        await self.mesh.check.call()
        try:
            await self.mesh.fail_with_supervision_error.call()
        except SupervisionError:
            # __supervise__ is called at one of this endpoint's awaits.
            if sleep is not None:
                await asyncio.sleep(sleep)
            return
        raise AssertionError("the failed call should have raised SupervisionError")

    @endpoint
    async def get_failures(self) -> list[str]:
        await asyncio.wait_for(self.faulted.wait(), timeout=30)
        return self.failures

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(f"{failure.mesh_name}: {failure.report()}")
        self.faulted.set()
        return self.should_handle


class AsyncSupervisor(Supervisor):
    """``async def __supervise__``: awaited on the loop the endpoints run on."""

    def __init__(self, child_procs, should_handle: bool = True) -> None:
        super().__init__(child_procs, should_handle)
        self.endpoint_loop: int | None = None
        self.supervise_loop: int | None = None

    @endpoint
    async def record_endpoint_loop(self) -> None:
        self.endpoint_loop = id(asyncio.get_running_loop())

    @endpoint
    async def loops(self) -> tuple[int | None, int | None]:
        return self.endpoint_loop, self.supervise_loop

    async def __supervise__(self, failure: MeshFailure) -> bool:  # type: ignore[override]
        await asyncio.sleep(0)
        self.supervise_loop = id(asyncio.get_running_loop())
        self.failures.append(f"{failure.mesh_name}: {failure.report()}")
        self.faulted.set()
        return self.should_handle


def test_async_supervise_is_awaited_on_the_endpoints_loop(procs) -> None:
    supervisor = procs.slice(gpus=0).spawn("async_supervisor", AsyncSupervisor, procs.slice(gpus=1))
    supervisor.record_endpoint_loop.call_one().get(timeout=30)
    supervisor.subworker_fail.call_one().get(timeout=30)
    failures = supervisor.get_failures.call_one().get(timeout=40)
    assert failures and all(f.startswith("error_actor: ") for f in failures)
    endpoint_loop, supervise_loop = supervisor.loops.call_one().get(timeout=30)
    assert supervise_loop is not None and supervise_loop == endpoint_loop
    # Handled (it returned True): nothing reached the fault hook (the fixture checks).


class SlowAsyncSupervisor(Supervisor):
    """Its ``__supervise__`` still awaits when the endpoint it came in at returns."""

    def __init__(self, child_procs) -> None:
        super().__init__(child_procs)
        self.started = asyncio.Event()

    @endpoint
    async def fail_child_until_supervised(self) -> None:
        try:
            await self.mesh.fail_with_supervision_error.call()
        except SupervisionError:
            await asyncio.wait_for(self.started.wait(), timeout=30)  # then return at once

    async def __supervise__(self, failure: MeshFailure) -> bool:  # type: ignore[override]
        self.started.set()
        await asyncio.sleep(0.5)
        self.failures.append(f"{failure.mesh_name}: {failure.report()}")
        self.faulted.set()
        return True


def test_async_supervise_runs_to_its_end_after_the_endpoint_returns(procs) -> None:
    supervisor = procs.slice(gpus=0).spawn(
        "slow_supervisor", SlowAsyncSupervisor, procs.slice(gpus=1)
    )
    supervisor.fail_child_until_supervised.call_one().get(timeout=30)
    failures = supervisor.get_failures.call_one().get(timeout=40)
    assert failures and failures[0].startswith("error_actor: ")


@pytest.mark.parametrize("cls", [Supervisor, AsyncSupervisor])
def test_supervise_callback_unhandled(procs, unhandled_failures, cls) -> None:
    """Returning a false value fails the owner: the endpoint that runs as the failure arrives
    fails with SupervisionError (here it would sleep 30 s), and so do later calls."""
    supervisor = procs.slice(gpus=0).spawn(
        f"unhandled_{cls.__name__.lower()}", cls, procs.slice(gpus=1), False
    )
    with pytest.raises(SupervisionError, match="error_actor") as info:
        supervisor.subworker_fail.call_one(sleep=30).get(timeout=20)
    assert "Simulated actor failure" in str(info.value)
    with pytest.raises(SupervisionError):
        supervisor.get_failures.call_one().get(timeout=20)
    _drain(unhandled_failures, "the failed supervisor's own supervision event")


class RaisingSyncSupervisor(Supervisor):
    SUPERVISE_MESSAGE = "boom from sync supervise"

    def __supervise__(self, failure: MeshFailure) -> bool:
        raise RuntimeError(self.SUPERVISE_MESSAGE)


class RaisingAsyncSupervisor(Supervisor):
    SUPERVISE_MESSAGE = "boom from async supervise"

    async def __supervise__(self, failure: MeshFailure) -> bool:  # type: ignore[override]
        await asyncio.sleep(0)
        raise RuntimeError(self.SUPERVISE_MESSAGE)


@pytest.mark.parametrize("cls", [RaisingSyncSupervisor, RaisingAsyncSupervisor])
def test_supervise_callback_raising(procs, unhandled_failures, cls) -> None:
    supervisor = procs.slice(gpus=0).spawn(
        f"raising_{cls.__name__.lower()}", cls, procs.slice(gpus=1)
    )
    with pytest.raises(SupervisionError) as info:
        supervisor.subworker_fail.call_one(sleep=30).get(timeout=20)
    report = str(info.value)
    assert cls.SUPERVISE_MESSAGE in report and "Simulated actor failure" in report
    _drain(unhandled_failures, "the failed supervisor's own supervision event")
