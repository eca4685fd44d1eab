"""A controller-driven training step that costs what SPMD costs (issue 43), and stays the step of
one process: the optimizer's update as torch's foreach ops on the local shards."""

from __future__ import annotations

import copy
import itertools
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from differential import compare_training
from support import wait_until
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import actormesh as am
from actormesh.tensor import RemoteTensorError, distribute, inspect, module_to_mesh
from actormesh.tensor.controller import stream as stream_mod
from actormesh.tensor.controller.mesh import tensor_mesh


def mlp(width: int = 16, layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    sizes = [8] + [width] * (layers - 1) + [4]
    modules: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        modules += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*modules[:-1]).double()


def batches(steps: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches, then the first again (its loss must have gone down)."""
    g = torch.Generator().manual_seed(1)
    out = [(torch.randn(8, 8, generator=g).double(), torch.randn(8, 4, generator=g).double())
           for _ in range(steps)]  # fmt: skip
    return [*out, out[0]]


def mse(model: nn.Module, batch: Any) -> torch.Tensor:
    return F.mse_loss(model(batch[0]), batch[1])


def _ops_of_a_step(mesh: Any, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """How many ops the controller recorded for one ``optimizer.step()`` (after the first,
    which also creates the optimizer's state)."""
    stream = tensor_mesh(mesh).stream
    x, y = batches(1)[0]
    counts = []
    for _ in range(2):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        before = stream.recorded
        optimizer.step()
        counts.append(stream.recorded - before)
    return counts[1]


def test_adam_over_mesh_parameters_records_one_op_a_step_for_any_model_size(mesh: Any) -> None:
    # Before: torch's per-parameter loop (foreach=None on the CPU), 8 AdamW ops per parameter,
    # each decoded and run by every rank: 32 ops for 4 parameters, 64 for 8; then its foreach
    # step, 8 ops whatever the size; now those 8 in one op (wire/optim_ops.py).
    small = module_to_mesh(mlp(layers=2), mesh)
    large = module_to_mesh(mlp(layers=4), mesh)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (small, large)]
    counts = [_ops_of_a_step(mesh, m, o) for m, o in zip((small, large), optimizers, strict=True)]
    assert counts == [1, 1], counts
    # The choice is the step's only: the optimizer's own settings stay the user's, and its
    # state is torch's (the step counters too, on the controller as torch keeps them).
    assert all(group["foreach"] is None for o in optimizers for group in o.param_groups)
    state = optimizers[0].state_dict()["state"][0]
    assert sorted(state) == ["exp_avg", "exp_avg_sq", "step"]
    assert type(state["step"]) is torch.Tensor and state["step"].item() == 2.0
    # SGD's foreach step stays torch's foreach ops (a handful, whatever the size).
    sgd = torch.optim.SGD(small.parameters(), lr=1e-2, momentum=0.9)
    assert 1 < _ops_of_a_step(mesh, small, sgd) <= 4


def test_clip_grad_norm_over_mesh_parameters_records_the_same_ops_for_any_model_size(
    mesh: Any,
) -> None:
    # Before: torch's per-parameter path (MeshTensor was not among its foreach types), a norm
    # and a scale per parameter: 14 ops for 4 parameters, 22 for 8.
    stream = tensor_mesh(mesh).stream
    counts, norms = [], []
    for layers in (2, 4):
        local = mlp(layers=layers)
        model = module_to_mesh(copy.deepcopy(local), mesh, fsdp=True)
        x, y = batches(1)[0]
        F.mse_loss(model(x), y).backward()
        F.mse_loss(local(x), y).backward()
        before = stream.recorded
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1))
        counts.append(stream.recorded - before)
        expected = torch.nn.utils.clip_grad_norm_(local.parameters(), 0.1)
        assert torch.allclose(inspect(norms[-1]), expected, rtol=1e-12)
        for p, q in zip(model.parameters(), local.parameters(), strict=True):
            assert torch.allclose(inspect(p.grad), q.grad, rtol=1e-12, atol=1e-15)
    assert counts[0] == counts[1] <= 10, counts


