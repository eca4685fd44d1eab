"""A program's steps run on the local tensors once their first run has shown how
(``worker/lowered.py``, issue 43), and the gradient sync's plan (``worker/module.py``): each
checked on the ranks, where they run, and against one process."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from test_tensor_step import WARM, Trainer, batches, steps_as_batches  # noqa: F401  (fixture)

import actormesh as am
from actormesh.tensor import RemoteTensorError, distribute, inspect
from actormesh.tensor.controller.mesh import tensor_mesh


class Steps(am.Actor):
    """What this rank's engine knows about its programs, and its guards tried on real DTensors."""

    def __init__(self, key: str) -> None:
        self.key = key  # the engine of the package's mesh (a process may hold others' too)

    def _engine(self) -> Any:
        from actormesh.tensor.worker.local import REGISTRY

        return REGISTRY[self.key]

    @am.endpoint
    def lowered(self) -> dict[str, int]:
        """Per op name, how many steps of this rank's programs run on the local tensors."""
        out: dict[str, int] = {}
        for program in self._engine().programs.values():
            for step in program.steps:
                if step.lowered is not None:
                    out[step.name[0]] = out.get(step.name[0], 0) + 1
        return out

    @am.endpoint
    def named(self, kind: str) -> set[str]:
        """The ops of this rank's programs that are ``kind``: ``general`` (the general path's,
        run by their route), ``direct`` (run from the program, not rebuilt as sent)."""
        return {
            step.name[0]
            for program in self._engine().programs.values()
            for step in program.steps
            if getattr(step, kind)
        }

    @am.endpoint
    def compared_contiguous(self) -> list[bool]:
        """Whether a comparison of a transposed partial sum all-reduces contiguous tensors
        (NCCL refuses others; gloo, here, takes them)."""
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor, Partial, Replicate

        from actormesh.tensor.worker import shard_ops

        local = torch.arange(12.0).reshape(3, 4).t()
        x = DTensor.from_local(local, self._engine().mesh, [Replicate(), Partial("sum")])
        seen, real = [], dist.all_reduce

        def all_reduce(t: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(t.is_contiguous())
            return real(t, *args, **kwargs)

        dist.all_reduce = all_reduce
        try:
            gt = torch.ops.aten.gt.Scalar
            shard_ops.route_for("aten.gt.Scalar", gt)(gt, (x, 0.0), {})
        finally:
            dist.all_reduce = real
        return seen

    @am.endpoint
    def chunked(self) -> list[list[str]]:
        """Per chunk of this rank's programs (``worker/chunks.py``), its steps' op names."""
        return [
            [step.name[0] for step in program.steps[chunk.start : chunk.stop]]
            for program in self._engine().programs.values()
            for chunk in (program.chunks or {}).values()
        ]

    @am.endpoint
    def guards(self) -> dict[str, bool]:
        from torch.distributed.tensor import Replicate, Shard

        from actormesh.tensor.worker import shard_ops
        from actormesh.tensor.worker.dtensors import as_dtensor, wrap
        from actormesh.tensor.worker.lowered import lower, release

        mesh = self._engine().mesh
        whole = [Replicate(), Replicate()]
        x = as_dtensor(torch.arange(16.0).reshape(4, 4), mesh, whole)
        y = as_dtensor(torch.ones(4, 4), mesh, whole)
        add = torch.ops.aten.add.Tensor
        route = shard_ops.route_for("aten.add.Tensor", add)
        low = lower(add, route, [x, y], [x, y], ((x, y), {}), route(add, (x, y), {}))
        target = as_dtensor(torch.zeros(4, 4), mesh, whole)
        in_place = torch.ops.aten.add_.Tensor
        route_ = shard_ops.route_for("aten.add_.Tensor", in_place)
        wrote = lower(
            in_place,
            route_,
            [target, y],
            [target, y],
            ((target, y), {}),
            route_(in_place, (target, y), {}),
        )
        assert low is not None and wrote is not None
        env = {
            1: x,
            2: y,
            3: as_dtensor(torch.ones(2, 4), mesh, [Shard(0), Replicate()], (4, 4), (4, 1)),
            4: torch.ones(4, 4),
            # the same spec (the same object) over a transposed local tensor: other strides
            5: wrap(torch.ones(4, 4).t().contiguous().t(), y._spec),
            10: target,
        }
        made = torch.full((4, 4), 3.0)
        locals_ = low.locals_of((1, 2), env, {})
        assert locals_ is not None
        held: dict[int, Any] = {}
        dense = torch.zeros(4, 4)
        other = torch.empty_strided((4, 4), (1, 4))  # laid out unlike the first run's result
        kept_other = low.keep(other, locals_, (1, 2), (9,), env, held) or bool(held)
        kept_dense = low.keep(dense, locals_, (1, 2), (9,), env, held)
        held_dense = held.get(9, (None, None))
        wrote_kept = wrote.keep(target._local_tensor, [target._local_tensor, y._local_tensor],
                                (10, 2), (11,), env, held)  # fmt: skip
        release([9], env, held)
        return {
            "same specs run on the locals": locals_ == [x._local_tensor, y._local_tensor],
            "another spec runs the route": low.locals_of((3, 2), env, {}) is None,
            "a plain tensor runs the route": low.locals_of((4, 2), env, {}) is None,
            "other local strides run the route": low.locals_of((1, 5), env, {}) is None,
            "a value a lowered step made is taken as it is": (
                low.locals_of((7, 2), env, {7: (made, x._spec)}) == [made, y._local_tensor]
            ),
            "a made value of another spec runs the route": (
                low.locals_of((7, 2), env, {7: (made, env[3]._spec)}) is None
            ),
            "a result laid out otherwise runs the route, nothing kept": not kept_other,
            "a result as on the first run is kept with its spec": (
                kept_dense and held_dense[0] is dense and held_dense[1] is x._spec
            ),
            "a kept result becomes a DTensor when released": (
                env[9]._local_tensor is dense and env[9]._spec is x._spec
            ),
            "an in-place result is its input": wrote_kept and env[11] is target,
        }

    @am.endpoint
    def loss_guards(self) -> dict[str, bool]:
        """mse_loss and its backward lowered with a controller tensor as the target."""
        from torch.distributed.tensor import Replicate, Shard

        from actormesh.tensor.worker import shard_ops
        from actormesh.tensor.worker.dtensors import as_dtensor
        from actormesh.tensor.worker.lowered import lower

        mesh = self._engine().mesh
        rows = [Shard(0), Replicate()]  # the batch split over dp
        whole = torch.arange(32.0).reshape(8, 4) / 7
        me = mesh.get_local_rank("dp")
        x = as_dtensor(whole[4 * me : 4 * me + 4] * 1.5, mesh, rows, (8, 4), (4, 1))
        target = torch.linspace(-1, 1, 32).reshape(8, 4)  # every rank holds all of it
        loss = torch.ops.aten.mse_loss.default
        route = shard_ops.route_for("aten.mse_loss.default", loss)
        first = route(loss, (x, target, 1), {})
        low = lower(loss, route, [x, target], [x, target], ((x, target, 1), {}), first)
        assert low is not None
        env = {
            1: x,
            2: target,
            3: target.double(),
            4: torch.zeros(4, 4),
            5: target.t().contiguous().t(),
        }
        locals_ = low.locals_of((1, 2), env, {})
        assert locals_ is not None
        again = low.local_op(*locals_, 1)
        seed = torch.ones((), dtype=torch.float32)
        grad = as_dtensor(seed, mesh, [Replicate(), Replicate()])
        backward = torch.ops.aten.mse_loss_backward.default
        route_b = shard_ops.route_for("aten.mse_loss_backward.default", backward)
        first_b = route_b(backward, (grad, x, target, 1), {})
        ins_b = [grad, x, target]
        low_b = lower(backward, route_b, ins_b, ins_b, ((grad, x, target, 1), {}), first_b)
        assert low_b is not None
        again_b = low_b.local_op(seed, x._local_tensor, target, 1)
        summed = route(loss, (x, target, 2), {})  # reduction="sum"
        none = shard_ops.route_for("aten.mse_loss.default", loss)(loss, (x, target, 0), {})
        return {
            "the lowered loss is the route's": torch.equal(again, first._local_tensor),
            "the lowered backward is the route's": torch.equal(again_b, first_b._local_tensor),
            "a target of another dtype runs the route": low.locals_of((1, 3), env, {}) is None,
            "a target of another shape runs the route": low.locals_of((1, 4), env, {}) is None,
            "a target of other strides runs the route": low.locals_of((1, 5), env, {}) is None,
            "a sum is lowered as a sum": torch.equal(
                lower(loss, route, [x, target], [x, target], ((x, target, 2), {}), summed).local_op(
                    x._local_tensor, target, 2
                ),
                summed._local_tensor,
            ),
            # reduction="none": the loss's route declines, another takes it, nothing is lowered
            "a loss the route declined is not lowered by its form": lower(
                loss, route, [x, target], [x, target], ((x, target, 0), {}), none
            )
            is None,
        }

    @am.endpoint
    def cat_guards(self) -> dict[str, bool]:
        """``cat`` past an empty cache (Hugging Face's), lowered where the locals join alike."""
        from torch.distributed.tensor import Replicate, Shard

        from actormesh.tensor.worker import aten, shard_ops
        from actormesh.tensor.worker.dtensors import as_dtensor
        from actormesh.tensor.worker.lowered import lower

        engine = self._engine()
        mesh = engine.mesh
        me = mesh.get_local_rank("dp")
        whole = torch.arange(48.0).reshape(4, 3, 4)
        x = as_dtensor(whole[2 * me : 2 * me + 2], mesh, [Shard(0), Replicate()], (4, 3, 4))
        cat = torch.ops.aten.cat.default
        route = shard_ops.route_for("aten.cat.default", cat)

        def lowered(dim: int) -> Any:
            empty = torch.tensor([])  # a controller tensor, lifted for the route
            taken = aten.lift_inputs(engine, [empty, x])
            result = route(cat, (taken, dim), {})
            low = lower(cat, route, [empty, x], taken, ((taken, dim), {}), result)
            return low, result, empty

        low, result, empty = lowered(-2)
        along_rows = lowered(0)[0]  # joined along the split dim: DTensor's own cat
        return {
            "past an empty cache, the locals joined": low is not None
            and torch.equal(low.local_op([empty, x._local_tensor], -2), result._local_tensor),
            "the result is the local rows": torch.equal(
                result._local_tensor, whole[2 * me : 2 * me + 2]
            ),
            "not lowered along the split dim": along_rows is None,
        }

    @am.endpoint
    def dtypes(self, id: int) -> tuple[str, str]:
        """Value ``id``'s dtype as its spec says, and its local tensor's."""
        value = self._engine().env[id]
        return str(value._spec.tensor_meta.dtype), str(value._local_tensor.dtype)

    @am.endpoint
    def summed_layouts(self) -> list[bool]:
        """Gradients summed over the data dimension keep their layouts (dense and not)."""
        from actormesh.tensor.worker.module import _all_reduce

        engine = self._engine()
        group = engine.mesh.get_group("dp")
        dense, odd = torch.ones(3, 4), torch.arange(12.0).reshape(4, 3).t()
        sliced = torch.arange(24.0).reshape(4, 6)[:, 1:4]  # not a run of its storage: copied
        out = _all_reduce([dense, odd, sliced], [group])
        return [
            out[0].stride() == dense.stride() and bool((out[0] == 2).all()),
            out[1].stride() == odd.stride() and torch.equal(out[1], odd * 2),
            out[0].data_ptr() != dense.data_ptr(),  # a new tensor, not the gradient's memory
            out[1].data_ptr() != odd.data_ptr(),
            torch.equal(out[2], sliced * 2),
        ]


def _chunks_of(mesh: Any, name: str) -> dict[Any, list[list[str]]]:
    steps = mesh.spawn(name, Steps, tensor_mesh(mesh).key)
    return steps.chunked.call().get(timeout=60)


@pytest.mark.usefixtures("steps_as_batches")
def test_a_programs_steps_run_on_the_local_tensors_after_their_first_run(mesh: Any) -> None:
    trainer = Trainer(mesh)
    x, y = batches(1)[0]
    for _ in range(WARM + 2):
        trainer.step(x, y)  # each compared with one process
    trainer.check_weights()
    steps = mesh.spawn("lowered_steps", Steps, tensor_mesh(mesh).key)
    for rank, lowered in steps.lowered.call().get(timeout=60).items():
        # the linear layers' ops, the activation and AdamW's step (one op, optim_ops.py); the
        # loss, its gradient's seed and its backward, by their routes' own forms (the sum over
        # the local blocks of the controller's target, divided by the global count)
        for name in (
            "aten.t.default", "aten.addmm.default", "actormesh.adam_.default",
            "aten.mse_loss.default", "aten.ones_like.default", "aten.mse_loss_backward.default",
        ):  # fmt: skip
            assert lowered.get(name, 0) >= 1, (rank, lowered)
    for rank, chunks in _chunks_of(mesh, "training_chunks").items():
        # consecutive lowered steps run as one function each (chunks.py): the forward's linear
        # layers and activation, the backward's matrix products among them
        names = {name for chunk in chunks for name in chunk}
        assert {"aten.addmm.default", "aten.relu.default", "aten.mm.default"} <= names, rank
        assert "aten.mse_loss_backward.default" in names, (rank, chunks)
        assert all(len(chunk) >= 2 for chunk in chunks), (rank, chunks)


def test_a_lowered_step_runs_its_route_for_inputs_laid_out_otherwise(mesh: Any) -> None:
    tensor_mesh(mesh)  # the ranks' engines (started on a mesh's first tensor op)
    steps = mesh.spawn("lowered_guards", Steps, tensor_mesh(mesh).key)
    for rank, checks in steps.guards.call().get(timeout=60).items():
        assert all(checks.values()), (rank, checks)


def test_a_lowered_loss_takes_the_controllers_target_as_the_route_does(mesh: Any) -> None:
    tensor_mesh(mesh)
    steps = mesh.spawn("loss_guards", Steps, tensor_mesh(mesh).key)
    for rank, checks in steps.loss_guards.call().get(timeout=60).items():
        assert all(checks.values()), (rank, checks)


def test_a_concatenation_past_an_empty_cache_is_lowered_where_the_locals_join(mesh: Any) -> None:
    tensor_mesh(mesh)
    steps = mesh.spawn("cat_guards", Steps, tensor_mesh(mesh).key)
    for rank, checks in steps.cat_guards.call().get(timeout=60).items():
        assert all(checks.values()), (rank, checks)


def test_summed_gradients_keep_their_layouts(mesh: Any) -> None:
    tensor_mesh(mesh)
    steps = mesh.spawn("summed_layouts", Steps, tensor_mesh(mesh).key)
    for rank, checks in steps.summed_layouts.call().get(timeout=60).items():
        assert all(checks), (rank, checks)


@pytest.mark.usefixtures("steps_as_batches")
def test_a_value_a_program_made_stays_for_a_later_op_of_its_batch(mesh: Any) -> None:
    # The program's last value is freed on the controller before the batch goes, and an op
    # after the program (past the step's mark) reads it: the batch drops it only after its ops.
    w = distribute(torch.arange(4.0, dtype=torch.float64), mesh)
    stream = tensor_mesh(mesh).stream
    sent = stream.programs.sent
    totals = []
    for _ in range(WARM):
        v = w
        for _ in range(10):
            v = v * 1.5
        stream.mark()
        last = v.detach()
        del v
        totals.append(last.sum().item())
    assert stream.programs.sent - sent >= 2  # run by reference, the steps lowered
    want = float((torch.arange(4.0, dtype=torch.float64) * 1.5**10).sum())
    assert totals == [want] * WARM


@pytest.mark.usefixtures("steps_as_batches")
def test_views_run_on_the_local_tensors_with_their_local_sizes(mesh: Any) -> None:
    # Views of a batch split by rows (each rank views its rows: sizes other than the op's),
    # of one split by rows that keep dim 0, and of a replicated tensor; each step's values
    # against one process, where a lowered view that kept the global sizes would raise or
    # give other numbers.
    torch.manual_seed(0)
    x, w = torch.randn(8, 6, dtype=torch.float64), torch.randn(6, 6, dtype=torch.float64)
    rows = distribute(x, mesh, sharding_spec=["dp", None])
    whole = distribute(w, mesh)
    stream = tensor_mesh(mesh).stream

    def step(a: Any, b: Any, k: float) -> Any:
        flat = (a * k).view(48)  # split by rows: each rank views its 24
        heads = flat.view(8, 2, 3).view(8, 6)  # keeps dim 0
        return heads + b.view(36).view(6, 6)[0]

    sent = stream.programs.sent
    for i in range(WARM + 2):
        got = step(rows, whole, 1.0 + i).detach()
        stream.mark()
        assert torch.equal(got.get(), step(x, w, 1.0 + i)), i
    assert stream.programs.sent - sent >= 2
    steps = mesh.spawn("lowered_views", Steps, tensor_mesh(mesh).key)
    for rank, lowered in steps.lowered.call().get(timeout=60).items():
        assert lowered.get("aten.view.default", 0) >= 4, (rank, lowered)


def test_a_loss_of_mixed_dtypes_has_the_dtype_of_its_values(mesh: Any) -> None:
    # mse_loss of a float32 input and a float64 target (a controller tensor) is a float64 sum:
    # its spec said float32 (the input's), over a float64 local tensor.
    x, target = torch.randn(8, 4), torch.randn(8, 4, dtype=torch.float64)
    loss = torch.nn.functional.mse_loss(distribute(x, mesh, sharding_spec=["dp", None]), target)
    assert torch.allclose(am.tensor.inspect(loss), torch.nn.functional.mse_loss(x, target))
    steps = mesh.spawn("loss_dtypes", Steps, tensor_mesh(mesh).key)
    for rank, dtypes in steps.dtypes.call(loss.value_id).get(timeout=60).items():
        assert dtypes == ("torch.float64", "torch.float64"), (rank, dtypes)


@pytest.mark.usefixtures("steps_as_batches")
def test_a_program_wired_otherwise_than_its_chunk_runs_step_by_step(mesh: Any) -> None:
    # The same ops from the same lines (one program) where the add reads the step's own
    # product in some runs and another tensor in others: a chunk that kept its first run's
    # wiring would add the product every time.
    torch.manual_seed(0)
    a, b = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 4, dtype=torch.float64)
    on_a, on_b = (
        distribute(a, mesh, sharding_spec=["dp", None]),
        distribute(b, mesh, sharding_spec=["dp", None]),
    )
    stream = tensor_mesh(mesh).stream

    def step(x: Any, other: Any, k: float, use_product: bool) -> Any:
        product = x * k
        out = (product if use_product else other) + x
        for _ in range(6):
            out = out * 1.5
        return out

    sent = stream.programs.sent
    for i, use_product in enumerate([True] * WARM + [False, True, False, False, True] * 2):
        got = step(on_a, on_b, 1.0 + i, use_product).detach()
        stream.mark()
        assert torch.equal(got.get(), step(a, b, 1.0 + i, use_product)), (i, use_product)
    assert stream.programs.sent - sent >= 10  # one program, by reference


