"""Reading signed messages off a ZeroMQ socket: what every inbox (the I/O thread's, an actor's, a
thread's reply inbox) does with its socket."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import zmq

from .codec import Message, Verifier, WireError

logger = logging.getLogger(__name__)

_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)
# pyzmq's own ``get``, under the ``Socket.get`` that wraps every answer in an enum in Python.
_get_option = zmq.backend.Socket.get


def has_message(sock: zmq.Socket[Any]) -> bool:
    """Whether a receive would not block (several times cheaper than an empty receive's
    exception). ``EVENTS`` asks the socket's mailbox once (one syscall); a zero-timeout
    ``zmq_poll`` asks it too, after a ``poll`` of its FD (two)."""
    events: int = _get_option(sock, _EVENTS)  # type: ignore[assignment]  # EVENTS is an int
    return bool(events & _POLLIN)


def receive(
    sock: zmq.Socket[Any],
    verifier: Verifier | None,
    limit: int | None = None,
    woken: bool = False,
    wakeups: bool = False,
) -> Iterator[Message]:
    """The authentic messages waiting on ``sock``, until it is empty (or ``limit`` were read).

    What fails authentication or decoding is dropped and logged, never handled. Reading until
    empty matters to callers that sleep on the socket's FD: it signals edges, not levels, and
    a read that ends empty leaves it armed (the next message signals it).

    ``woken``: the caller was just woken by the socket, so a message is most likely waiting.
    It is read at once rather than asked for first: asking processes the socket's pending
    commands, a few syscalls that the read does anyway.

    ``wakeups``: empty messages are wake-ups that other threads of this process send to the
    socket (an actor's inbox, a reply inbox): skipped, not logged.
    """
    count = 0
    while limit is None or count < limit:
        if woken:
            woken = False
            try:
                frames = _recv_frames(sock)
            except zmq.Again:
                return  # woken by a command that brought no message
        elif has_message(sock):
            frames = _recv_frames(sock)
        else:
            return
        count += 1
        if wakeups and len(frames) == 1 and not len(frames[0]):
            continue
        if verifier is None:
            decode(verifier, frames)  # dropped, and said so
            continue
        # decode(), inline: the controller reads every reply here.
        try:
            msg = verifier.decode(frames)
        except WireError as exc:
            logger.warning("dropped a message that failed authentication: %s", exc)
            continue
        except Exception as exc:
            logger.warning("dropped an undecodable message: %r", exc)
            continue
        yield msg


def decode(verifier: Verifier | None, frames: Sequence[Any]) -> Message | None:
    """The message, authenticated (``Verifier.decode``); ``None`` when it fails (dropped and
    logged, never handled). No verifier: the socket takes no messages from outside."""
    try:
        if verifier is None:
            raise WireError("this socket takes no messages")
        return verifier.decode(frames)
    except WireError as exc:
        logger.warning("dropped a message that failed authentication: %s", exc)
    except Exception as exc:
        logger.warning("dropped an undecodable message: %r", exc)
    return None


def _recv_frames(sock: zmq.Socket[Any]) -> list[zmq.Frame]:
    # Not recv_multipart: it asks the socket for RCVMORE after every frame, and each option
    # read builds an enum in pyzmq; the frame knows whether more follow.
    frame = sock.recv(zmq.NOBLOCK, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(zmq.NOBLOCK, copy=False)
        frames.append(frame)
    return frames
