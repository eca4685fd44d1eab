"""CurveZMQ keys for encrypting tcp:// traffic between hosts, derived from the job key.

Every process of a job already holds the job key (it signs every message), so one key pair for
all tcp:// inboxes and one for all their clients, both derived from it, give encryption with
nothing more to hand out: an outsider without the job key can neither read nor join.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import NamedTuple

import zmq
import zmq.utils.z85


class CurveKeys(NamedTuple):
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def available() -> bool:
    return bool(zmq.has("curve"))


def curve_keys(job_key: bytes) -> CurveKeys:
    """The job's Curve key pairs (z85-encoded, as ZeroMQ's socket options take them)."""
    if not available():
        raise RuntimeError(
            "this libzmq has no CURVE support; install a pyzmq wheel (it bundles libsodium) "
            "or set ACTORMESH_CURVE=0 to send cross-host traffic unencrypted"
        )

    def pair(purpose: bytes) -> tuple[bytes, bytes]:
        secret = zmq.utils.z85.encode(hmac.digest(job_key, purpose, hashlib.sha256))
        return zmq.curve_public(secret), secret

    server_public, server_secret = pair(b"actormesh curve server")
    client_public, client_secret = pair(b"actormesh curve client")
    return CurveKeys(server_public, server_secret, client_public, client_secret)
