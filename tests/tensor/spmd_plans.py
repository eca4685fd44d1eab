"""The plans of ``plan_models.py`` run SPMD, as PyTorch's examples run them: started by
``torchrun --nproc-per-node 4`` (gloo, CPU) on a (dp: 2, tp: 2) mesh. Each rank takes its part
of the global batch (its rows along dp; along tp as the plan's input layout says), the plan is
applied with ``parallelize_module``, the rank's loss is backpropagated, and the gradients are
summed over dp (the program's data parallelism). Rank 0 saves every plan's full gradients and
the summed loss to ``argv[1]`` (``torch.save``), for test_tensor_plans.py to compare with the
same plan on a mesh."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from plan_models import loss_of, plans, weights_and_batch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module


def my_part(batch: torch.Tensor, mesh: object, tp_dim: int | None) -> torch.Tensor:
    dp, tp = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")  # type: ignore[attr-defined]
    part = batch.chunk(2, dim=0)[dp]
    if tp_dim is not None:
        part = part.chunk(2, dim=tp_dim)[tp]
    return part.contiguous()


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    results = {}
    for name, (_, plan, tp_dim, _) in plans().items():
        model, batch = weights_and_batch(name)
        parallelize_module(model, mesh["tp"], plan)
        out = model(my_part(batch, mesh, tp_dim))
        if isinstance(out, DTensor):
            out = out.to_local()
        loss = loss_of(out)
        loss.backward()
        grads = {}
        for pname, p in model.named_parameters():
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(g, group=mesh.get_group("dp"))  # the program's data parallelism
            grads[pname] = g
        total = loss.detach().clone()
        dist.all_reduce(total)  # every rank's loss (replicated outputs: tp times the same)
        results[name] = {"grads": grads, "loss": total}
    if dist.get_rank() == 0:
        torch.save(results, sys.argv[1])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