@pytest.mark.usefixtures("steps_as_batches")
def test_a_step_that_fails_inside_a_chunk_fails_as_it_would_alone(mesh: Any) -> None:
    # At the fourth step, rows 0 divide by zero: the ranks at dp=0 fail that step alone; what
    # the chunk made before it, and what its steps after it make from other values, stand.
    divisor = distribute(torch.tensor([4, 9, 9, 9]), mesh, sharding_spec=["dp"])
    count = distribute(torch.zeros(4, dtype=torch.long), mesh, sharding_spec=["dp"])
    stream = tensor_mesh(mesh).stream
    for step in range(4):
        sent = stream.programs.sent
        count += 1
        before = (count * 3 + 1) * 2 - 2
        line = sys._getframe().f_lineno + 1
        quotient = torch.div(before, divisor - count, rounding_mode="floor")
        after = (before + 1) * 2
        stream.mark()
        n = step + 1
        assert torch.equal(inspect(before), torch.full((4,), 6 * n))
        assert torch.equal(inspect(after), torch.full((4,), 12 * n + 2))
        if step < 3:
            want = (6 * n) // (torch.tensor([4, 9, 9, 9]) - n)
            assert torch.equal(inspect(quotient), want)
    assert stream.programs.sent == sent + 1  # the failing run went by reference
    with pytest.raises(RemoteTensorError) as info:
        inspect(quotient)
    error = info.value
    assert error.ranks == ["{dp=0, tp=0}", "{dp=0, tp=1}"], error.ranks
    assert "div.Tensor_mode" in error.op, error.op
    assert f"test_lowered.py:{line}" in str(error), str(error)
    for rank, chunks in _chunks_of(mesh, "failing_chunks").items():
        assert any("aten.div.Tensor_mode" in chunk for chunk in chunks), (rank, chunks)
    count.zero_()  # the mesh stays usable
    assert torch.equal(inspect(divisor - count), torch.tensor([4, 9, 9, 9]))


