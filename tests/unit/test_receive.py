"""Reading a socket until it is empty: with and without a wake-up that promised a message."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import zmq

from actormesh.runtime.messaging import codec as wire
from actormesh.runtime.messaging import receive

KEY = os.urandom(32)


@pytest.fixture
def pair(tmp_path: Any) -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any]]]:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    push = ctx.socket(zmq.PUSH)
    endpoint = f"ipc://{tmp_path}/inbox"
    pull.bind(endpoint)
    push.connect(endpoint)
    try:
        yield push, pull
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()


def _wait_readable(sock: zmq.Socket[Any]) -> None:
    assert sock.poll(10_000), "no message within 10 s"


def test_a_wake_up_without_a_message_reads_nothing(pair: Any) -> None:
    _, pull = pair
    verifier = wire.Verifier(KEY, wire.new_id())
    assert list(receive.receive(pull, verifier, woken=True)) == []
    assert list(receive.receive(pull, verifier)) == []


def test_a_woken_read_takes_every_waiting_message_with_its_buffers(pair: Any) -> None:
    push, pull = pair
    me = wire.new_id()
    signer, verifier = wire.Signer(KEY, wire.new_id()), wire.Verifier(KEY, me)
    big = torch.arange(100_000, dtype=torch.float32)
    payload, buffers = wire.dumps(big)
    for i in range(3):
        frames = signer.frames(me, ("call", i), payload, buffers)
        push.send_multipart(frames, copy=False)
    _wait_readable(pull)
    got = []
    while len(got) < 3:  # the three may not all have arrived when the first is read
        got += receive.receive(pull, verifier, woken=True)
        if len(got) < 3:
            _wait_readable(pull)
    assert [m.envelope for m in got] == [("call", 0), ("call", 1), ("call", 2)]
    assert all(torch.equal(m.value(), big) for m in got)
    assert list(receive.receive(pull, verifier)) == []
