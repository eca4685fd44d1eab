"""``interrupts.held``: Ctrl-C inside the block is raised once the block is done (issue 40)."""

from __future__ import annotations

import _thread
import signal
import threading

import pytest

from actormesh.tensor.controller.interrupts import held


def test_an_interrupt_inside_the_block_is_raised_after_it() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt), held():
        _thread.interrupt_main()
        for _ in range(1000):  # bytecodes at which Python would have raised it
            done.append(1)
    assert len(done) == 1000
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_interrupt_goes_through_at_once() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt), held():
        _thread.interrupt_main()
        done.append(1)
        _thread.interrupt_main()  # a stuck block can still be stopped
        for _ in range(1000):
            done.append(1)
    assert len(done) < 1000
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_other_threads_and_nested_blocks_hold_nothing_of_their_own() -> None:
    seen = []

    def other() -> None:
        with held():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert seen == [signal.default_int_handler]
    with held():
        inner = signal.getsignal(signal.SIGINT)
        with held():
            assert signal.getsignal(signal.SIGINT) is inner
        assert signal.getsignal(signal.SIGINT) is inner
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