@pytest.mark.usefixtures("steps_as_batches")
def test_a_loss_of_a_controller_target_runs_by_its_route_or_as_sent(mesh: Any) -> None:
    # mse_loss and its backward against a controller tensor (the general path's ops) run from
    # the program by their route, then lowered by its local form; one the route declines (no
    # reduction) runs as it was sent.
    torch.manual_seed(0)
    x, target = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 4, dtype=torch.float64)
    w = torch.randn(4, 4, dtype=torch.float64)
    on_x = distribute(x, mesh, sharding_spec=["dp", None])
    stream = tensor_mesh(mesh).stream

    def step(a: Any, weight: Any, k: float) -> tuple[Any, Any]:
        out = a @ weight * k
        loss = torch.nn.functional.mse_loss(out, target)
        each = torch.nn.functional.mse_loss(out, target, reduction="none")
        return (loss * 2 + 1) * 3 - 1, (each * 2 + 1) * 3 - 1

    sent = stream.programs.sent
    on_w = distribute(w, mesh).requires_grad_()
    here = w.clone().requires_grad_()
    for i in range(WARM + 2):
        loss, each = step(on_x, on_w, 1.0 + i)
        loss.backward()
        stream.mark()
        want_loss, want_each = step(x, here, 1.0 + i)
        want_loss.backward()
        assert torch.allclose(inspect(loss), want_loss.detach(), rtol=1e-12, atol=0), i
        assert torch.equal(inspect(each), want_each.detach()), i
        assert torch.allclose(inspect(on_w.grad), here.grad, rtol=1e-12, atol=0), i
    assert stream.programs.sent - sent >= 2
    steps = mesh.spawn("losses_by_route", Steps, tensor_mesh(mesh).key)
    for rank, names in steps.named.call("general").get(timeout=60).items():
        assert {"aten.mse_loss.default", "aten.mse_loss_backward.default"} <= names, (rank, names)
    for rank, lowered in steps.lowered.call().get(timeout=60).items():  # by the route's form
        assert "aten.mse_loss_backward.default" in lowered, (rank, lowered)


