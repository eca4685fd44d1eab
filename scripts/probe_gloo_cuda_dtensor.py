"""Does DTensor work over gloo with CUDA tensors? (No actormesh in it.)

Two processes share GPU 0, form a ``cpu:gloo,cuda:gloo`` group and multiply a ``Shard(0)``
DTensor by its transpose. With torch 2.11 on an H100 rank 1 dies with SIGSEGV (2026-11-25),
which is why a tensor mesh whose ranks share a GPU computes on the CPU
(``tensor/controller/mesh.py``, ``docs/gpus.md``). Rerun it on a new torch to see whether that
can change.

Usage: python scripts/probe_gloo_cuda_dtensor.py   (needs one GPU)
"""

from __future__ import annotations

import faulthandler
import os
import tempfile

import torch
import torch.multiprocessing as mp


def run(rank: int, path: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    faulthandler.enable(all_threads=True)
    torch.cuda.set_device(0)
    dist.init_process_group(
        "cpu:gloo,cuda:gloo", init_method=f"file://{path}", rank=rank, world_size=2
    )
    mesh = init_device_mesh("cuda", (2,))
    x = torch.arange(64 * 32, dtype=torch.float64, device="cuda").reshape(64, 32)
    dt = distribute_tensor(x, mesh, [Shard(0)])
    out = (dt @ dt.T).full_tensor()
    torch.cuda.synchronize()
    print(f"rank {rank}: matmul {'right' if torch.allclose(out, x @ x.T) else 'WRONG'}")
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(run, args=(os.path.join(tmp, "store"),), nprocs=2, start_method="spawn")
    print("both ranks exited normally: DTensor over gloo with CUDA tensors works here")
