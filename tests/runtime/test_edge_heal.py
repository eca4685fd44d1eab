"""A healed rank is a new incarnation: messages signed for its previous life are replays."""

from __future__ import annotations

import os
import pickle
import signal

import zmq
from support import wait_until

import actormesh as am
from actormesh.runtime.messaging.codec import Signer, new_id
from actormesh.runtime.messaging.protocol import shape_state
from actormesh.runtime.procs.controller import get_controller


class Tally(am.Actor):
    def __init__(self) -> None:
        self.value = 0
        self.marks = 0

    @am.endpoint
    def incr(self) -> None:
        self.value += 1

    @am.endpoint
    def mark(self) -> None:
        self.marks += 1

    @am.endpoint
    def state(self) -> tuple[int, int]:
        return self.value, self.marks

    @am.endpoint
    def pid(self) -> int:
        return os.getpid()


def test_a_healed_rank_drops_replays_of_messages_sent_to_its_previous_life(
    spawn_procs, unhandled_failures
) -> None:
    procs = spawn_procs(per_host={"gpus": 2})
    tally = procs.spawn("tally", Tally)
    target = tally.slice(gpus=0)
    state = shape_state(target._shape)
    payload = pickle.dumps(((), {}))
    signer = Signer(get_controller().key, new_id())  # a sender whose frames get recorded
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    try:
        old = procs._procs.addresses[0]
        sock.connect(old.ipc)
        recorded = signer.frames(old.mailbox, ("call", tally._key, "incr", state, None), payload)
        sock.send_multipart(recorded)
        wait_until(lambda: target.state.call_one().get(timeout=10) == (1, 0), 10, "the incr")

        os.kill(target.pid.call_one().get(timeout=10), signal.SIGKILL)
        wait_until(lambda: procs.health().values()[0] != "alive", 10, "the death")
        procs.heal().get(timeout=30)
        unhandled_failures.clear()  # the kill, which no call observed
        assert target.state.call_one().get(timeout=10) == (0, 0)

        sock.send_multipart(recorded)  # the replay, to the same socket path
        new = procs._procs.addresses[0]
        fresh = signer.frames(new.mailbox, ("call", tally._key, "mark", state, None), payload)
        sock.send_multipart(fresh)  # after the replay on the same connection: handled after it
        wait_until(lambda: target.state.call_one().get(timeout=10)[1] == 1, 10, "the mark")
        assert target.state.call_one().get(timeout=10) == (0, 1)  # the replay did nothing
    finally:
        sock.close(linger=1000)
        ctx.term()


def test_handles_held_by_actors_follow_a_healed_rank(spawn_procs, unhandled_failures) -> None:
    procs = spawn_procs(per_host={"gpus": 2})
    tally = procs.spawn("tally2", Tally)

    class Caller(am.Actor):
        def __init__(self, other: am.ActorMesh) -> None:  # type: ignore[type-arg]
            self.other = other

        @am.endpoint
        def poke(self) -> tuple[int, int]:
            self.other.slice(gpus=0).incr.call_one().get(timeout=10)
            return self.other.slice(gpus=0).state.call_one().get(timeout=10)

    caller = procs.slice(gpus=1).spawn("caller", Caller, tally)
    assert caller.poke.call_one().get(timeout=10) == (1, 0)
    os.kill(tally.slice(gpus=0).pid.call_one().get(timeout=10), signal.SIGKILL)
    wait_until(lambda: procs.health().values()[0] != "alive", 10, "the death")
    procs.heal().get(timeout=30)
    unhandled_failures.clear()
    assert caller.poke.call_one().get(timeout=10) == (1, 0)
    assert tally.slice(gpus=0).state.call_one().get(timeout=10) == (1, 0)