@pytest.mark.usefixtures("steps_as_batches")
def test_controller_tensors_and_keywords_of_each_run_are_taken_from_the_program(
    mesh: Any,
) -> None:
    # Ops of controller tensors (a mask, a tensor changed in place between runs, the empty
    # cache a concatenation starts from), named before the mesh values they meet, and the
    # attention's mask and scale as keywords (the scale a float of each run): run from the
    # program, with what each run gave them.
    torch.manual_seed(0)
    x = torch.randn(4, 2, 8, 4)  # (batch, heads, positions, features)
    on_x = distribute(x, mesh, sharding_spec=["dp", None, None, None])
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    shift, empty = torch.zeros(8, 4), torch.zeros(4, 2, 0, 4)
    stream = tensor_mesh(mesh).stream

    def step(a: Any, k: float) -> Any:
        shifted = shift + a  # (a new copy of shift each run: the program's ops come after it)
        seen = torch.nn.functional.scaled_dot_product_attention(
            shifted * k, a, a, attn_mask=mask, scale=0.1 * k
        )
        kept = torch.where(mask[:, :4], seen, shifted)
        return (torch.cat([empty, kept], dim=-2) * 2 + 1) * 3 - 1

    sent = stream.programs.sent
    for i in range(WARM + 2):
        shift.add_(1.0)
        got = step(on_x, 1.0 + i)
        stream.mark()
        assert torch.allclose(inspect(got), step(x, 1.0 + i), rtol=1e-6, atol=1e-6), i
    assert stream.programs.sent - sent >= 2
    steps = mesh.spawn("direct_steps", Steps, tensor_mesh(mesh).key)
    taken = {
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        "aten.add.Tensor",
        "aten.where.self",
        "aten.cat.default",
    }
    for rank, names in steps.named.call("direct").get(timeout=60).items():
        assert taken <= names, (rank, taken - names)


