"""The signed wire format: what is accepted, and that nothing else reaches the unpickler."""

from __future__ import annotations

import hmac
import os
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actormesh.runtime.messaging import codec as wire

KEY = bytes(range(32))


def _pair() -> tuple[wire.Signer, wire.Verifier, bytes]:
    dest = wire.new_id()
    return wire.Signer(KEY, wire.new_id()), wire.Verifier(KEY, dest), dest


def test_round_trip_with_out_of_band_buffers() -> None:
    import torch

    signer, verifier, dest = _pair()
    value = {"t": torch.arange(100_000, dtype=torch.float32), "small": torch.ones(3), "n": 5}
    payload, buffers = wire.dumps(value)
    assert len(buffers) == 1  # the large tensor leaves the payload
    frames = signer.frames(dest, ("call", "x"), payload, buffers)
    msg = verifier.decode(frames)
    assert msg.envelope == ("call", "x")
    out = msg.value()
    assert torch.equal(out["t"], value["t"]) and torch.equal(out["small"], value["small"])
    assert out["n"] == 5


def _round_trip(value: Any) -> Any:
    payload, buffers = wire.dumps(value)
    # what a receiver gets: writable frames of its own, not the sender's memory
    return wire.loads(payload, [bytearray(bytes(b.raw())) for b in buffers])


def test_tensors_of_every_kind_round_trip_by_either_pickler() -> None:
    import torch

    big = torch.arange(100_000, dtype=torch.float64)
    cases = [
        torch.arange(10.0),
        torch.ones(3, 4).t(),  # not contiguous
        big[::2],  # not contiguous, out of band
        torch.ones(2, requires_grad=True),
        torch.ones(3, dtype=torch.bfloat16),  # numpy has no bfloat16
        torch.randn(3, dtype=torch.complex64).conj(),  # conjugate bit
        torch.tensor(3),
        torch.empty(0, 3),
        torch.nn.Parameter(torch.ones(2)),
    ]
    for value in cases:
        for tree in (value, ((value,), {}), [value, lambda: 1]):  # the last: cloudpickle
            got = _round_trip(tree)
            out = got if tree is value else got[0][0] if isinstance(tree, tuple) else got[0]
            assert type(out) is type(value) and out.dtype == value.dtype
            assert out.shape == value.shape and out.requires_grad == value.requires_grad
            assert torch.equal(out.detach(), value.detach().resolve_conj())


def test_a_tensor_shared_in_a_tree_stays_shared() -> None:
    import torch

    t = torch.arange(100_000, dtype=torch.float32)
    payload, buffers = wire.dumps({"a": [t, t], "b": (t, 1)})
    assert len(buffers) == 1
    out = wire.loads(payload, [bytearray(bytes(b.raw())) for b in buffers])
    assert out["a"][0] is out["a"][1] is out["b"][0]
    assert torch.equal(out["a"][0], t)


def test_a_received_tensor_is_built_on_its_frame_without_a_copy() -> None:
    import torch
    import zmq

    vector = torch.arange(100_000, dtype=torch.float32)
    for value in (vector, vector.reshape(100, 1000), vector.to(torch.bfloat16)):
        payload, buffers = wire.dumps(value)
        frame = zmq.Frame(bytes(buffers[0].raw()))  # what a receiver is given
        out = wire.loads(payload, [frame])
        assert out.dtype == value.dtype and torch.equal(out, value)
        size = value.element_size()
        memoryview(frame)[-size:] = bytes(size)  # the last element: 0
        assert out.reshape(-1)[-1].item() == 0.0


def test_wrong_key_wrong_destination_and_replay_are_rejected() -> None:
    signer, verifier, dest = _pair()
    frames = signer.frames(dest, ("call",), b"payload")
    verifier.decode(frames)
    with pytest.raises(wire.WireError, match="replayed"):
        verifier.decode(frames)
    forged = wire.Signer(os.urandom(32), wire.new_id()).frames(dest, ("call",), b"p")
    with pytest.raises(wire.WireError, match="bad signature"):
        verifier.decode(forged)
    elsewhere = signer.frames(wire.new_id(), ("call",), b"p")
    with pytest.raises(wire.WireError, match="another process"):
        verifier.decode(elsewhere)


def test_every_message_is_signed_with_plain_hmac_sha256_of_its_head() -> None:
    signer, verifier, dest = _pair()
    for payload in (b"first", b"second, longer payload", b""):
        first = signer.frames(dest, ("call", payload), payload)[0]
        head = first[wire.SIG_SIZE : len(first) - len(payload)]
        assert first[: wire.SIG_SIZE] == hmac.digest(KEY, head, "sha256")
        assert verifier.decode([first]).envelope == ("call", payload)


