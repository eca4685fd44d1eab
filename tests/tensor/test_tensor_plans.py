"""A parallelize plan means on the mesh what it means in an SPMD program (issue 38): PyTorch's own
tensor- and sequence-parallel plans give the gradients of the same plan run with ``torchrun``
on the same ranks and of one process; input layouts are honoured (a ``Shard`` input layout used
to hand every tp rank the whole batch, doubling the gradients), output layouts give the
placements; what cannot be honoured is refused at the user's line."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from plan_models import ToyModel, loss_of, plans, weights_and_batch
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
)

from actormesh.errors import MeshUsageError
from actormesh.tensor import distribute, fetch, inspect, module_to_mesh

WAIT = 60
HERE = Path(__file__).parent


def _mesh_gradients(mesh: Any, name: str, **options: Any) -> tuple[dict[str, Any], Any]:
    local, batch = weights_and_batch(name)
    model = module_to_mesh(copy.deepcopy(local), mesh, tp_plan=plans()[name][1], **options)
    out = model(batch)
    loss_of(out).backward()
    grads = inspect({n: p.grad for n, p in model.named_parameters()})
    return grads, out


@pytest.mark.parametrize("name", list(plans()))
def test_a_plan_gives_the_gradients_of_one_process(mesh: Any, name: str) -> None:
    # Before issue 38 the "sp" and "prepare" plans (a Shard input layout) gave gradients twice
    # those of one process: every tp rank was handed the whole batch.
    local, batch = weights_and_batch(name)
    loss_of(local(batch)).backward()
    for options in ({}, {"fsdp": True}):
        grads, _ = _mesh_gradients(mesh, name, **options)
        for pname, p in local.named_parameters():
            assert torch.allclose(grads[pname], p.grad, atol=1e-10, rtol=0), (options, pname)


def test_output_layouts_are_the_outputs_placements(mesh: Any) -> None:
    _, out = _mesh_gradients(mesh, "sp")  # out_proj: RowwiseParallel(output_layouts=Shard(0))
    assert out.placements().get(timeout=WAIT)[1] == Shard(0)  # tp is mesh dim 1
    _, out = _mesh_gradients(mesh, "tp")  # RowwiseParallel's default: Replicate
    assert out.placements().get(timeout=WAIT)[1] == Replicate()
    model = module_to_mesh(ToyModel(), mesh, tp_plan=plans()["tp"][1])
    # ColwiseParallel splits a Linear's weight along dim 0 over tp, RowwiseParallel along dim 1
    placements = model.in_proj.weight.placements().get(timeout=WAIT)
    assert placements == (Replicate(), Shard(0))
    assert model.out_proj.weight.placements().get(timeout=WAIT) == (Replicate(), Shard(1))


@pytest.mark.parametrize(
    ("name", "layout"),
    [("tp", Replicate()), ("sp", Shard(0)), ("prepare", Shard(0))],
    ids=["tp", "sp", "prepare"],
)
def test_an_input_gets_its_gradient_in_the_plans_input_layout(
    mesh: Any, name: str, layout: Any
) -> None:
    # As SPMD: the gradient of a planned module's input comes back in the style's
    # input_layouts (ColwiseParallel: Replicate, all-reduced over tp), not as the Partial sum
    # the module's backward leaves. Left Partial, a LayerNorm's backward reduce-scattered it
    # and split the batch over tp as well, which DTensor could not view back in
    # nn.TransformerEncoder's attention (test_real_models.py).
    local, batch = weights_and_batch(name)
    x = batch.clone().requires_grad_()
    loss_of(local(x)).backward()
    model = module_to_mesh(copy.deepcopy(local), mesh, tp_plan=plans()[name][1])
    mx = distribute(batch, mesh, ["dp", None]).requires_grad_()
    loss_of(model(mx)).backward()
    assert mx.grad.placements().get(timeout=WAIT) == (Shard(0), layout)
    assert torch.allclose(inspect(mx.grad), x.grad, atol=1e-10, rtol=0)


@pytest.mark.slow
def test_plans_give_the_gradients_of_the_same_plan_run_spmd_with_torchrun(
    mesh: Any, tmp_path: Path
) -> None:
    out = tmp_path / "spmd.pt"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    )
    env.pop("ACTORMESH_CHECK_PROTOCOL", None)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
         str(HERE / "spmd_plans.py"), str(out)],
        capture_output=True, text=True, timeout=100, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    spmd = torch.load(out)
    for name in plans():
        grads, _ = _mesh_gradients(mesh, name)
        for pname, g in spmd[name]["grads"].items():
            assert torch.allclose(grads[pname], g, atol=1e-10, rtol=0), (name, pname)


class Scaled(ParallelStyle):
    """A style of the user's own: its hooks would run SPMD code on local tensors."""

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        return module


def test_plans_that_cannot_mean_the_same_are_refused_at_the_users_line(mesh: Any) -> None:
    with pytest.raises(MeshUsageError, match=r"'in_prj' names no submodule of ToyModel"):
        module_to_mesh(ToyModel(), mesh, tp_plan={"in_prj": ColwiseParallel()})
    with pytest.raises(MeshUsageError, match=r"'out_proj': Scaled is not one of torch's"):
        module_to_mesh(ToyModel(), mesh, tp_plan={"out_proj": Scaled()})
    with pytest.raises(MeshUsageError, match=r"'relu': RowwiseParallel applies to nn.Linear"):
        module_to_mesh(ToyModel(), mesh, tp_plan={"relu": RowwiseParallel()})
    two = PrepareModuleInput(input_layouts=(Shard(0), None), desired_input_layouts=(None, None))
    model = module_to_mesh(ToyModel(), mesh, tp_plan={"": two})
    with pytest.raises(MeshUsageError, match=r"'': PrepareModuleInput has 2 input_layouts"):
        model(torch.randn(4, 10))
    # The mesh is fine afterwards.
    assert fetch(module_to_mesh(nn.Linear(2, 2), mesh)(torch.ones(2, 2))).get(
        timeout=WAIT
    ).shape == (
        2,
        2,
    )