@pytest.mark.usefixtures("steps_as_batches")
def test_ops_of_controller_tensors_are_lowered_and_take_each_runs_own(mesh: Any) -> None:
    # A controller tensor changed in place between runs (uploaded again each run) and one
    # kept (pooled), each read by an op of mesh values: lowered after the first run, the
    # controller tensor taken as it is (the Replicate DTensor's local tensor it stood for).
    torch.manual_seed(0)
    x = torch.randn(8, 4, dtype=torch.float64)
    table = torch.randn(6, 4, dtype=torch.float64)
    on_x = distribute(x, mesh, sharding_spec=["dp", None])
    on_table = distribute(table, mesh)
    shift = torch.zeros(4, dtype=torch.float64)
    ids = torch.tensor([0, 2, 5, 1, 3, 3, 4, 0])
    stream = tensor_mesh(mesh).stream

    def step(a: Any, t: Any, k: float) -> Any:
        b = a + shift
        rows = torch.nn.functional.embedding(ids, t)
        return ((b * k + rows) * 2 + 1) * 3 - 1

    sent = stream.programs.sent
    for i in range(WARM + 3):
        shift.add_(0.5)
        got = step(on_x, on_table, 1.0 + i)
        stream.mark()
        assert torch.equal(inspect(got), step(x, table, 1.0 + i)), i
    assert stream.programs.sent - sent >= 2
    steps = mesh.spawn("lifted_steps", Steps, tensor_mesh(mesh).key)
    for rank, lowered in steps.lowered.call().get(timeout=60).items():
        assert {"aten.add.Tensor", "aten.embedding.default"} <= set(lowered), (rank, lowered)


