"""The shared-memory lane (runtime/messaging/shm_lane.py) in one process: slots filled, read and
reused, the pool's limits, what a reader refuses, and that nothing is left in /dev/shm."""

from __future__ import annotations

import glob
import os
import pickle
import threading

import numpy
import pytest
import torch

from actormesh.runtime.messaging import shm_lane
from actormesh.runtime.messaging.codec import Signer, Verifier, WireError, dumps, new_id, new_key

MB = 1 << 20


@pytest.fixture
def lane():
    lane = shm_lane.SendLane(new_id())
    yield lane
    lane.close(linger=0)
    assert glob.glob(slot_glob(lane)) == []


def slot_glob(lane: shm_lane.SendLane) -> str:
    return f"/dev/shm/actormesh-{lane.mailbox.hex()}-{lane.pid}-lane*"


def slot_of(descriptor: bytes | None) -> tuple[object, ...]:
    """Which slot a message is in (a descriptor also names the slot's filling)."""
    assert descriptor is not None
    return shm_lane.DESCRIPTOR.unpack(descriptor)[:4]


def buffers_of(*tensors: torch.Tensor) -> list[pickle.PickleBuffer]:
    _, buffers = dumps(tensors)
    return buffers


def test_buffers_come_out_as_they_went_in_and_the_slot_is_free_again(lane) -> None:
    a, b = torch.arange(MB // 4, dtype=torch.float32), torch.full((300_000,), 7, dtype=torch.int8)
    sent = buffers_of(a, b)
    descriptor = lane.put(sent)
    assert descriptor is not None and lane.unread() == 1
    got = shm_lane.read(descriptor, [memoryview(x).nbytes for x in sent])
    assert lane.unread() == 0
    assert torch.equal(torch.frombuffer(got[0], dtype=torch.float32), a)
    assert torch.equal(torch.frombuffer(got[1], dtype=torch.int8), b)
    a.fill_(0)  # the receiver's copy is its own, not the slot's or the sender's memory
    assert torch.frombuffer(got[0], dtype=torch.float32)[5] == 5
    # The next message reuses the slot it freed.
    assert slot_of(lane.put(buffers_of(a))) == slot_of(descriptor)
    assert len(glob.glob(slot_glob(lane))) == 1


def test_an_unread_slot_is_not_refilled_and_the_pool_has_a_limit(lane) -> None:
    t = torch.zeros(3 * MB // 4)  # 3 MiB: a slot of 4 MiB
    descriptors = [lane.put(buffers_of(t)) for _ in range(shm_lane.POOL_BYTES // (4 * MB) - 1)]
    assert None not in descriptors and len(set(descriptors)) == len(descriptors)
    assert lane.put(buffers_of(t)) is None  # every slot unread, no room for another: the socket
    shm_lane.read(descriptors[3], [3 * MB])
    assert slot_of(lane.put(buffers_of(t))) == slot_of(descriptors[3])


def test_too_small_too_large_or_scattered_buffers_keep_to_the_socket(lane) -> None:
    assert lane.put(buffers_of(torch.zeros(shm_lane.LANE_MIN // 4 - 64))) is None
    assert lane.put(buffers_of(torch.zeros(shm_lane.LANE_MAX // 4 + 1))) is None
    assert lane.put([numpy.zeros(1 << 18)[::2]]) is None  # not contiguous: ZeroMQ's to send
    assert glob.glob(slot_glob(lane)) == []


def test_a_slot_released_unsent_is_free_again(lane) -> None:
    descriptor = lane.put(buffers_of(torch.zeros(MB // 4)))
    assert descriptor is not None
    lane.release(descriptor)
    assert lane.unread() == 0


def test_close_waits_for_an_unread_slot_then_removes_every_file() -> None:
    lane = shm_lane.SendLane(new_id())
    first = lane.put(buffers_of(torch.ones(MB // 4)))
    second = lane.put(buffers_of(torch.ones(MB // 2)))
    assert first is not None and second is not None
    shm_lane.read(first, [MB])
    closed = threading.Event()
    closer = threading.Thread(target=lambda: (lane.close(linger=30), closed.set()))
    closer.start()
    assert not closed.wait(0.2)  # the second slot is still unread
    got = shm_lane.read(second, [2 * MB])
    assert numpy.all(got[0].view(numpy.float32) == 1)
    assert closed.wait(10)
    closer.join(timeout=10)
    assert glob.glob(slot_glob(lane)) == []
    assert lane.put(buffers_of(torch.ones(MB // 4))) is None  # closed: the socket


def test_a_reader_refuses_a_slot_that_is_gone_or_too_small_for_the_sizes(lane) -> None:
    descriptor = lane.put(buffers_of(torch.ones(MB // 4)))
    assert descriptor is not None
    mailbox, pid, index, capacity, filling = shm_lane.DESCRIPTOR.unpack(descriptor)
    with pytest.raises(shm_lane.LaneError, match="do not fit"):
        shm_lane.read(descriptor, [capacity])
    gone = shm_lane.DESCRIPTOR.pack(mailbox, pid, index + 7, capacity, filling)
    with pytest.raises(shm_lane.LaneError, match="gone"):
        shm_lane.read(gone, [MB])


def test_a_dead_senders_slots_are_unmapped(lane) -> None:
    descriptor = lane.put(buffers_of(torch.ones(MB // 4)))
    assert descriptor is not None
    shm_lane.read(descriptor, [MB])
    assert any(m.owner == lane.mailbox for m in shm_lane._mapped.values())
    shm_lane.forget_sender(lane.mailbox)
    assert not any(m.owner == lane.mailbox for m in shm_lane._mapped.values())


def test_a_forked_child_does_not_write_into_its_parents_slots(lane) -> None:
    buffers = buffers_of(torch.ones(MB // 4))  # made here: torch's threads do not survive fork
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether the lane took the message, and leave at once
        took = lane.put(buffers) is not None
        os.write(write_end, b"1" if took else b"0")
        os._exit(0)
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"0"
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    assert lane.unread() == 0


def test_a_lane_message_is_signed_with_its_slot_and_decoded_with_its_buffers(lane) -> None:
    key, me = new_key(), new_id()
    signer, verifier = Signer(key, new_id()), Verifier(key, me)
    t = torch.randn(512, 512)
    payload, buffers = dumps(((t,), {}))
    descriptor = lane.put(buffers)
    frames = signer.frames(me, ("call", "x"), payload, buffers, lane=descriptor)
    assert len(frames) == 1  # the tensor is not in the message
    msg = verifier.decode(frames)
    (got,), _ = msg.value()
    assert torch.equal(got, t) and lane.unread() == 0
    # The slot's name is signed: a message pointing at another slot is refused unread.
    frames = signer.frames(me, ("call", "x"), payload, buffers, lane=lane.put(buffers))
    forged = bytearray(frames[0])
    at = forged.index(lane.mailbox)
    forged[at + 8] ^= 1  # the pid
    with pytest.raises(WireError, match="signature"):
        verifier.decode([bytes(forged)])
    assert lane.unread() == 1


def test_a_cast_copies_once_and_its_slot_is_free_once_every_receiver_has_read(lane) -> None:
    key, ids = new_key(), [new_id() for _ in range(3)]
    signer, verifiers = Signer(key, new_id()), [Verifier(key, me) for me in ids]
    t = torch.randn(512, 256)
    payload, buffers = dumps(((t,), {}))
    frames = signer.frames(ids, ("call", "x"), payload, buffers, lane=lane.put(buffers, ids))
    assert len(glob.glob(slot_glob(lane))) == 1 and len(frames) == 1
    for place in (2, 0, 1):  # in any order; each receiver finds its place among the ids
        assert lane.unread() == 1
        (got,), _ = verifiers[place].decode(frames).value()
        assert torch.equal(got, t)
    assert lane.unread() == 0
    assert lane.put(buffers, [new_id() for _ in range(shm_lane.MAX_READERS + 1)]) is None


def test_a_dead_receivers_places_are_freed_and_only_theirs(lane) -> None:
    """A receiver that died never reads: its sender frees its places when it learns of the
    death (Node.record_death), and the slot serves again once the others have read."""
    dead, alive = new_id(), new_id()
    t = torch.zeros(MB // 4)
    for_dead = [lane.put(buffers_of(t), [dead]) for _ in range(3)]
    cast = lane.put(buffers_of(t), [alive, dead])
    assert None not in for_dead and cast is not None and lane.unread() == 4
    lane.forget_receiver({dead})
    assert lane.unread() == 1  # the cast: the live receiver has not read yet
    shm_lane.read(cast, [MB], reader=0)
    assert lane.unread() == 0
    reused = slot_of(lane.put(buffers_of(t), [alive]))
    assert reused in [slot_of(d) for d in (*for_dead, cast)]  # not a new file


def test_a_reader_refuses_a_slot_filled_again_under_it(lane) -> None:
    """The race with a healed rank, which reuses the dead one's mailbox: a sender that learns
    of the death late frees a place the new process was sent a message for, and fills the slot
    again. That message is refused, never read as the other one's bytes."""
    rank = new_id()
    first = lane.put(buffers_of(torch.ones(MB // 4)), [rank])
    lane.forget_receiver({rank})  # the old incarnation's death, learnt after the send
    second = lane.put(buffers_of(torch.full((MB // 4,), 2.0)), [rank])
    assert slot_of(first) == slot_of(second)
    with pytest.raises(shm_lane.LaneError, match="another message"):
        shm_lane.read(first, [MB])
    (got,) = shm_lane.read(second, [MB])
    assert torch.equal(torch.frombuffer(got, dtype=torch.float32), torch.full((MB // 4,), 2.0))


def test_a_message_dropped_after_its_signature_frees_its_place(lane) -> None:
    key, me = new_key(), new_id()
    signer, verifier = Signer(key, new_id()), Verifier(key, me)
    payload, buffers = dumps(((torch.randn(MB // 4),), {}))
    frames = signer.frames(me, ("call", "x"), payload, buffers, lane=lane.put(buffers, [me]))
    verifier.decode(frames)
    again = signer.frames(me, ("call", "x"), payload, buffers, lane=lane.put(buffers, [me]))
    assert lane.unread() == 1
    with pytest.raises(WireError, match="announces"):
        verifier.decode([*again, b"an extra frame"])
    assert lane.unread() == 0
