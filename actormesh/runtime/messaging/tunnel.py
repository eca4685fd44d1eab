"""Byte streams to a loopback TCP port on another host, carried by that host's agent.

A rank's debugger (debugpy) listens on its host's loopback only. The controller reaches it from
another machine through the host agent there: the controller end is a local socket (one end of a
socket pair, so a client written for TCP uses it unchanged), and the bytes travel as signed
control messages (encrypted too when CurveZMQ is on) between the controller and the agent, which
holds the TCP connection. The agent connects only to loopback ports, only when an authenticated
controller asks.

Messages to the agent: ``(TUNNEL, id, "open", port, reply_port)``, ``(TUNNEL, id, "data")``
with the bytes as payload, ``(TUNNEL, id, "close")``. From the agent: port messages to
``reply_port`` carrying bytes; an empty one means the far end closed.
"""

from __future__ import annotations

import contextlib
import logging
import socket

from ...errors import ProcDeath
from .address import Address
from .codec import Message
from .envelopes import TunnelEnvelope
from .node import Node
from .protocol import PORT, TUNNEL, ReplyTo

logger = logging.getLogger(__name__)

_CHUNK = 1 << 16


class Tunnel:
    """The controller's end of one tunnel. ``local`` is the socket its user reads and writes."""

    def __init__(self, node: Node, agent: Address, port: int) -> None:
        self.node = node
        self.agent = agent
        self.local, self._far = socket.socketpair()
        self._closed = False
        self._port = node.open_port(self)
        self._id = self._port.port_id
        reply = (tuple(self._port.address), self._id)
        node.send(agent, (TUNNEL, self._id, "open", port, reply))
        node.transport.call_soon(self._watch)

    # -- I/O thread ------------------------------------------------------------------------------

    def _watch(self) -> None:
        if not self._closed:  # the agent may have refused already
            self.node.transport.add_reader(self._far.fileno(), self._outgoing)

    def _outgoing(self) -> None:
        try:
            data = self._far.recv(_CHUNK)
        except OSError:
            data = b""
        if not data:  # the user closed its end
            self._close(tell_agent=True)
            return
        self.node.send(self.agent, (TUNNEL, self._id, "data"), data)

    def on_message(self, msg: Message) -> None:
        data = bytes(msg.payload)
        if not data:
            self._close(tell_agent=False)
            return
        try:
            self._far.sendall(data)
        except OSError:
            self._close(tell_agent=True)

    def on_death(self, mailbox: bytes, death: ProcDeath) -> bool:
        if mailbox == self.agent.mailbox:
            self._close(tell_agent=False)
        return False

    def _close(self, tell_agent: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self.node.close_port(self._port)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.node.transport.remove_reader(self._far.fileno())
        if tell_agent:
            with contextlib.suppress(Exception):
                self.node.send(self.agent, (TUNNEL, self._id, "close"))
        self._far.close()  # the user's end reads end-of-file


def open_tunnel(node: Node, agent: Address, port: int) -> socket.socket:
    """A connected socket to ``127.0.0.1:port`` on the host of ``agent`` (any thread)."""
    return Tunnel(node, agent, port).local


class TunnelEnds:
    """The agent's ends of the tunnels the controller opened (I/O thread only)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._open: dict[tuple[bytes, int], tuple[socket.socket, Address, int]] = {}
        node.register(TUNNEL, self._on_message)

    def _on_message(self, msg: Message) -> None:
        tunnel = TunnelEnvelope.of(msg)
        key = (msg.sender, tunnel.tunnel_id)
        op = tunnel.op
        if op == "open":
            to = ReplyTo.read(tunnel.reply)
            self._connect(key, int(tunnel.port), Address(*to.address), to.port_id)
        elif op == "data":
            end = self._open.get(key)
            if end is not None:
                try:
                    end[0].sendall(msg.payload)
                except OSError:
                    self._close(key, tell=True)
        elif op == "close":
            self._close(key, tell=False)

    def _connect(self, key: tuple[bytes, int], port: int, reply: Address, port_id: int) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError as exc:
            logger.warning("tunnel to loopback port %d failed: %s", port, exc)
            self.node.send(reply, (PORT, port_id))  # empty: closed at once
            return
        sock.settimeout(None)
        self._open[key] = (sock, reply, port_id)
        self.node.transport.add_reader(sock.fileno(), lambda: self._incoming(key))

    def _incoming(self, key: tuple[bytes, int]) -> None:
        end = self._open.get(key)
        if end is None:
            return
        try:
            data = end[0].recv(_CHUNK)
        except OSError:
            data = b""
        if not data:
            self._close(key, tell=True)
            return
        self.node.send(end[1], (PORT, end[2]), data)

    def _close(self, key: tuple[bytes, int], tell: bool) -> None:
        end = self._open.pop(key, None)
        if end is None:
            return
        sock, reply, port_id = end
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.node.transport.remove_reader(sock.fileno())
        sock.close()
        if tell:
            self.node.send(reply, (PORT, port_id))
