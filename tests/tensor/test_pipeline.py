"""Pipeline parallelism from a plain controller loop (issue 41): stages ``module_to_mesh``'d on
the slices of one proc mesh, microbatches, GPipe and 1F1B (``actormesh.tensor.pipeline_step``).
Losses and weights equal one process (float64) for a 2-stage pipeline whose stages are
data-parallel ({pp: 2, dp: 2}) and a 4-stage one; the stages run at the same time, leaving the
bubble the schedule's theory says; a failure in stage 1 is reported with its rank and stage 0
does not hang. Real ranks, gloo."""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.tensor import Replicate

import actormesh as am
from actormesh.tensor import (
    RemoteTensorError,
    bubble_fraction,
    device_mesh,
    gpipe,
    inspect,
    one_f_one_b,
    pipeline_step,
)
from actormesh.tensor.wire import kinds

WAIT = 60


@pytest.fixture(scope="module")
def procs() -> Iterator[Any]:
    procs = am.this_host().spawn_procs(per_host={"pp": 2, "dp": 2})
    try:
        for s in range(2):  # groups per stage first: one-process stages run inside them
            device_mesh(procs.slice(pp=s))
        yield procs
    finally:
        procs.stop().get(timeout=30)


def test_the_schedules_are_plain_lists() -> None:
    assert gpipe(2, 3) == [[("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]] * 2
    assert one_f_one_b(3, 4) == [
        [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)],
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)],
    ]
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)


def _layers(widths: list[int]) -> list[nn.Module]:
    torch.manual_seed(0)
    out: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        last = i == len(widths) - 2
        out.append(
            nn.Sequential(nn.Linear(a, b)) if last else nn.Sequential(nn.Linear(a, b), nn.Tanh())
        )
    return [m.double() for m in out]