def test_an_optimizer_that_chose_its_implementation_keeps_it(mesh: Any) -> None:
    model = module_to_mesh(mlp(layers=2), mesh)
    loop = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    assert _ops_of_a_step(mesh, model, loop) == 8 * 4


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True),
    "adam_l2_maximize": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, maximize=True),
    "sgd_nesterov": lambda p: torch.optim.SGD(
        p, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.01
    ),
}
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "fsdp": {"fsdp": True},
    "tp_plan": {"tp_plan": {"0": ColwiseParallel(), "2": RowwiseParallel()}},
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_foreach_step_on_the_shards_is_the_step_of_one_process(
    mesh: Any, name: str, mode: str
) -> None:
    # Each parameter's placements (replicated, split over dp by fsdp, split over tp by the
    # plan) reach the foreach ops of the update; float64, compared step by step.
    losses = compare_training(mlp, mesh, MODES[mode], batches(), mse, optimizer=OPTIMIZERS[name])
    # The first batch again: its loss went down (up, for the optimizer that maximizes).
    assert (losses[-1] > losses[0]) if "maximize" in name else (losses[-1] < losses[0])


def test_adam_over_tensors_placed_unlike_their_gradients_is_the_step_of_one_process(
    mesh: Any,
) -> None:
    # Parameters split by rows, their gradients replicated: the one op's lists are not placed
    # alike, so each rank runs the op's kernel on the DTensors (which redistribute); and a
    # group whose parameters are on two meshes records one op per mesh.
    other = mesh.slice(dp=0)
    g = torch.Generator().manual_seed(3)
    local = [torch.randn(8, 4, generator=g).double().requires_grad_() for _ in range(3)]
    grads = [torch.randn(8, 4, generator=g).double() for _ in range(3)]
    meshes = [mesh, mesh, other]
    meshed = [
        distribute(local[0].detach(), mesh, ("dp", None)).requires_grad_(),
        distribute(local[1].detach(), mesh).requires_grad_(),
        distribute(local[2].detach(), other).requires_grad_(),
    ]
    for p, grad, on in zip(meshed, grads, meshes, strict=True):
        p.grad = distribute(grad, on)
    for q, grad in zip(local, grads, strict=True):
        q.grad = grad.clone()
    optimizers = [torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1) for ps in (local, meshed)]
    for _ in range(3):
        for optimizer in optimizers:
            optimizer.step()
    for p, q in zip(meshed, local, strict=True):
        assert torch.equal(inspect(p), q.detach())


def test_adam_state_that_does_not_fit_raises_at_the_step_and_leaves_the_mesh_usable(
    mesh: Any,
) -> None:
    # A state_dict of another model: torch's own check runs at the user's line (on meta
    # tensors), nothing is sent, and the other parameters stay usable. And what torch's
    # function refuses (a float16 step counter) it still refuses, with its own message.
    p, q = (distribute(torch.randn(8, 4), mesh, ("dp", None)).requires_grad_() for _ in range(2))
    for x in (p, q):
        x.grad = distribute(torch.ones(8, 4), mesh, ("dp", None))
    optimizer = torch.optim.Adam([p, q], lr=1e-2)
    optimizer.step()
    before = inspect(q)
    state = optimizer.state_dict()
    state["state"][0]["exp_avg"] = distribute(torch.zeros(8, 2), mesh)
    optimizer.load_state_dict(state)
    with pytest.raises(RuntimeError) as raised:
        optimizer.step()
    assert "test_tensor_step.py" in "".join(traceback.format_tb(raised.value.__traceback__))
    assert torch.equal(inspect(q), before)
    half = torch.optim.Adam([q], lr=1e-2)
    half.step()
    half.state[q]["step"] = half.state[q]["step"].half()
    with pytest.raises(RuntimeError, match="float32/64"):
        half.step()


def test_a_tensor_learning_rate_keeps_torchs_own_choice(mesh: Any) -> None:
    # torch's foreach step refuses a tensor lr without capturable, so torch does not choose it
    # for such a group; neither does the hook (before, the step raised).
    model = module_to_mesh(mlp(layers=2), mesh)
    local = mlp(layers=2)
    optimizers = [torch.optim.Adam(m.parameters(), lr=torch.tensor(1e-2)) for m in (model, local)]
    x, y = batches(1)[0]
    for _ in range(2):
        for m, optimizer in zip((model, local), optimizers, strict=True):
            optimizer.zero_grad()
            F.mse_loss(m(x), y).backward()
            optimizer.step()
    got = inspect(dict(model.state_dict()))
    for name, want in local.state_dict().items():
        assert torch.allclose(got[name], want, atol=1e-12, rtol=0), name


