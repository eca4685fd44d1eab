"""The recording path's shortcuts give what the general path gives: the controller's plans (one
per op and input signature), controller tensors uploaded once per version, and the workers'
pointwise ops on local shards. 4 real ranks, gloo, CPU."""

from __future__ import annotations

import gc
import os
from typing import Any

import pytest
import torch
from test_tensor_step import steps_as_batches  # noqa: F401  (fixture)

from actormesh.tensor import distribute, fetch, inspect, live, remote
from actormesh.tensor.compat import loads
from actormesh.tensor.controller import constants
from actormesh.tensor.controller.mesh import tensor_mesh
from actormesh.tensor.controller.packing import pack
from actormesh.tensor.wire.errors import RemoteTensorError
from actormesh.tensor.wire.ops import IN

WAIT = 60

SPECS: list[list[Any]] = [
    [None, None],
    ["dp", None],
    [None, "tp"],
    ["dp", "tp"],
    [("dp", "tp"), None],
]


def kinds(procs: Any) -> list[str]:
    return [op[0] for op in tensor_mesh(procs).stream.ops]


def test_controller_tensor_is_uploaded_once_per_version(mesh: Any) -> None:
    x = torch.arange(16.0).reshape(4, 4)
    c = torch.full((64, 4, 4), 2.0)  # larger than the pool takes (its test is below)
    dt = distribute(x, mesh, sharding_spec=["dp", None])
    inspect(dt)
    gc.collect()
    baseline = live(mesh).values()
    r1 = dt + c
    r2 = dt * c
    assert kinds(mesh).count("constant") == 1  # both ops read the one upload
    c.add_(1)  # changed in place: the next op uploads the new value
    r3 = dt - c
    assert kinds(mesh).count("constant") == 2
    got = inspect([r1, r2, r3])
    assert torch.equal(got[0], (x + 2).expand(64, 4, 4))  # the old value's ops
    assert torch.equal(got[1], (x * 2).expand(64, 4, 4))
    assert torch.equal(got[2], (x - 3).expand(64, 4, 4))
    # A module's batch is a constant too: the same batch, step after step, is sent once.
    del r1, r2, r3, c
    gc.collect()
    tensor_mesh(mesh).stream.flush()
    assert live(mesh).values() == baseline  # the controller tensor went: its copies too