def _train_and_compare(stages: list[nn.Module], meshes: list[Any], schedule: str) -> None:
    """Two SGD steps of the pipeline and of one process (the stages in a row, whole batch)."""
    local = nn.Sequential(*copy.deepcopy(stages))
    meshed = [am.module_to_mesh(stage, mesh) for stage, mesh in zip(stages, meshes, strict=True)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in meshed]  # one per stage
    local_opt = torch.optim.SGD(local.parameters(), lr=0.1)
    torch.manual_seed(1)
    x, y = torch.randn(16, 6, dtype=torch.float64), torch.randn(16, 3, dtype=torch.float64)
    for _ in range(2):
        loss = pipeline_step(meshed, meshes, x, y, nn.functional.mse_loss, microbatches=4,
                             schedule=schedule)  # fmt: skip
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
        local_opt.zero_grad()
        want = nn.functional.mse_loss(local(x), y)
        want.backward()
        local_opt.step()
        assert loss.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-12)
    got = inspect([p for m in meshed for p in m.parameters()])
    for a, b in zip(got, local.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_data_parallel_stages_equal_one_process(procs: Any, schedule: str) -> None:
    meshes = [procs.slice(pp=s) for s in range(2)]  # {dp: 2} each: a batch splits over dp
    _train_and_compare(_layers([6, 8, 3]), meshes, schedule)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_four_stages_equal_one_process(procs: Any, schedule: str) -> None:
    flat = procs.flatten("stage")  # one process per stage
    meshes = [flat.slice(stage=slice(s, s + 1)) for s in range(4)]
    _train_and_compare(_layers([6, 8, 8, 8, 3]), meshes, schedule)


class Centred(nn.Module):
    """A stage of the user's own class whose forward mixes the rows of its microbatch (centres
    them) and takes a keyword argument: its forward runs on the controller, recorded op by op
    (module_to_mesh), so with the microbatch split over dp the mean is still the whole
    microbatch's, as in one process."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__()
        self.fc = nn.Linear(a, b)

    def forward(self, x: Any, *, scale: float = 1.0) -> Any:
        h = torch.tanh(self.fc(x)) * scale
        return h - h.mean(0, keepdim=True)


def test_stages_are_the_users_classes_and_mix_rows_as_one_process(procs: Any) -> None:
    meshes = [procs.slice(pp=s) for s in range(2)]  # {dp: 2} each: a microbatch splits over dp
    torch.manual_seed(0)
    local = [Centred(6, 8).double(), nn.Linear(8, 3).double()]
    meshed = [
        am.module_to_mesh(copy.deepcopy(m), mesh) for m, mesh in zip(local, meshes, strict=True)
    ]
    assert isinstance(meshed[0], Centred) and isinstance(meshed[1], nn.Linear)
    stages = [lambda h: meshed[0](h, scale=2.0), meshed[1]]
    torch.manual_seed(1)
    x, y = torch.randn(16, 6, dtype=torch.float64), torch.randn(16, 3, dtype=torch.float64)
    loss = pipeline_step(stages, meshes, x, y, nn.functional.mse_loss, microbatches=4)
    # One process, the same microbatches: each one's loss over 4, its gradients accumulated.
    want = torch.zeros((), dtype=torch.float64)
    for xm, ym in zip(x.chunk(4), y.chunk(4), strict=True):
        part = nn.functional.mse_loss(local[1](local[0](xm, scale=2.0)), ym) / 4
        part.backward()
        want += part.detach()
    assert loss.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-12)
    got = inspect([p.grad for m in meshed for p in m.parameters()])
    for a, b in zip(got, [p.grad for m in local for p in m.parameters()], strict=True):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    assert type(meshed[0].fetch_module()) is Centred


def test_a_stage_sums_its_gradients_over_dp_once_per_step(procs: Any) -> None:
    """Gradient accumulation over the microbatches stays local (partial sums on each dp rank):
    one ``grad_sync`` per stage at the end of the step, as DDP's ``no_sync`` gives, not one per
    microbatch. The gradients come out replicated, and equal one process (float64)."""
    meshes = [procs.slice(pp=s) for s in range(2)]
    local = _layers([6, 8, 3])
    meshed = [
        am.module_to_mesh(copy.deepcopy(m), mesh) for m, mesh in zip(local, meshes, strict=True)
    ]
    torch.manual_seed(1)
    x, y = torch.randn(16, 6, dtype=torch.float64), torch.randn(16, 3, dtype=torch.float64)
    before = kinds.seen["grad_sync"]
    loss = pipeline_step(meshed, meshes, x, y, nn.functional.mse_loss, microbatches=4)
    assert kinds.seen["grad_sync"] - before == 2  # one per stage
    want = nn.functional.mse_loss(nn.Sequential(*local)(x), y)
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-12)
    grads = [p.grad for m in meshed for p in m.parameters()]
    assert all(g.placements().get(timeout=WAIT) == (Replicate(),) for g in grads)
    for a, b in zip(inspect(grads), [p.grad for m in local for p in m.parameters()], strict=True):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


# -- the bubble ------------------------------------------------------------------------------------
#
# Stages whose forward and backward take a set time on the ranks (a sleep: no CPU, so the 2
# cores of a loaded test machine do not decide the timing) and nothing else. Then a step of m
# microbatches over p stages takes (m + p - 1) * (forward + backward) under either schedule,
# and each stage idles the share (p - 1) / (m + p - 1) of it: the bubble.
#
# A step also costs a fixed overhead (20-40 ms measured, 160 ms at worst, on a loaded 2-core
# machine) that the bound must absorb: 2 stages x 3 microbatches at 0.15 + 0.3 s leave it 129 ms
# (bubble 1/4, at most 0.3; one stage after another: 1/2), 4 stages x 4 microbatches at 0.1 + 0.2 s
# 370 ms (3/7, at most 0.51; one after another: 3/4). Three microbatches are the fewest with
# which 1F1B's stage 0 puts a backward between forwards (F0 F1 B0 F2 B1 B2).


@am.remote(propagate=lambda x, seconds: x)
def _takes(x: Any, seconds: float) -> Any:
    time.sleep(seconds)
    return x * 1


class _Slow(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any, forward_s: float, backward_s: float) -> Any:
        ctx.backward_s = backward_s
        return _takes(x, forward_s)

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:
        return _takes(g, ctx.backward_s), None, None


def _measured_bubble(meshes: list[Any], schedule: str, m: int, forward_s: float) -> float:
    backward_s = 2 * forward_s
    stages = [lambda h: _Slow.apply(h, forward_s, backward_s)] * len(meshes)
    x = am.distribute(torch.ones(m, 2, dtype=torch.float64), meshes[0]).requires_grad_()
    loss_fn = lambda out, target: out.sum()  # noqa: E731

    def step() -> None:  # waits for every stage: stage 0 makes the last gradient, x.grad
        loss = pipeline_step(stages, meshes, x, x, loss_fn, microbatches=m, schedule=schedule)
        inspect([loss, x.grad])

    best = float("inf")
    for _ in range(3):  # noise (and the first step's set-up) only adds time: keep the fastest
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return 1 - m * (forward_s + backward_s) / best


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_stages_run_at_the_same_time_and_the_bubble_matches_the_theory(
    procs: Any, schedule: str
) -> None:
    two = [procs.slice(pp=s) for s in range(2)]
    flat = procs.flatten("stage")
    four = [flat.slice(stage=slice(s, s + 1)) for s in range(4)]
    for meshes, m, forward_s in ((two, 3, 0.15), (four, 4, 0.1)):
        theory = bubble_fraction(len(meshes), m)
        measured = _measured_bubble(meshes, schedule, m, forward_s)
        # Within 20 % of the theory; one stage after another would idle (p - 1) / p.
        assert abs(measured - theory) <= 0.2 * theory, (len(meshes), measured, theory)


@am.remote(propagate=lambda x: x)
def _fails_on_dp1(x: Any) -> Any:
    if x.device_mesh.get_local_rank() == 1:
        raise ValueError("stage 1 broke on dp=1")
    return x * 1


class _FailsOnDp1(torch.autograd.Function):
    """An op of stage 1 that fails on its rank dp=1 (its gradient passes through)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return _fails_on_dp1(x)

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:
        return g


def test_a_failure_in_stage_one_names_its_rank_and_stage_zero_goes_on(
    procs: Any, unhandled_failures: list[Any]
) -> None:
    meshes = [procs.slice(pp=s) for s in range(2)]
    first, second = _layers([6, 8, 3])
    s0 = am.module_to_mesh(first, meshes[0])
    s1 = am.module_to_mesh(second, meshes[1])
    x, y = torch.randn(8, 6, dtype=torch.float64), torch.randn(8, 3, dtype=torch.float64)
    loss_fn = nn.functional.mse_loss
    pipeline_step([s0, s1], meshes, x, y, loss_fn, microbatches=2).item()  # warm: builds
    stages = [s0, lambda h: s1(_FailsOnDp1.apply(h))]
    start = time.monotonic()
    loss = pipeline_step(stages, meshes, x, y, loss_fn, microbatches=2)
    with pytest.raises(RemoteTensorError) as info:
        loss.item()
    assert info.value.rank == "{pp=1, dp=1}" and "_fails_on_dp1" in info.value.op
    # Each microbatch failed on its own: the loss holds the first failure (raised above); the
    # second, which nothing read, goes to the fault hook as the loss is fetched.
    assert [(e.rank, e.op) for e in unhandled_failures] == [(info.value.rank, info.value.op)]
    unhandled_failures.clear()
    # Stage 0 ran its backward on what came back (poisoned), and did not wait for it forever.
    with pytest.raises(RemoteTensorError, match="stage 1 broke"):
        inspect(dict(s0.named_parameters())["0.weight"].grad)
    assert torch.equal(inspect(dict(s0.named_parameters())["0.weight"]), first[0].weight)  # no step
    assert time.monotonic() - start < WAIT / 2


class _Peek(am.Actor):
    """Reads what the sidebar reads about the tensor engines of its process."""

    @am.endpoint
    def engines(self) -> list[str]:
        from actormesh.runtime.actors import local_actor_host
        from actormesh.tensor.tools import activity

        host = local_actor_host()
        assert host is not None
        found = [activity(r.instance) for r in list(host.actors.values())]
        return sorted(f for f in found if f is not None)


@am.remote(propagate=lambda x, path: x)
def _hold(x: Any, path: str) -> Any:
    deadline = time.monotonic() + 30
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # a poll of the test's gate, bounded
    return x * 1


def test_the_sidebar_says_which_mesh_and_stage_a_rank_serves(procs: Any, tmp_path: Path) -> None:
    meshes = [procs.slice(pp=s) for s in range(2)]
    gate = str(tmp_path / "go")
    x = am.distribute(torch.ones(2, 2, dtype=torch.float64), meshes[0]).requires_grad_()
    held = [lambda h: h * 2, lambda h: _Through.apply(h, _hold, gate)]
    loss = pipeline_step(held, meshes, x, x, lambda out, t: out.sum(), microbatches=1)
    peek = meshes[1].spawn("peek", _Peek)
    try:
        deadline = time.monotonic() + WAIT
        while True:  # the ranks of stage 1 run _hold until the gate opens
            seen = peek.engines.call().get(timeout=WAIT).values()
            if all(any("remote function _hold" in e for e in mine) for mine in seen):
                break
            assert time.monotonic() < deadline, seen
        for mine in seen:
            busy = [e for e in mine if "_hold" in e]
            assert busy[0].startswith("tensor engine (pp=1, stage 1 of 2): op "), mine
    finally:
        Path(gate).touch()
    assert loss.item() == 8.0


class _Through(torch.autograd.Function):
    """``fn(x, path)`` (a remote function of the ranks) in a stage, its gradient passed on."""

    @staticmethod
    def forward(ctx: Any, x: Any, fn: Any, path: str) -> Any:
        return fn(x, path)

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:
        return g, None, None


@am.remote(propagate=lambda x, path: x)
def _mark(x: Any, path: str) -> Any:
    Path(path).touch()
    return x * 1


def test_a_stage_starts_while_the_rest_of_the_step_is_recorded(
    procs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stage 0's first forward must reach its ranks as soon as it is recorded: waiting for the
    # whole schedule's recording put it on every step's critical path. No idle flush here (it
    # would send the ops after a pause in the recording, whatever pipeline_step did).
    from actormesh.tensor.controller import stream as stream_mod

    monkeypatch.setattr(stream_mod.Stream, "_start_timer", lambda self: None)
    meshes = [procs.slice(pp=s) for s in range(2)]
    ran = tmp_path / "stage-0-ran"
    seen: list[bool] = []

    def stage_1(h: Any) -> Any:  # recorded on the controller, after stage 0's forwards
        if not seen:
            deadline = time.monotonic() + 20
            while not ran.exists() and time.monotonic() < deadline:
                time.sleep(0.01)  # a poll of the ranks' mark, bounded
            seen.append(ran.exists())
        return h * 2

    x = am.distribute(torch.ones(4, 2, dtype=torch.float64), meshes[0]).requires_grad_()
    stages = [lambda h: _Through.apply(h, _mark, str(ran)), stage_1]
    loss = pipeline_step(stages, meshes, x, x, lambda out, t: out.sum(), microbatches=2)
    assert loss.item() == 8.0  # two microbatches of 2 x 2 ones, doubled, summed, averaged
    assert seen == [True]  # stage 0 ran before the step's recording was over
