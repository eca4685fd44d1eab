"""Replies that race other routes (issue 40): a reply whose rank dies right after sending it,
replies of one sender that take both the datagram and the process-inbox route, and the
shared-memory lane's slots of a receiver that died."""

from __future__ import annotations

import os
import threading
from functools import partial
from typing import Any

from support import wait_until

import actormesh as am

WAIT = 30


class Quitter(am.Actor):
    @am.endpoint(explicit_response_port=True)
    def answer_then_exit(self, port: am.Port[str], delay: float) -> None:
        port.send("answered")
        # The exit is armed once the reply was sent: armed before it (in an endpoint that then
        # returns), a loaded machine's timer fired before the reply left, and no reply was sent.
        threading.Timer(delay, os._exit, (9,)).start()


def test_a_reply_sent_just_before_its_rank_dies_is_not_lost(
    spawn_procs: Any, unhandled_failures: list[Any]
) -> None:
    procs = spawn_procs(per_host={"gpus": 1})
    lost = []
    for attempt in range(30):
        quitter = procs.spawn(f"quitter{attempt}", Quitter)
        delay = 0.001 * (1 + attempt % 5)  # the process exits 1-5 ms after it answered
        quitter.initialized.get(timeout=WAIT)
        try:
            reply = quitter.answer_then_exit.call_one(delay)
            # The caller is busy as the reply comes, and looks only once the rank is gone.
            wait_until(lambda: procs.health().values()[0] != "alive", WAIT, "the rank's exit")
            assert reply.get(timeout=WAIT) == "answered"
        except am.SupervisionError as exc:
            lost.append(f"attempt {attempt} ({delay * 1000:.0f} ms): {exc}".splitlines()[0])
        procs.heal().get(timeout=WAIT)
    unhandled_failures.clear()  # the deaths themselves, each after its call was answered
    assert not lost, f"{len(lost)} of 30 replies lost: {lost[:3]}"


class Echo(am.Actor):
    @am.endpoint
    def echo(self, index: int, size: int) -> tuple[int, bytes]:
        return index, b"x" * size


def test_replies_of_one_sender_complete_in_order_across_both_routes(spawn_procs: Any) -> None:
    """Small replies go as datagrams, large ones (past a datagram) through the process inbox:
    a large one must not overtake the small ones sent before it, nor the other way round."""
    procs = spawn_procs(per_host={"gpus": 1})
    echo = procs.spawn("echo", Echo)
    echo.initialized.get(timeout=WAIT)
    for round in range(5):
        completed: list[int] = []
        futures = []
        for index in range(60):
            size = 100_000 if index % 3 == 2 else 10  # past a datagram's 64 KiB, or not
            future = echo.echo.call_one(index, size)
            future.add_done_callback(partial(_append, completed))
            futures.append(future)
        assert [f.get(timeout=WAIT)[0] for f in futures] == list(range(60))
        wait_until(partial(_has, completed, 60), WAIT, "every callback to run")
        assert completed == list(range(60)), f"round {round}: completed as {completed}"


def _append(out: list[int], future: Any) -> None:
    out.append(future.get()[0])  # list.append is atomic: callbacks may run on two threads


def _has(out: list[int], n: int) -> bool:
    return len(out) == n