@settings(max_examples=200, deadline=None)
@given(key=st.binary(min_size=1, max_size=200), data=st.binary(max_size=300))
def test_the_keyed_mac_is_hmac_sha256_for_keys_of_any_length(key: bytes, data: bytes) -> None:
    assert wire._KeyedMac(key).sign(data) == hmac.digest(key, data, "sha256")
    assert wire._KeyedMac(key).sign(memoryview(data)) == hmac.digest(key, data, "sha256")


def test_a_cast_signed_once_is_accepted_by_each_receiver_and_no_other() -> None:
    signer = wire.Signer(KEY, wire.new_id())
    ids = [wire.new_id() for _ in range(3)]
    frames = signer.frames(ids, ("call",), b"payload")
    for dest in ids:
        assert wire.Verifier(KEY, dest).decode(frames).envelope == ("call",)
    with pytest.raises(wire.WireError, match="another process"):
        wire.Verifier(KEY, wire.new_id()).decode(frames)
    # An id made of the tail of one receiver's and the head of the next is not a receiver.
    straddling = ids[0][4:] + ids[1][:4]
    with pytest.raises(wire.WireError, match="another process"):
        wire.Verifier(KEY, straddling).decode(frames)


def test_tampered_payload_and_buffer_sizes_are_rejected() -> None:
    signer, verifier, dest = _pair()
    frames = signer.frames(dest, ("call",), b"payload-bytes", [bytearray(100)])
    tampered = bytearray(frames[0])
    tampered[-1] ^= 1
    with pytest.raises(wire.WireError, match="digest"):
        verifier.decode([bytes(tampered), frames[1]])
    frames = signer.frames(dest, ("call",), b"payload-bytes", [bytearray(100)])
    with pytest.raises(wire.WireError, match="wrong size"):
        verifier.decode([frames[0], bytearray(99)])


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.binary(max_size=300), min_size=0, max_size=4),
    st.sampled_from(["random", "truncated", "genuine+junk", "flipped"]),
    st.integers(min_value=0, max_value=400),
)
def test_fuzzed_frames_never_reach_the_unpickler(frames: list[bytes], mode: str, cut: int) -> None:
    signer, verifier, dest = _pair()
    genuine = signer.frames(dest, ("call",), b"x" * 50)
    if mode == "truncated":
        frames = [genuine[0][: cut % len(genuine[0])], *frames]
    elif mode == "genuine+junk":
        frames = [genuine[0], *frames]
    elif mode == "flipped":
        flipped = bytearray(genuine[0])
        flipped[cut % len(flipped)] ^= 0xFF
        frames = [bytes(flipped)]
    unpickled = []
    original = wire.pickle.loads
    wire.pickle.loads = lambda *a, **k: unpickled.append(a) or original(*a, **k)  # type: ignore[assignment]
    try:
        verifier.decode(frames)
        accepted = True
    except wire.WireError:
        accepted = False
    finally:
        wire.pickle.loads = original  # type: ignore[assignment]
    complete_and_genuine = mode == "genuine+junk" and not frames[1:]
    assert accepted == complete_and_genuine
    assert bool(unpickled) == complete_and_genuine


def test_code_sent_by_value_keeps_its_file_name() -> None:
    # Code defined in a notebook cell travels by value; on the rank it must keep the cell's
    # file name (tracebacks, stacks and breakpoints look the cell's lines up by it), whatever
    # cloudpickle does with it (3.1.3 renames all such code "<dynamic-code>").
    filename = "/tmp/ipykernel_1/2649631221.py"
    source = "def step(x):\n    def inner(y):\n        return y + 1\n    return inner(x)\n"
    namespace: dict[str, Any] = {"__name__": "not_an_importable_module"}
    exec(compile(source, filename, "exec"), namespace)
    payload, buffers = wire.dumps(namespace["step"])
    step = wire.loads(payload, buffers)
    assert step is not namespace["step"]  # rebuilt from its code, not imported
    assert step.__code__.co_filename == filename
    inner = next(c for c in step.__code__.co_consts if isinstance(c, types.CodeType))
    assert inner.co_filename == filename
    assert step(1) == 2


def test_torch_ops_pickle_by_name() -> None:
    import torch

    # (what a remote function or an actor's method that calls torch.ops.aten... carries)
    for op in (torch.ops, torch.ops.aten, torch.ops.aten.mm, torch.ops.aten.mm.default,
               torch.ops.aten.add.Tensor):  # fmt: skip
        assert _round_trip([op, lambda: 1])[0] is op
    mm = torch.ops.aten.mm.default
    fn = _round_trip(lambda a, b: mm(a, b))
    assert torch.equal(fn(torch.eye(2), torch.ones(2, 2)), torch.ones(2, 2))
