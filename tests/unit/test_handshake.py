"""The host agent registration handshake is authenticated, fresh and not replayable."""

from __future__ import annotations

import pytest

from actormesh.hosts import handshake
from actormesh.hosts.netif import split_host_port

KEY = b"k" * 32


def test_hello_with_the_right_key_is_accepted_once() -> None:
    frames, nonce = handshake.hello(KEY, {"name": "h1"})
    seen: set[str] = set()
    assert handshake.check_hello(KEY, frames, seen)["name"] == "h1"
    with pytest.raises(handshake.HandshakeError, match="replayed"):
        handshake.check_hello(KEY, frames, seen)
    answer = handshake.welcome(KEY, nonce, {"host_rank": 3})
    assert handshake.check_welcome(KEY, answer, nonce)["host_rank"] == 3


def test_wrong_key_and_foreign_welcome_are_refused() -> None:
    frames, nonce = handshake.hello(b"x" * 32, {"name": "h1"})
    with pytest.raises(handshake.HandshakeError, match="does not hold this job's key"):
        handshake.check_hello(KEY, frames, set())
    other = handshake.welcome(KEY, "another-nonce", {})
    with pytest.raises(handshake.HandshakeError, match="another hello"):
        handshake.check_welcome(KEY, other, nonce)
    with pytest.raises(handshake.HandshakeError, match="refused this agent: bad key"):
        handshake.check_welcome(KEY, [handshake.REFUSED, b"bad key"], nonce)


def test_connect_addresses() -> None:
    assert split_host_port("tcp://10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert split_host_port("ctl:7") == ("ctl", 7)
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_host_port("10.0.0.1")
