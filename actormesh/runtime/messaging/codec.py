"""Framing, signing and the pickle boundary: the only place that unpickles.

A message on the wire is a list of ZeroMQ frames::

    [signature + head + payload, buffer_0, buffer_1, ...]

- ``head`` is a fixed binary prefix (magic, sender id, sequence number, send time, the SHA-256 of
  ``payload``, the destination ids, the size of every buffer) followed by a small pickled
  *envelope* (what the message is: its kind, target, reply port). A cast to several receivers
  is signed once and names them all; each receiver checks that it is one of them.
- ``signature`` is HMAC-SHA256 of ``head`` under the job's key. The payload is covered through
  its digest in the head, and out-of-band buffers through their sizes: buffers are only ever
  copied into tensors or arrays, never unpickled, so hashing hundreds of megabytes buys nothing.
- ``payload`` is the pickled user data (arguments, results), pickle protocol 5. Large tensors and
  arrays leave it as out-of-band buffers, sent as zero-copy frames (``plain_pickle.py``), or,
  to a process on the same host, copied through shared memory (``shm_lane.py``): the head then
  also names the slot they are in, and no frame follows.

Nothing is unpickled before the signature, the destination, the sequence number (against
replays) and the payload digest have been checked.

A host agent that gathers its workers' replies (``relay.py``) checks each of them like any
message it receives, never unpickles their payloads, and signs one message carrying them: its
payload is theirs, end to end, so its digest covers every byte the caller will unpickle, and its
head lists every buffer's size. The caller checks that one signature, then splits it.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import itertools
import logging
import os
import pickle
import struct
import sys
import time
import types
from collections.abc import Sequence
from typing import Any

import cloudpickle

from . import shm_lane
from .plain_pickle import (
    NOT_PLAIN,
    OOB_THRESHOLD,
    SIMPLE_TYPES,
    plain_tree,
    reduce_tensor,
    torch_op,
    torch_op_path,
)

logger = logging.getLogger(__name__)

MAGIC = b"AM04"
# magic, sender, seq, send time (CLOCK_MONOTONIC ns, one clock per host: actor_inbox.py),
# payload digest, number of destinations, number of buffers, envelope length, whether the
# buffers are in a shared-memory slot (shm_lane.py) rather than frames
_FIXED = struct.Struct("<4s8sQQ32sIIIB")
_FIXED_PACK = _FIXED.pack
_FIXED_UNPACK = _FIXED.unpack_from
_HEAD_START = 32 + _FIXED.size  # the signature, then the fixed part
_sha256 = hashlib.sha256
_monotonic_ns = time.monotonic_ns
_compare_digest = hmac.compare_digest
_pickle_loads = pickle.loads
_LEN = struct.Struct("<Q")
_ID_SIZE = 8
_LANE_SIZE = shm_lane.DESCRIPTOR.size
_MAX_DESTS = 1 << 16
SIG_SIZE = 32
KEY_ENV = "ACTORMESH_KEY"  # hex; set for children started by a scheduler (never argv)


class WireError(Exception):
    """A frame sequence that is not a valid, authentic message. It is dropped, never executed."""


def new_key() -> bytes:
    return os.urandom(32)


def read_key_file(path: str) -> bytes:
    """A job key stored as hex in a file (the way schedulers hand it to host agents)."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the actormesh job key from {path}: {exc}") from exc
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise ValueError(
            f"{path} does not hold an actormesh job key (expected at least 32 hex digits); "
            "write one with actormesh.hosts.write_key_file(path)"
        )
    return key


def new_id() -> bytes:
    return os.urandom(8)


# ---------------------------------------------------------------------------------------------
# pickling


def _code_in_file(make: Any, args: tuple[Any, ...], filename: str) -> types.CodeType:
    code: types.CodeType = make(*args)
    return code.replace(co_filename=filename)


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle ships no types
    """cloudpickle (by-value classes from ``__main__`` and notebook cells), zero-copy tensors,
    and code that keeps its file name."""

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is types.CodeType:
            # cloudpickle >= 3.1.3 names all code it sends "<dynamic-code>". A rank needs the
            # real name: it is how tracebacks, stacks and breakpoints find a notebook cell's lines.
            make, args = self.dispatch_table[types.CodeType](obj)
            return _code_in_file, (make, args, obj.co_filename)
        torch = sys.modules.get("torch")
        if torch is not None:
            if kind in (torch.Tensor, torch.nn.Parameter):
                reduced = reduce_tensor(obj, torch)
                if reduced is not None:
                    return reduced
            elif kind.__module__ == "torch._ops":
                path = torch_op_path(obj, kind, torch)
                if path is not None:
                    return torch_op, path
        return super().reducer_override(obj)