def test_small_tensors_an_op_only_reads_are_found_by_their_contents(
    mesh: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A forward that makes the same small tensors every step (a mask, positions) sends them
    # twice (the first tensor with some contents gets a copy of its own, dropped with it: see
    # the next test), then a new tensor with the same contents reads the pool's copy.
    x = torch.arange(16.0).reshape(4, 4)
    dt = distribute(x, mesh, sharding_spec=["dp", None])
    inspect(dt)
    sent = []
    for _ in range(3):
        mask, positions = torch.arange(4.0) > 1, torch.arange(4.0)
        r = torch.where(mask, dt + positions, dt)
        sent.append(kinds(mesh).count("constant"))
        assert torch.equal(inspect(r), torch.where(mask, x + positions, x))
    assert sent == [2, 2, 0], sent
    # Other contents, another dtype or layout, a tensor changed in place: a copy of its own.
    positions = torch.arange(4.0)
    got = [dt + positions]  # the pool's copy
    assert kinds(mesh).count("constant") == 0
    positions.add_(1)
    got += [dt + positions, dt + torch.arange(4), dt + torch.arange(4.0).reshape(1, 4)]
    assert kinds(mesh).count("constant") == 3
    ramp = torch.arange(4.0)
    want = [x + ramp, x + ramp + 1, x + torch.arange(4), x + ramp]
    assert all(torch.equal(g, w) for g, w in zip(inspect(got), want, strict=True))
    # The pool keeps its most recently used copies; the older ones are dropped on the ranks.
    # (Its size here: the copies this block pools, so that every older one goes, whatever
    # tests ran on this mesh before, the mask among them.)
    stream = tensor_mesh(mesh).stream
    monkeypatch.setattr(constants, "POOL_SIZE", 5)
    gc.collect()
    baseline, older = live(mesh).values(), len(stream.pool.copies)
    scales = [dt * torch.full((4,), 100.0 + k) for k in range(5) for _ in range(2)]
    assert len(stream.pool.copies) == constants.POOL_SIZE
    # 10 results and 5 pooled copies (and 5 copies of their own, gone with their tensors),
    # less the older pooled copies dropped
    added = [v - b for v, b in zip(live(mesh).values(), baseline, strict=True)]
    assert added == [10 + 5 - older] * 4, (added, older)
    want_scales = [x * (100 + k) for k in range(5) for _ in range(2)]
    assert all(torch.equal(s, w) for s, w in zip(inspect(scales), want_scales, strict=True))
    again = torch.where(torch.arange(4.0) > 1, dt, -dt)
    assert kinds(mesh).count("constant") == 1  # the mask, sent again
    assert torch.equal(inspect(again), torch.where(torch.arange(4.0) > 1, x, -x))


def test_contents_seen_once_are_not_kept_on_the_ranks(mesh: Any) -> None:
    # A training loop's targets are small and new every step: before, each one's copy stayed
    # in the pool (up to POOL_SIZE of them) after its tensor was collected.
    x = torch.arange(16.0).reshape(4, 4)
    dt = distribute(x, mesh, sharding_spec=["dp", None])
    inspect(dt)
    gc.collect()
    baseline = live(mesh).values()
    for k in range(3):
        target = torch.randn(4, 4)
        assert torch.equal(inspect(dt - target), x - target), k
        del target
        gc.collect()
    tensor_mesh(mesh).stream.flush()
    assert live(mesh).values() == baseline


def test_an_op_that_may_write_a_pooled_tensor_gets_a_copy_of_its_own(mesh: Any) -> None:
    # A tensor first read by an op that writes nothing shares the pool's copy; an op that may
    # write its arguments (a _foreach_ op writes its first list, here a controller tensor) must
    # not get that copy: written on the ranks, it would change every tensor with the same
    # contents (before: another zeros(4) read x + x instead of 0).
    x = torch.arange(4.0)
    dx = distribute(x, mesh, sharding_spec=[None])
    inspect(dx + torch.zeros(4))  # zeros(4) seen once: the next tensor with them is pooled
    a = torch.zeros(4)
    first = dx + a  # a: the pool's copy of zeros(4)
    assert tensor_mesh(mesh).stream.consts[id(a)][2] in tensor_mesh(mesh).stream.pool.ids
    torch._foreach_add_([a], [dx])  # writes the ranks' copy of a (not a itself)
    later = dx + torch.zeros(4)  # another tensor with a's contents: the pool's copy
    got = inspect([first, later])
    assert torch.equal(got[0], x) and torch.equal(got[1], x), got


def test_fast_path_gives_what_the_general_path_gives(mesh: Any) -> None:
    for rows in (4, 3):  # 3: uneven shards over dp
        x = torch.arange(rows * 4, dtype=torch.float64).reshape(rows, 4) - 5
        for spec in SPECS:
            dt = distribute(x, mesh, sharding_spec=spec)
            rep = distribute(x, mesh)  # replicated: pointwise with dt mixes placements
            for _ in range(2):  # the second round runs on the plans the first one made
                got = inspect(
                    [
                        dt * 2 + 1,
                        torch.add(dt, dt, alpha=3),
                        dt.clamp(min=-1.0, max=4.0),
                        (dt / 4).sqrt(),
                        dt.sum(dim=[0]),
                        dt.permute([1, 0]),
                        dt + rep,
                        (dt > 0).to(torch.float64),
                        torch.where(dt > 0, dt, -dt),
                    ]
                )
                want = [
                    x * 2 + 1,
                    x + 3 * x,
                    x.clamp(min=-1.0, max=4.0),
                    (x / 4).sqrt(),
                    x.sum(dim=[0]),
                    x.permute([1, 0]),
                    x + x,
                    (x > 0).to(torch.float64),
                    torch.where(x > 0, x, -x),
                ]
                for g, w in zip(got, want, strict=True):
                    assert torch.allclose(g, w, equal_nan=True), (spec, g, w)
            inplace = distribute(x.clone(), mesh, sharding_spec=spec)
            for _ in range(3):
                inplace.mul_(0.5).add_(1)
            expected = x.clone()
            for _ in range(3):
                expected = expected * 0.5 + 1
            assert torch.allclose(inspect(inplace), expected), spec
            places = (dt * 2).placements().get(timeout=WAIT)
            assert places == dt.placements().get(timeout=WAIT), spec  # pointwise keeps them


ON_SHARDS = {
    "pointwise": lambda q, k: q * 2,
    "laid out otherwise": lambda q, k: q + k,
    "like": lambda q, k: torch.zeros_like(q),
    "foreach": lambda q, k: torch._foreach_mul([q], 2.0)[0],
}


@pytest.mark.parametrize("op", list(ON_SHARDS))
def test_results_on_shards_are_laid_out_as_torch_lays_out_the_whole(mesh: Any, op: str) -> None:
    # The query of a fused qkv projection, one token long (a generate step): cut from a wider
    # tensor, so not dense; each rank's one row looks dense. The shard path gave its
    # pointwise results (and *_like ones) the input's strides, and the ranks then refused the
    # view the controller recorded on torch's own ("Cannot view a tensor with shape
    # [2, 2, 1, 8] and strides (48, 8, 48, 1) as (4, 1, 8)": GPT-2's generate in train()).
    def heads(x: torch.Tensor) -> torch.Tensor:
        return x[..., :16].view(2, 1, 2, 8).transpose(1, 2)

    x, y = torch.randn(2, 1, 48, dtype=torch.float64), torch.randn(2, 1, 32, dtype=torch.float64)
    spec = ["dp", None, None]
    got = ON_SHARDS[op](heads(distribute(x, mesh, spec)), heads(distribute(y, mesh, spec)))
    want = ON_SHARDS[op](heads(x), heads(y))
    assert torch.equal(inspect(got.reshape(4, 1, 8)), want.reshape(4, 1, 8))


LAYOUTS: list[list[Any]] = [[None, None], ["dp", None], [None, "tp"], ["tp", "dp"]]


def test_a_linear_layers_ops_on_shards_follow_each_layout_step_after_step(mesh: Any) -> None:
    # The linear routes (t, mm, addmm, sum over dims) find their result's layout once per
    # input layouts and reuse it: every pair of layouts, three times over, interleaved so that
    # each call meets layouts another call cached, gives the one-process values and layouts.
    torch.manual_seed(0)
    a, b = torch.randn(4, 6, dtype=torch.float64), torch.randn(6, 8, dtype=torch.float64)
    bias = torch.randn(8, dtype=torch.float64)
    for _ in range(3):
        for sa in LAYOUTS:
            for sb in LAYOUTS:
                da, db = distribute(a, mesh, sa), distribute(b, mesh, sb)
                dbias = distribute(bias, mesh)
                got = [da.t(), da @ db, torch.addmm(dbias, da, db), da.sum(dim=[0]),
                       db.sum(dim=[1], keepdim=True)]  # fmt: skip
                want = [a.t(), a @ b, torch.addmm(bias, a, b), a.sum(dim=[0]),
                        b.sum(dim=[1], keepdim=True)]  # fmt: skip
                for g, w, value in zip(got, want, inspect(got), strict=True):
                    assert g.shape == w.shape and g.stride() == w.stride(), (sa, sb)
                    assert torch.allclose(value, w), (sa, sb)
    ints = distribute(torch.arange(12).reshape(3, 4), mesh, ["dp", None])
    flags = distribute(torch.tensor([[True, False], [True, True]]), mesh, ["dp", None])
    for _ in range(2):  # a sum promotes bools to int64: the result's dtype, not the input's
        got = inspect([ints.sum(dim=[0]), flags.sum(dim=[1])])
        assert got[0].dtype == torch.int64 and torch.equal(got[0], torch.tensor([12, 15, 18, 21]))
        assert got[1].dtype == torch.int64 and torch.equal(got[1], torch.tensor([1, 2]))


def test_sums_of_one_tensor_over_different_dims_keep_their_own_layouts(mesh: Any) -> None:
    # The sum route's layout is found once per input layout *and* dims and keepdim: one
    # tensor (one layout on the ranks) summed over each dim in turn, with and without keepdim,
    # step after step, gives the one-process values, shapes and strides every time.
    torch.manual_seed(0)
    x = torch.randn(4, 6, 8, dtype=torch.float64)
    for spec in (["dp", "tp", None], [None, "dp", "tp"]):
        dx = distribute(x, mesh, spec)
        calls = [
            ([0], False),
            ([1], False),
            ([2], True),
            ([0, 2], False),
            ([1], True),
            ([-1], False),
        ]
        for _ in range(2):
            got = [dx.sum(dim=dims, keepdim=keep) for dims, keep in calls]
            want = [x.sum(dim=dims, keepdim=keep) for dims, keep in calls]
            for g, w, value in zip(got, want, inspect(got), strict=True):
                assert g.shape == w.shape and g.stride() == w.stride(), spec
                assert value.shape == w.shape and torch.allclose(value, w), spec


def test_scalars_key_the_plans_by_type(mesh: Any) -> None:
    ints = distribute(torch.arange(6).reshape(3, 2), mesh, sharding_spec=["dp", None])
    flags = distribute(torch.tensor([True, False, True]), mesh)
    assert (ints * 2).dtype == torch.int64 and (ints * 2.5).dtype == torch.float32
    assert (flags + True).dtype == torch.bool and (flags + 1).dtype == torch.int64
    got = inspect([ints * 2, ints * 2.5, flags + True, flags + 1])
    li, lf = torch.arange(6).reshape(3, 2), torch.tensor([True, False, True])
    for g, w in zip(got, [li * 2, li * 2.5, lf + True, lf + 1], strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)


@pytest.mark.usefixtures("steps_as_batches")
def test_a_bool_list_takes_the_fast_path_keyed_by_its_values(mesh: Any) -> None:
    # A backward's output_mask (which gradients to make): each mask its own plan, since it
    # decides which results there are.
    torch.manual_seed(0)
    x, grad = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    w, b = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    on = [distribute(t, mesh) for t in (x, grad, w, b)]
    stream = tensor_mesh(mesh).stream
    forward = torch.ops.aten.native_layer_norm.default
    backward = torch.ops.aten.native_layer_norm_backward.default
    _, mean, rstd = forward(on[0], [4], on[2], on[3], 1e-5)
    _, want_mean, want_rstd = forward(x, [4], w, b, 1e-5)
    masks = ([True, True, True], [True, False, False], [False, True, True])
    for k, mask in enumerate([*masks, *masks]):
        got = backward(on[1], on[0], [4], mean, rstd, on[2], on[3], mask)
        # the second time, on the plan the first made: the fast path's op (its inputs as IN)
        assert k < len(masks) or stream.ops[-1][4][4] is not None, mask
        want = backward(grad, x, [4], want_mean, want_rstd, w, b, mask)
        for g, expected in zip(got, want, strict=True):
            assert (g is None) == (expected is None), mask
            if g is not None:
                assert torch.allclose(inspect(g), expected, rtol=1e-12, atol=1e-14), mask


@remote(propagate="inspect")
def _rank_strides(*ts: Any) -> list[tuple[int, ...]]:
    return [tuple(t.stride()) for t in ts]  # a DTensor's: its spec's, the global layout


def test_a_product_with_no_columns_has_torchs_strides_on_the_ranks(mesh: Any) -> None:
    # The mm and addmm routes give their result the strides torch gives the whole product;
    # with no columns those are (1, 1), not (0, 1) (DTensor's own rule, and the controller's
    # shape propagation, say (1, 1) too).
    a = distribute(torch.ones(4, 3, dtype=torch.float64), mesh, ["dp", None])
    b = distribute(torch.ones(3, 0, dtype=torch.float64), mesh)
    bias = distribute(torch.ones(0, dtype=torch.float64), mesh)
    got = [a @ b, torch.addmm(bias, a, b)]
    want = torch.ones(4, 0).stride()
    assert [g.stride() for g in got] == [want, want]  # the controller's view
    assert fetch(_rank_strides(*got), dp=1, tp=1).get(timeout=WAIT) == [want, want]


@remote(propagate="inspect")
def _summed_on_shards(t: Any) -> list[Any]:
    # What the sum route (the engine's shard path) gives for this rank's part of ``t``: None
    # where it leaves the op to DTensor.
    from actormesh.tensor.worker.aten import resolve_op
    from actormesh.tensor.worker.shard_ops import route_for

    op = resolve_op("aten.sum.dim_IntList")
    out = [route_for("aten.sum.dim_IntList", op)(op, (t, [1], keep), {}) for keep in (False, True)]
    return [None if o is None else (o.dtype, tuple(o.shape)) for o in out]


def test_integer_and_bool_sums_run_on_the_shards(mesh: Any) -> None:
    # torch sums bools and integers as int64: the sum route gives its result that dtype
    # rather than computing the local sum, finding the dtype is not the input's, and leaving
    # the op to DTensor (which ran it a second time, on every step).
    ints = distribute(torch.arange(12).reshape(4, 3), mesh, ["dp", None])
    flags = distribute(torch.arange(12).reshape(4, 3) % 2 == 0, mesh, ["dp", None])
    for t in (ints, flags):
        got = fetch(_summed_on_shards(t), dp=1, tp=0).get(timeout=WAIT)
        assert got == [(torch.int64, (4,)), (torch.int64, (4, 1))], t.dtype
    want = [torch.tensor([3, 12, 21, 30]), torch.tensor([[2], [1], [2], [1]])]
    for _ in range(2):
        got = inspect([ints.sum(dim=[1]), flags.sum(dim=[1], keepdim=True)])
        assert [g.dtype for g in got] == [torch.int64, torch.int64]
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@remote(propagate="inspect")
def _threads(t: Any) -> int:
    return torch.get_num_threads()


@pytest.mark.skipif("OMP_NUM_THREADS" in os.environ, reason="the user chose the thread count")
def test_engine_uses_one_intra_op_thread_per_rank_as_torchrun_does(mesh: Any) -> None:
    dt = distribute(torch.ones(2, 2), mesh)
    inspect(dt)  # the engine has run a batch: its thread is set up
    assert fetch(_threads(dt), dp=1, tp=1).get(timeout=WAIT) == 1


def test_loss_and_its_gradient_on_shards_equal_the_local_ones(mesh: Any) -> None:
    # mse_loss runs on each rank's block (target sharded alike, or replicated and sliced).
    torch.manual_seed(0)
    for rows in (4, 3):
        x, y = torch.randn(rows, 4, dtype=torch.float64), torch.randn(rows, 4, dtype=torch.float64)
        for spec in SPECS:
            for reduction in ("mean", "sum"):
                for target in (y, distribute(y, mesh, sharding_spec=spec)):
                    dx = distribute(x.clone().requires_grad_(True), mesh, sharding_spec=spec)
                    loss = torch.nn.functional.mse_loss(dx, target, reduction=reduction)
                    loss.backward()
                    lx = x.clone().requires_grad_(True)
                    want = torch.nn.functional.mse_loss(lx, y, reduction=reduction)
                    want.backward()
                    got, grad = inspect([loss, dx.grad])
                    assert torch.allclose(got, want), (spec, reduction)
                    assert torch.allclose(grad, lx.grad), (spec, reduction)
                    assert torch.equal(inspect(dx.detach()), x)


def test_memory_formats_and_layouts_travel_in_a_batch(mesh: Any) -> None:
    # A plain batch carries memory formats by name (packing.pack): pickle's own way scans every
    # loaded module for them.
    x = torch.arange(8.0).reshape(2, 4)
    dt = distribute(x, mesh, sharding_spec=["dp", None])
    ones = torch.ones_like(dt, memory_format=torch.preserve_format, layout=torch.strided)
    zeros = torch.zeros_like(dt, memory_format=torch.contiguous_format)
    got = inspect([ones + dt, zeros + dt])
    assert torch.equal(got[0], x + 1) and torch.equal(got[1], x)
    kwargs = {"layout": torch.strided, "memory_format": torch.channels_last}
    batch = [("aten", (1,), (), (), ("aten.empty_like.default", (IN,), kwargs, None, (0,)), "")]
    assert loads(pack(batch)) == batch


def test_an_op_on_a_value_the_workers_freed_names_it(mesh: Any) -> None:
    dt = distribute(torch.ones(4, 4), mesh, sharding_spec=["dp", None])
    inspect(dt + 1)  # the plan exists: the next add records through the fast path
    stream = tensor_mesh(mesh).stream
    stream.died(dt.value_id)  # the workers free it, as if its MeshTensor had been collected
    stream.flush()
    with pytest.raises(RemoteTensorError, match=f"tensor value {dt.value_id} is not on rank"):
        inspect(dt + 1)
    assert torch.equal(inspect(distribute(torch.ones(2), mesh) + 1), torch.full((2,), 2.0))
