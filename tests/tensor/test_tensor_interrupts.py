"""Interrupts (Ctrl-C, the kernel's interrupt button) while ops are recorded and sent (issue 40,
item 1): every recorded op reaches every rank exactly once, or the user is told the mesh's values
are unusable; the ranks never silently disagree."""

from __future__ import annotations

import _thread
import random
import signal
import sys
import threading
import time
from typing import Any

import pytest
import torch

import actormesh as am
from actormesh.tensor import distribute, inspect

INTERRUPTS = 80


class Pester:
    """A thread that interrupts the main thread ``count`` times at random moments, alternating
    SIGINT (``pthread_kill``) and ``_thread.interrupt_main``, each time waiting until the main
    thread raised it (its SIGINT handler ran), then (with a deadline) until the main thread
    caught it or Python dropped it in a destructor (reported through ``sys.unraisablehook``),
    before it sends the next. Waiting for the handler first matters on a loaded machine: an
    interrupt still pending when the deadline passed was counted as dropped, and raised later
    beside the next one, inside the test's own handler, where nothing caught it."""

    def __init__(self, count: int, seed: int) -> None:
        self.count = count
        self.rng = random.Random(seed)
        self.raised = threading.Event()  # the main thread's SIGINT handler ran
        self.caught = threading.Event()
        self.done = threading.Event()
        self.unanswered = 0  # interrupts a destructor swallowed (Python prints and drops them)
        self.stuck = False  # an interrupt the main thread never took
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._hook = sys.unraisablehook
        self._handler: Any = None

    def __enter__(self) -> Pester:
        sys.unraisablehook = self._unraisable
        self._handler = signal.signal(signal.SIGINT, self._raise)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(timeout=30)
        signal.signal(signal.SIGINT, self._handler)
        sys.unraisablehook = self._hook

    def _raise(self, signum: int, frame: Any) -> None:
        self.raised.set()
        raise KeyboardInterrupt

    def _unraisable(self, unraisable: Any) -> None:
        self._hook(unraisable)  # pytest's own, done before the next interrupt may come
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            self.unanswered += 1
            self.caught.set()

    def _run(self) -> None:
        main = threading.main_thread().ident
        assert main is not None
        for i in range(self.count):
            time.sleep(self.rng.uniform(0, 0.003))  # a random point, not synchronisation
            if i % 2:
                signal.pthread_kill(main, signal.SIGINT)
            else:
                _thread.interrupt_main()
            if not self.raised.wait(120):  # only a hang takes this long (the test fails)
                self.stuck = True
                break
            self.raised.clear()
            if not self.caught.wait(5):
                # Neither caught nor reported: Python dropped it where it cannot report it
                # (in this hook's last bytecodes, say), which the deadline stands for.
                self.unanswered += 1
            self.caught.clear()
        self.done.set()


def on_every_rank(t: Any, mesh: Any) -> list[float]:
    sizes = mesh.sizes
    return [inspect(t, dp=d, tp=p).item() for d in range(sizes["dp"]) for p in range(sizes["tp"])]


# An interrupt that lands in a destructor (MeshTensor.__del__, at its first bytecode) is printed
# and dropped by Python itself; pytest would turn each print into an error.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.slow
def test_interrupts_at_random_points_leave_every_rank_the_same_values(mesh: Any) -> None:
    x = distribute(torch.arange(16.0, dtype=torch.float64).reshape(4, 4), mesh, ["dp", None])
    acc = distribute(torch.zeros((), dtype=torch.float64), mesh)
    total = distribute(torch.zeros((), dtype=torch.float64), mesh)
    chain = acc + 0
    # Warm every op first: an interrupt inside torch's first (lazy) imports breaks torch itself.
    warm = (chain + 1, total + x.sum(), acc + 1)
    acc.add_(0)
    assert [v.item() for v in warm] == [1.0, 120.0, 1.0]
    del warm
    adds = sums = steps = interrupted = k = 0
    landed: dict[str, int] = {}  # module of the innermost frame an interrupt came from
    with Pester(INTERRUPTS, seed=40) as pester:
        while not pester.done.is_set():
            try:
                while not pester.done.is_set():
                    acc.add_(1)  # in place: one value, many ops
                    adds += 1
                    chain = chain + 1  # out of place: a new value each time
                    steps += 1
                    k += 1
                    if k % 20 == 0:
                        total.add_(x.sum())  # a collective on every rank (x is sharded)
                        sums += 1
                    if k % 50 == 0:
                        acc.item()  # a sync point: a fetch sent with the batch
            except KeyboardInterrupt as exc:
                interrupted += 1
                tb = exc.__traceback__
                handler = Pester._raise.__code__  # the frame the interrupt came from: above it
                while tb is not None and tb.tb_next is not None:
                    if tb.tb_next.tb_frame.f_code is handler:
                        break
                    tb = tb.tb_next
                where = tb.tb_frame.f_code.co_filename.rsplit("/", 1)[-1] if tb else "?"
                landed[where] = landed.get(where, 0) + 1
                pester.caught.set()
    print(f"{interrupted} interrupts caught, in: {landed}; {pester.unanswered} dropped by Python")
    assert not pester.stuck, "the main thread did not take an interrupt in 120 s"
    assert interrupted + pester.unanswered == INTERRUPTS
    assert acc.mesh.stream.lost is None
    # An interrupt may come after an op was recorded and before the loop counted it: each one
    # can add one op the loop did not count, never remove one.
    for name, t, counted in (("acc", acc, adds), ("chain", chain, steps)):
        values = on_every_rank(t, mesh)
        assert len(set(values)) == 1, f"{name}: the ranks disagree: {values}"
        assert counted <= values[0] <= counted + interrupted, (name, counted, values[0])
    totals = on_every_rank(total, mesh)
    assert len(set(totals)) == 1, f"the ranks disagree: {totals}"
    assert totals[0] % 120 == 0 and sums <= totals[0] / 120 <= sums + interrupted


@am.remote(propagate=lambda t: t)
def holding_a_lock(t: Any) -> Any:
    return t + 0 if LOCK else t


LOCK = threading.Lock()  # a global the function reads: cloudpickle sends it along, and cannot


def test_a_batch_that_cannot_be_sent_makes_the_values_unusable_not_different(
    mesh: Any,
) -> None:
    x = distribute(torch.ones(4, dtype=torch.float64), mesh)
    y = x * 3
    holding_a_lock(y)  # recorded; it fails as its batch is sent, with y's op before it
    with pytest.raises(TypeError, match="lock"):
        y.item()
    with pytest.raises(am.MeshClosedError, match="unusable"):
        inspect(y)
    with pytest.raises(am.MeshClosedError, match="unusable"):
        x + 1
    fresh = distribute(torch.ones(4, dtype=torch.float64), mesh)  # a new engine
    assert torch.equal(inspect(fresh * 3), torch.full((4,), 3.0, dtype=torch.float64))
