"""An actor's inbox: its thread sleeps in a blocking receive, and other threads wake it with an
empty frame over inproc://. What it hands out, in which order, and that a wake-up is never
handled as a message."""

from __future__ import annotations

import os
import queue
import select
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import zmq

from actormesh.runtime.messaging import codec as wire
from actormesh.runtime.messaging.actor_inbox import (
    CALL_ITEM,
    NOTHING,
    STOP_ITEM,
    TASK_ITEM,
    ActorInbox,
    actor_context,
)
from actormesh.runtime.messaging.address import Address
from actormesh.runtime.messaging.protocol import BATCH, CALL, STOP_ACTOR

KEY = os.urandom(32)
WAIT = 10.0  # every wait in these tests ends by then


@pytest.fixture
def inbox(tmp_path: Any) -> Iterator[tuple[ActorInbox, zmq.Socket[Any], wire.Signer]]:
    address = Address("h", f"ipc://{tmp_path}/actor", None, wire.new_id())
    box = ActorInbox(KEY, address)
    box.open()
    push = actor_context().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(address.ipc or "")
    try:
        yield box, push, wire.Signer(KEY, wire.new_id())
    finally:
        push.close(linger=0)
        _close(box)


def _call(signer: wire.Signer, box: ActorInbox, i: int, arg: Any = None) -> list[Any]:
    assert box.address is not None
    payload, bufs = wire.dumps(((i if arg is None else arg,), {}))
    return signer.frames(box.address.mailbox, (CALL, "k", "ep", i, None), payload, bufs)


_getters: list[tuple[ActorInbox, threading.Thread]] = []


def _get_in_thread(box: ActorInbox, n: int) -> tuple[threading.Thread, queue.Queue[Any]]:
    """``n`` items taken by ``get`` on a thread of their own (the actor's, as it were), or up to
    ``None`` (the end)."""
    got: queue.Queue[Any] = queue.Queue()

    def run() -> None:
        for _ in range(n):
            item = box.get()
            got.put(item)
            if item is None:
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    _getters.append((box, thread))
    return thread, got


def _close(box: ActorInbox) -> None:
    """Close ``box``, first ending a thread a failed test left in ``get`` (a socket closed
    under a blocked receive aborts the process)."""
    for other, thread in list(_getters):
        if other is box:
            _getters.remove((other, thread))
            if thread.is_alive():
                box.put(None)
                thread.join(WAIT)
    box.close()


def test_a_put_wakes_a_thread_blocked_in_get(inbox: Any) -> None:
    box, _, _ = inbox
    thread, got = _get_in_thread(box, 2)
    box.put((TASK_ITEM, "first"))
    assert got.get(timeout=WAIT) == (TASK_ITEM, "first")
    box.put(None)  # the end of an actor's thread is an item too
    assert got.get(timeout=WAIT) is None
    thread.join(WAIT)
    assert not thread.is_alive()


def test_calls_from_the_socket_in_order_with_their_buffers(inbox: Any) -> None:
    box, push, signer = inbox
    big = torch.arange(50_000, dtype=torch.float32)
    thread, got = _get_in_thread(box, 4)
    push.send_multipart(_call(signer, box, 0), copy=False)
    push.send_multipart(_call(signer, box, 1, arg=big), copy=False)  # several frames
    push.send_multipart(_call(signer, box, 2), copy=False)
    push.send_multipart(_call(signer, box, 3), copy=False)
    items = [got.get(timeout=WAIT) for _ in range(4)]
    thread.join(WAIT)
    assert [kind for kind, _ in items] == [CALL_ITEM] * 4
    assert [msg.envelope[3] for _, msg in items] == [0, 1, 2, 3]
    ((arg,), _) = items[1][1].value()
    assert torch.equal(arg, big)


def test_an_empty_frame_from_outside_only_wakes_and_a_forged_call_is_dropped(
    inbox: Any, caplog: Any
) -> None:
    box, push, signer = inbox
    thread, got = _get_in_thread(box, 1)
    push.send(b"")  # anyone on the host may send this: it is a reason to look, nothing more
    forged = _call(wire.Signer(os.urandom(32), wire.new_id()), box, 7)
    push.send_multipart(forged, copy=False)
    push.send_multipart(_call(signer, box, 8), copy=False)
    kind, msg = got.get(timeout=WAIT)
    thread.join(WAIT)
    assert (kind, msg.envelope[3]) == (CALL_ITEM, 8)
    assert "failed authentication" in caplog.text
    assert "truncated" not in caplog.text  # the empty frame was not taken for a message
    assert box.try_get() is NOTHING


def test_handed_over_items_go_before_calls_not_yet_taken(inbox: Any) -> None:
    box, push, signer = inbox
    push.send_multipart(_call(signer, box, 0), copy=False)
    push.send_multipart(_call(signer, box, 1), copy=False)
    thread, got = _get_in_thread(box, 1)
    assert got.get(timeout=WAIT)[1].envelope[3] == 0
    thread.join(WAIT)
    box.put((TASK_ITEM, "t"))  # queued while call 1 waits (in the socket, or read already)
    assert box.get() == (TASK_ITEM, "t")
    assert box.get()[1].envelope[3] == 1


def test_batches_and_stops_come_out_as_items(inbox: Any) -> None:
    box, push, signer = inbox
    assert box.address is not None
    me = box.address.mailbox
    calls = [((CALL, "k", "ep", i, None), wire.dumps(((i,), {}))[0]) for i in (0, 1)]
    push.send_multipart(signer.frames(me, (BATCH, calls)), copy=False)
    push.send_multipart(signer.frames(me, (STOP_ACTOR, "k", 0, None)), copy=False)
    items = [box.get() for _ in range(3)]
    assert [kind for kind, _ in items] == [CALL_ITEM, CALL_ITEM, STOP_ITEM]
    assert [items[0][1].value(), items[1][1].value()] == [((0,), {}), ((1,), {})]


def test_an_event_loop_waiting_on_fds_is_woken_by_a_put(inbox: Any) -> None:
    box, push, signer = inbox
    assert box.try_get() is NOTHING  # read until empty: the FD now signals the next arrival
    poller = select.poll()
    for fd in box.fds():
        poller.register(fd, select.POLLIN)
    threading.Thread(target=box.put, args=((TASK_ITEM, "x"),), daemon=True).start()
    assert poller.poll(WAIT * 1000), "the put did not wake the loop"
    assert box.try_get() == (TASK_ITEM, "x")
    assert box.try_get() is NOTHING
    push.send_multipart(_call(signer, box, 5), copy=False)
    assert poller.poll(WAIT * 1000), "the call did not wake the loop"
    kind, msg = box.try_get()
    assert (kind, msg.envelope[3]) == (CALL_ITEM, 5)


def test_an_inbox_without_a_socket_address_still_blocks_and_wakes() -> None:
    box = ActorInbox(KEY, None)  # reached only through its process's inbox
    box.open()
    try:
        thread, got = _get_in_thread(box, 1)
        box.put((CALL_ITEM, "handed over"))
        assert got.get(timeout=WAIT) == (CALL_ITEM, "handed over")
        thread.join(WAIT)
    finally:
        _close(box)
    box.put((TASK_ITEM, "late"))  # after close: queued, nobody woken, nothing raised