def test_torchs_functional_adam_with_grad_on_raises_as_torch_does(mesh: Any) -> None:
    # torch.optim.Adam turns grad off for its step; the functional API called with grad on
    # writes leaves that require grad, which torch refuses (the one op would not).
    from torch.optim.adam import adam

    p = distribute(torch.randn(4), mesh).requires_grad_()
    args = [[p], [distribute(torch.ones(4), mesh)], [distribute(torch.zeros(4), mesh)]]
    args += [[distribute(torch.zeros(4), mesh)], [], [torch.tensor(0.0)]]
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        adam(*args, foreach=True, amsgrad=False, beta1=0.9, beta2=0.999, lr=1e-2,
             weight_decay=0.0, eps=1e-8, maximize=False)  # fmt: skip


# -- a repeated step sent by reference (controller/programs.py) --------------------------------


@pytest.fixture
def steps_as_batches(mesh: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No idle flush: each step's ops go at its sync point, whatever the load (the timer would
    cut a step wherever the recording thread paused, and a cut step is another program)."""
    s = tensor_mesh(mesh).stream
    s.flush()
    wait_until(lambda: s._timer is None, 10, "the stream's idle timer to end")
    monkeypatch.setattr(stream_mod.Stream, "_start_timer", lambda self: None)
    # Nor a step sent as the next begins, which only a host with a core per rank to spare does
    monkeypatch.setattr(s.steps, "each_step", False)
    yield
    s.flush()
    s.armed = False  # armed with no timer: the next op of a later test starts one


class Trainer:
    """One model on the mesh and its copy in this process, stepped alike (float64); each step
    compares the loss, and ``check_weights`` the parameters, with one process."""

    def __init__(self, mesh: Any, lr: float = 1e-2) -> None:
        self.local = mlp()
        self.meshed = module_to_mesh(copy.deepcopy(self.local), mesh)
        self.optimizers = [torch.optim.AdamW(m.parameters(), lr=lr) for m in self.models]
        self.programs = tensor_mesh(mesh).stream.programs

    @property
    def models(self) -> tuple[nn.Module, nn.Module]:
        return self.local, self.meshed

    def step(self, x: torch.Tensor, y: torch.Tensor, double: bool = False) -> None:
        losses = []
        for model, optimizer in zip(self.models, self.optimizers, strict=True):
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            if double:  # an `if` on the controller: other ops in the step
                loss = loss * 2
            loss.backward()
            optimizer.step()
            losses.append(loss.item())  # a sync point every step, as T1
        assert losses[1] == pytest.approx(losses[0], abs=1e-12, rel=0), losses

    def check_weights(self) -> None:
        got = inspect(dict(self.meshed.state_dict()))
        for name, want in self.local.state_dict().items():
            assert torch.allclose(got[name], want, atol=1e-12, rtol=0), name

    def by_reference(self, *steps: Callable[[], None]) -> list[int]:
        """For each step run: how many runs went by reference during it."""
        out = []
        for step in steps:
            before = self.programs.sent
            step()
            out.append(self.programs.sent - before)
        return out


WARM = 5  # steps after which a step repeats: the first creates the optimizer's state, and an
# op's first signature goes the recorder's general path once, so the next step differs again


def test_a_repeated_step_is_sent_by_reference_and_stays_the_step_of_one_process(
    mesh: Any, steps_as_batches: None
) -> None:
    trainer = Trainer(mesh)
    x, y = batches(1)[0]
    sent = trainer.by_reference(*[lambda: trainer.step(x, y)] * WARM)
    # A structure seen once goes op by op, the second time it defines the program on the ranks
    # (sent with its ops), later it goes by reference.
    assert sent[-2:] == [1, 1], sent
    trainer.check_weights()


def test_a_new_shape_is_another_program(mesh: Any, steps_as_batches: None) -> None:
    trainer = Trainer(mesh)
    (x, y), (x2, y2) = batches(1)[0], (torch.randn(16, 8).double(), torch.randn(16, 4).double())
    assert trainer.by_reference(*[lambda: trainer.step(x, y)] * WARM)[-1] == 1
    # 16 rows instead of 8: other shapes in the step, never run as the program of 8 rows (first
    # as it is, then a program of its own); then 8 rows again, by reference at once.
    wide = trainer.by_reference(*[lambda: trainer.step(x2, y2)] * 4)
    assert wide[0] == 0 and wide[-1] == 1, wide
    assert trainer.by_reference(lambda: trainer.step(x, y)) == [1]
    trainer.check_weights()


def test_an_if_on_the_controller_is_another_program(mesh: Any, steps_as_batches: None) -> None:
    trainer = Trainer(mesh)
    x, y = batches(1)[0]
    plain, double = (lambda: trainer.step(x, y)), (lambda: trainer.step(x, y, double=True))
    assert trainer.by_reference(*[plain] * WARM)[-1] == 1
    sent = trainer.by_reference(double, double, double, double)
    assert sent[0] == 0 and sent[-1] == 1, sent
    assert trainer.by_reference(plain, double, plain, double) == [1, 1, 1, 1]
    trainer.check_weights()


def test_a_changed_learning_rate_is_carried_by_the_program(
    mesh: Any, steps_as_batches: None
) -> None:
    trainer = Trainer(mesh)
    x, y = batches(1)[0]

    def lower_then_step() -> None:
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                group["lr"] *= 0.5
        trainer.step(x, y)

    assert trainer.by_reference(*[lambda: trainer.step(x, y)] * WARM)[-1] == 1
    # A learning rate is a value of the step (as AdamW's bias corrections, which change every
    # step), not its structure: the runs stay by reference, each with its step's rate.
    assert trainer.by_reference(*[lower_then_step] * 3) == [1, 1, 1]
    trainer.check_weights()


def test_a_step_that_read_nothing_goes_to_the_ranks_when_the_next_begins(
    mesh: Any, steps_as_batches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loop that logs its loss every few steps, on a host with a core per rank to spare: a
    # finished step would otherwise wait in the buffer for BATCH_OPS ops or the next read, the
    # ranks idle while the controller records the next.
    trainer = Trainer(mesh)
    stream = tensor_mesh(mesh).stream
    monkeypatch.setattr(stream.steps, "each_step", True)
    x, y = batches(1)[0]

    def step(read_before_update: bool = False) -> tuple[int, bool, int]:
        """Both models one step: the messages to the ranks and the runs sent by reference
        while the meshed one stepped, and whether its step stayed buffered."""
        for model, optimizer in zip(trainer.models, trainer.optimizers, strict=True):
            sent, by_reference = stream.batches, trainer.programs.sent
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            if read_before_update:
                loss.item()
            optimizer.step()
        return stream.batches - sent, bool(stream.ops), trainer.programs.sent - by_reference

    for _ in range(WARM):
        trainer.step(x, y)  # a read after each update: one message a step, at the read
    # The first step without a read stays buffered; each later one sends the one before as it
    # begins: a structure of its own (its ops' lines are this function's), seen once, then
    # defined on the ranks, then sent by reference.
    runs = [step() for _ in range(5)]
    assert runs == [(0, True, 0), (1, True, 0), (1, True, 0), (1, True, 1), (1, True, 1)], runs
    # Reading before the update: the update goes with the next step's read, one message a step
    # (the first step also sends the last one without a read, as it begins).
    runs = [step(read_before_update=True) for _ in range(4)]
    assert [sent for sent, _, _ in runs] == [2, 1, 1, 1], runs
    trainer.step(x, y)  # the losses agree with one process's
    trainer.check_weights()


def test_a_failure_inside_a_program_names_the_rank_the_op_and_the_line(
    mesh: Any, steps_as_batches: None
) -> None:
    divisor = distribute(torch.tensor([4, 9, 9, 9]), mesh, sharding_spec=["dp"])
    count = distribute(torch.zeros(4, dtype=torch.long), mesh, sharding_spec=["dp"])
    programs = tensor_mesh(mesh).stream.programs
    for step in range(4):
        before = programs.sent
        count += 1
        x = ((count * 3 + 1) * 2 - 2) // 2 + 0
        line = sys._getframe().f_lineno + 1
        q = x // (divisor - count)  # at step 4, a division by zero in row 0: ranks dp=0 only
        if step < 3:
            assert torch.equal(
                inspect(q), (3 * (step + 1)) // (torch.tensor([4, 9, 9, 9]) - step - 1)
            )
    with pytest.raises(RemoteTensorError) as info:
        inspect(q)
    assert programs.sent == before + 1  # the failing step went by reference
    error = info.value
    assert error.ranks == ["{dp=0, tp=0}", "{dp=0, tp=1}"], error.ranks
    assert "floor_divide" in error.op, error.op
    assert f"test_tensor_step.py:{line}" in str(error), str(error)
    count.zero_()  # the mesh stays usable
    assert torch.equal(inspect(divisor - count), torch.tensor([4, 9, 9, 9]))


@pytest.mark.parametrize(
    "size", [(32, 6), (-1, 6), (8, 24), (2, 4, 4, 6), (4, 8, 6), (6, 32), (1, 192), (192,)]
)
def test_a_view_of_a_batch_split_by_rows_is_the_view_of_one_process(
    mesh: Any, size: tuple[int, ...]
) -> None:
    # The shard path takes the views whose dim 0 splits into as many equal blocks as the rows
    # (each rank's block is one contiguous run, in both); DTensor the others ((1, 192), (192,)).
    x = torch.arange(8 * 4 * 6, dtype=torch.float64).reshape(8, 4, 6)
    for spec in (["dp", None, None], [None, None, None]):
        split = distribute(x, mesh, sharding_spec=spec)
        viewed = split.view(size)
        assert torch.equal(inspect(viewed), x.view(size)), (spec, size)
        assert torch.equal(inspect(viewed * 2), x.view(size) * 2)


def test_ops_with_no_outputs_are_told_apart_by_their_arguments(
    mesh: Any, steps_as_batches: None
) -> None:
    # An in-place _foreach_ op has no outputs, so its plan's meta is the one empty tuple: keyed
    # by it, adding 2 looked like the program of adding 1 from the same line (and with the
    # protocol check off, would have added 1).
    ts = [distribute(torch.zeros(4), mesh) for _ in range(2)]
    for k in (1, 1, 1, 2, 2, 2, 1):
        for _ in range(8):
            torch._foreach_add_(ts, k)
        inspect(ts[0])
    assert torch.equal(inspect(ts[1]), torch.full((4,), 8.0 * 10))


class Collector(am.Actor):
    @am.endpoint
    def frozen(self) -> int:
        import gc

        return gc.get_freeze_count()


def test_a_built_module_leaves_the_ranks_collector_out_of_what_was_loaded(mesh: Any) -> None:
    # GPT-2's step on a rank paid a full collection of everything torch and transformers
    # loaded every ten steps (120 ms, a quarter of its CPU): frozen once the module is built.
    collector = mesh.spawn("collector", Collector)
    before = list(collector.frozen.call().get(timeout=60).values())  # frozen at its start
    module_to_mesh(mlp(), mesh)
    after = list(collector.frozen.call().get(timeout=60).values())
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


def test_the_first_program_leaves_the_ranks_collector_out_of_what_the_first_steps_made(
    spawn_procs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the first steps leave alive (lazily imported modules, DTensor's caches, the compiled
    # steps) was walked by every full collection after the build's freeze (T1: 23 ms every
    # hundred steps): frozen too, once, when the first program is defined. A mesh of its own:
    # the package's mesh has defined programs already.
    procs = spawn_procs(per_host={"dp": 2})
    monkeypatch.setattr(stream_mod.Stream, "_start_timer", lambda self: None)
    collector = procs.spawn("collector", Collector)
    trainer = Trainer(procs)
    built = list(collector.frozen.call().get(timeout=60).values())
    x, y = batches(1)[0]
    sent = trainer.by_reference(*[lambda: trainer.step(x, y)] * WARM)
    assert sent[-2:] == [1, 1], sent  # the program was defined, then run by reference
    after = list(collector.frozen.call().get(timeout=60).values())
    assert all(a > b for a, b in zip(after, built, strict=True)), (built, after)
    trainer.check_weights()