def dumps(obj: Any, simple: bool = False) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle ``obj``; large buffers come back separately, to be sent as zero-copy frames.

    ``simple=True`` promises that ``obj`` holds only builtin scalars and containers, which the
    plain C pickler handles several times faster than cloudpickle.
    """
    if simple or type(obj) in SIMPLE_TYPES:
        return pickle.dumps(obj, protocol=5), []
    buffers: list[pickle.PickleBuffer] = []

    def keep_large(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes >= OOB_THRESHOLD:
            buffers.append(buf)
            return False  # out of band
        return True  # small: inline

    torch = sys.modules.get("torch")
    if torch is not None:
        tree = plain_tree(obj, torch.Tensor, {})
        if tree is not NOT_PLAIN:
            return pickle.dumps(tree, protocol=5, buffer_callback=keep_large), buffers
    f = io.BytesIO()
    _Pickler(f, protocol=5, buffer_callback=keep_large).dump(obj)
    return f.getvalue(), buffers


def loads(payload: bytes | memoryview, buffers: Sequence[Any] = ()) -> Any:
    """Unpickle a payload whose digest the receiver has already checked (see :func:`decode`)."""
    return pickle.loads(payload, buffers=buffers)


# ---------------------------------------------------------------------------------------------
# framing and signing


class Signer:
    """Signs outgoing messages of one process: its sender id and a sequence number per message."""

    def __init__(self, key: bytes, sender: bytes):
        self._mac = _KeyedMac(key)
        self.sender = sender
        self._seq = itertools.count(1)
        self.last_seq = 0  # of the frames made last (read under the sender's send lock)

    def frames(
        self,
        dest: bytes | Sequence[bytes],
        envelope: tuple[Any, ...],
        payload: bytes = b"",
        buffers: Sequence[Any] = (),
        digest: bytes | None = None,
        lane: bytes | None = None,
    ) -> list[Any]:
        """Frames for one message to one receiver (``dest``, its id) or several (a list of ids:
        the same frames then go to each). Pass ``digest`` when it is already known, and
        ``lane``, a slot's descriptor, when ``buffers`` were copied into it (shm_lane.py).

        The sequence number is drawn here, so the caller must send the frames before any other
        message to the same destinations is framed (the sender holds its send lock).
        """
        if digest is None:
            digest = _sha256(payload).digest()
        dests = dest if isinstance(dest, bytes) else b"".join(dest)
        env = pickle.dumps(envelope, protocol=5)
        seq = self.last_seq = next(self._seq)
        fixed = _FIXED_PACK(
            MAGIC,
            self.sender,
            seq,
            _monotonic_ns(),
            digest,
            len(dests) // _ID_SIZE,
            len(buffers),
            len(env),
            lane is not None,
        )
        if buffers:
            sizes = (_LEN.pack(memoryview(b).nbytes) for b in buffers)
            head = b"".join([fixed, dests, *sizes, lane or b"", env])
        else:
            head = b"".join((fixed, dests, env))
        # _KeyedMac.sign, inline: this runs for every message sent
        mac = self._mac
        inner = mac.inner.copy()
        inner.update(head)
        outer = mac.outer.copy()
        outer.update(inner.digest())
        # One frame for the signed head and the payload: every frame costs a syscall's worth.
        first = b"".join((outer.digest(), head, payload))
        return [first] if lane is not None else [first, *buffers]


# RFC 2104: HMAC(key, m) = H((key ^ opad) || H((key ^ ipad) || m)), key padded to H's block.
_BLOCK = 64  # SHA-256's
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


class _KeyedMac:
    """HMAC-SHA256 with the key's two padded blocks hashed once: a signature copies two SHA-256
    states, about half what copying an OpenSSL HMAC context costs (and a third of
    ``hmac.digest``, which hashes both padded blocks again for every message)."""

    __slots__ = ("inner", "outer")

    def __init__(self, key: bytes) -> None:
        if len(key) > _BLOCK:
            key = hashlib.sha256(key).digest()
        key = key.ljust(_BLOCK, b"\0")
        # The two padded key blocks, hashed: copied for each message (Signer.frames and
        # Verifier.decode do what sign does, inline).
        self.inner = hashlib.sha256(key.translate(_IPAD))
        self.outer = hashlib.sha256(key.translate(_OPAD))

    def sign(self, data: Any) -> bytes:
        inner = self.inner.copy()
        inner.update(data)
        outer = self.outer.copy()
        outer.update(inner.digest())
        return outer.digest()


class Message:
    """A decoded, authenticated message. The payload is unpickled only on demand."""

    __slots__ = ("buffers", "envelope", "kind", "payload", "sender", "sent", "seq")

    def __init__(
        self,
        sender: bytes,
        envelope: tuple[Any, ...],
        payload: Any,
        buffers: list[Any],
        seq: int = 0,
        sent: int = 0,
    ) -> None:
        self.sender = sender
        self.envelope = envelope
        # The kind (protocol.py) names the envelope's class (envelopes.py): CallEnvelope.of(msg)
        self.kind: str = envelope[0] if envelope else ""
        self.payload = payload
        self.buffers = buffers
        self.seq = seq  # the sender's sequence number: orders its messages to any receiver
        self.sent = sent  # when the sender framed it (its host's CLOCK_MONOTONIC, ns)

    def value(self) -> Any:
        # pickle.loads itself, not loads(): this runs for every call and every reply.
        return _pickle_loads(self.payload, buffers=self.buffers)


class Verifier:
    """Checks incoming messages for one receiver: signature, destination, replay, sizes."""

    def __init__(self, key: bytes, me: bytes):
        self._mac = _KeyedMac(key)
        self.me = me
        self._last_seq: dict[bytes, int] = {}

    def decode(self, frames: Sequence[Any]) -> Message:
        """Authenticate and split a message (called by the receiving I/O thread only)."""
        if not frames:
            raise WireError("empty message")
        first = memoryview(frames[0])
        if first.nbytes < _HEAD_START:
            raise WireError("truncated head")
        magic, sender, seq, sent, digest, ndest, nbuf, env_len, lane = _FIXED_UNPACK(
            first, SIG_SIZE
        )
        dests_end = _HEAD_START + ndest * _ID_SIZE
        env_start = dests_end + nbuf * _LEN.size
        if lane:
            env_start += _LANE_SIZE
        head_end = env_start + env_len
        if nbuf > 1024 or ndest > _MAX_DESTS or head_end > first.nbytes:
            raise WireError("truncated head")
        # _KeyedMac.sign, inline: this runs for every message received
        mac = self._mac
        inner = mac.inner.copy()
        inner.update(first[SIG_SIZE:head_end])
        outer = mac.outer.copy()
        outer.update(inner.digest())
        if not _compare_digest(first[:SIG_SIZE], outer.digest()):
            raise WireError("bad signature")
        # From here on the head is authentic: it was written by a holder of the key.
        if magic != MAGIC:
            raise WireError(f"unknown protocol {bytes(magic)!r}")
        if ndest == 1:
            reader = 0 if first[_HEAD_START:dests_end] == self.me else -1
        else:
            reader = self._place_among(first, _HEAD_START, ndest)
        if reader < 0:
            raise WireError("message addressed to another process (replayed?)")
        try:
            last_seq = self._last_seq
            if seq <= last_seq.get(sender, 0):
                raise WireError(f"replayed or reordered message (seq {seq})")
            last_seq[sender] = seq
            if lane:
                if len(frames) != 1:
                    raise WireError(
                        f"head announces buffers in shared memory, got {len(frames) - 1}"
                    )
            elif len(frames) != 1 + nbuf:
                raise WireError(f"head announces {nbuf} buffers, got {len(frames) - 1}")
            buffers = list(frames[1:]) if nbuf else []
            sizes = []  # of the buffers in a shared-memory slot
            off = dests_end
            for i in range(nbuf):
                (size,) = _LEN.unpack_from(first, off)
                off += _LEN.size
                if lane:
                    sizes.append(size)
                elif memoryview(buffers[i]).nbytes != size:
                    raise WireError(f"buffer {i} has the wrong size")
            payload = first[head_end:]
            if _sha256(payload).digest() != digest:
                raise WireError("payload does not match its signed digest")
        except WireError:
            if lane:  # dropped unread: its place in the sender's slot is free again
                at = dests_end + nbuf * _LEN.size
                shm_lane.discard(first[at : at + _LANE_SIZE], reader)
            raise
        if lane:
            try:
                buffers = shm_lane.read(first[off : off + _LANE_SIZE], sizes, reader)
            except shm_lane.LaneError as exc:
                raise WireError(str(exc)) from None
        envelope = pickle.loads(first[env_start:head_end])
        if not isinstance(envelope, tuple) or not envelope:
            raise WireError("malformed envelope")
        return Message(sender, envelope, payload, buffers, seq, sent)

    def _place_among(self, first: memoryview, start: int, ndest: int) -> int:
        """This receiver's place among the message's destinations (-1: not one of them)."""
        dests = first[start : start + ndest * _ID_SIZE].tobytes()
        at = dests.find(self.me)
        while at != -1:
            if at % _ID_SIZE == 0:  # a whole id, not the tail of one and the head of the next
                return at // _ID_SIZE
            at = dests.find(self.me, at + 1)
        return -1


def payload_digest(payload: bytes) -> bytes:
    return hashlib.sha256(payload).digest()
