"""Where a process, or one actor in it, can be reached: ``Address``, and the addresses and
host ids derived from it."""

from __future__ import annotations

import hashlib
import os
import socket
from typing import NamedTuple


class Address(NamedTuple):
    """Where a process can be reached: its host, its inbox endpoints, its mailbox id."""

    host: str
    ipc: str | None
    tcp: str | None
    mailbox: bytes

    def endpoint_from(self, host: str) -> str:
        if self.ipc is not None and host == self.host:
            return self.ipc
        if self.tcp is None:
            raise ConnectionError(f"process {self.mailbox.hex()} on {self.host} has no tcp inbox")
        return self.tcp


# Unix socket paths are limited to 107 bytes; a longer actor path would not bind.
MAX_IPC_PATH = 100
_IPC = "ipc://"
DATAGRAM_SCHEME = "dgram://"  # a reply inbox's address (datagrams.py)


def actor_address(proc: Address, key: str) -> Address | None:
    """The inbox of actor ``key`` in process ``proc``, read by the actor's own thread.

    Senders on the same host call an actor there directly, so no thread of the receiving
    process stands between the socket and the endpoint. Both ends derive the address from the
    process address and the actor key, so nothing has to be exchanged. ``None`` when the actor
    can only be reached through its process's inbox (no ipc:// path, or one too long).
    """
    if proc.ipc is None:
        return None
    tag = hashlib.blake2b(key.encode(), digest_size=6).hexdigest()
    ipc = f"{proc.ipc}.{tag}"
    if len(ipc) - len("ipc://") > MAX_IPC_PATH:
        return None
    mailbox = hashlib.blake2b(proc.mailbox + key.encode(), digest_size=8).digest()
    return Address(proc.host, ipc, None, mailbox)


def reply_inbox_address(proc: Address, number: int, mailbox: bytes) -> Address | None:
    """The address of reply inbox ``number`` of process ``proc``: a unix datagram socket beside
    the process's own (``datagrams.py``); ``None`` when its path would be too long to bind."""
    if proc.ipc is None or not proc.ipc.startswith(_IPC):
        return None
    path = f"{proc.ipc[len(_IPC) :]}.r{number}"
    if len(path) > MAX_IPC_PATH:
        return None
    return Address(proc.host, f"{DATAGRAM_SCHEME}{path}", None, mailbox)


def process_of_inbox(inbox: Address, mailbox: bytes) -> Address:
    """The process (its mailbox: ``mailbox``) whose reply inbox is ``inbox``: where a reply
    that cannot go as a datagram goes instead. Derived from the inbox's path, as that path was
    from the process's (``reply_inbox_address``), so a call need not carry both."""
    assert inbox.ipc is not None
    path = inbox.ipc[len(DATAGRAM_SCHEME) :].rsplit(".r", 1)[0]
    return Address(inbox.host, f"{_IPC}{path}", None, mailbox)


def local_host_id() -> str:
    """A name for this machine that differs between hosts (and between fake hosts in tests)."""
    override = os.environ.get("ACTORMESH_HOST_ID")
    if override:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()[:8]
    except OSError:
        boot = "0"
    return f"{socket.gethostname()}:{boot}"
