"""The registration handshake between a host agent and the controller.

An agent dials the controller's registration address and sends a *hello*; the controller answers
with a *welcome* (or a refusal). Both are JSON, each signed with HMAC-SHA256 under the job key
(the key that signs every later message), with a domain tag so one can never pass for the other.
The hello carries a fresh nonce and a timestamp (the controller refuses stale or replayed ones);
the welcome echoes the nonce, so the agent knows the answer comes from a holder of the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from typing import Any

PROTOCOL = b"AMREG1"
REFUSED = b"AMREG1-REFUSED"
_HELLO = b"actormesh register\0"
_WELCOME = b"actormesh welcome\0"
MAX_CLOCK_SKEW = 300.0
# The most a frame of a hello may weigh (a hello is a few hundred bytes of JSON).
MAX_FRAME = 64 << 10


class HandshakeError(Exception):
    """A hello or welcome that is malformed, unsigned, stale or replayed."""


def _sign(key: bytes, tag: bytes, payload: bytes) -> bytes:
    return hmac.digest(key, tag + payload, hashlib.sha256)


def hello(key: bytes, info: dict[str, Any]) -> tuple[list[bytes], str]:
    """Frames of a hello carrying ``info``, and its nonce."""
    nonce = os.urandom(16).hex()
    payload = json.dumps(dict(info, nonce=nonce, time=time.time())).encode()
    return [PROTOCOL, payload, _sign(key, _HELLO, payload)], nonce


def check_hello(key: bytes, frames: list[bytes], seen: set[str]) -> dict[str, Any]:
    """The hello's info, if authentic, fresh and not seen before; else ``HandshakeError``."""
    if len(frames) != 3 or frames[0] != PROTOCOL:
        raise HandshakeError("not an actormesh host agent hello (wrong protocol or version)")
    payload, sig = frames[1], frames[2]
    if not hmac.compare_digest(sig, _sign(key, _HELLO, payload)):
        raise HandshakeError(
            "bad signature: the agent does not hold this job's key (give it the key file "
            "written by the controller, through ACTORMESH_KEY_FILE or --key-file)"
        )
    info = json.loads(payload)
    if abs(time.time() - float(info["time"])) > MAX_CLOCK_SKEW:
        raise HandshakeError("stale hello (clock skew or replay)")
    if info["nonce"] in seen:
        raise HandshakeError("replayed hello")
    seen.add(info["nonce"])
    return dict(info)


def welcome(key: bytes, nonce: str, answer: dict[str, Any]) -> list[bytes]:
    payload = json.dumps(dict(answer, nonce=nonce)).encode()
    return [PROTOCOL, payload, _sign(key, _WELCOME, payload)]


def check_welcome(key: bytes, frames: list[bytes], nonce: str) -> dict[str, Any]:
    if len(frames) >= 2 and frames[0] == REFUSED:
        raise HandshakeError(f"the controller refused this agent: {frames[1].decode()}")
    if len(frames) != 3 or frames[0] != PROTOCOL:
        raise HandshakeError("the controller's answer is not an actormesh welcome")
    payload, sig = frames[1], frames[2]
    if not hmac.compare_digest(sig, _sign(key, _WELCOME, payload)):
        raise HandshakeError("the welcome is not signed with this job's key")
    answer = json.loads(payload)
    if answer.get("nonce") != nonce:
        raise HandshakeError("the welcome answers another hello (replayed?)")
    return dict(answer)