@pytest.mark.usefixtures("steps_as_batches")
def test_a_comparison_of_a_partial_sum_sums_it_first_in_every_run(mesh: Any) -> None:
    # x.sum() of a tensor split over dp is a partial sum on the ranks: each compares the whole
    # sum (all-reduced first), in every run of the program, never its own part. Integers split
    # over both dims, summed over both; floats over one.
    x = torch.arange(8.0, dtype=torch.float64).reshape(8, 1)
    grid = torch.arange(16.0, dtype=torch.float64).reshape(4, 4)
    rows = distribute(x, mesh, sharding_spec=["dp", None])
    blocks = distribute(grid, mesh, sharding_spec=["dp", "tp"])
    stream = tensor_mesh(mesh).stream

    def step(a: Any, b: Any, k: float) -> list[Any]:
        total = (a * k).sum()
        count = (b * k).to(torch.int64).sum()
        return [total == 28.0 * k, total > 10.0, count == 120.0 * k, count < 5]

    sent = stream.programs.sent
    for k in map(float, range(1, WARM + 3)):  # (floats: the values of one program's runs)
        got = step(rows, blocks, k)
        stream.mark()
        for g, want in zip(got, step(x, grid, k), strict=True):
            assert torch.equal(inspect(g), want), k
            assert g.placements().get(timeout=60) == want_placements(mesh), k
    assert stream.programs.sent - sent >= 2


def want_placements(mesh: Any) -> Any:
    from torch.distributed.tensor import Replicate

    return (Replicate(),) * len(tensor_mesh(mesh).labels)


def test_a_compared_partial_sum_is_all_reduced_contiguous(mesh: Any) -> None:
    tensor_mesh(mesh)
    steps = mesh.spawn("compared_contiguous", Steps, tensor_mesh(mesh).key)
    for rank, seen in steps.compared_contiguous.call().get(timeout=60).items():
        assert seen == [True], (rank, seen)
