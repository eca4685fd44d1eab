"""The SPMD side of ``bench_recovery.py``, run by ``torchrun`` (never by the suite).

``elastic``: DDP training with a DCP checkpoint every ``CKPT_EVERY`` steps; at step ``KILL_AT``
the last rank writes the time and SIGKILLs itself, torchrun (``--max-restarts=1``) restarts
every worker, they load the last checkpoint and run one step, and rank 0 writes the time that
step completed: a TorchElastic restart from the last checkpoint.

``ckpt``: FSDP2 over every rank, one AdamW step, then ``dcp.save`` and ``dcp.load`` timed
between barriers: DCP called SPMD, the floor of ``am.checkpoint``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn


def model(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    # float64: module_to_mesh(fsdp=True) in float32 asks gloo for PREMUL_SUM, which it lacks
    return nn.Sequential(*layers[:-1]).double()


def batch(step: int, width: int, rows: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(rows, width, generator=g, dtype=torch.float64)
    return x, torch.randn(rows, width, generator=g, dtype=torch.float64)


def train_step(
    net: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> float:
    """One step, the same from the controller (bench_recovery.py) and SPMD (here)."""
    opt.zero_grad()
    loss = nn.functional.mse_loss(net(x), y)
    loss.backward()
    opt.step()
    return float(loss.item())


def join() -> None:
    """The group of this attempt: torchrun's store, under a prefix per restart (a restarted
    worker read the previous attempt's gloo addresses from the bare store here)."""
    from datetime import timedelta

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=120))  # fmt: skip
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{attempt}", store),
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))  # fmt: skip


def elastic(out: str, ckpt: str, width: int, depth: int, kill_at: int, every: int) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.nn.parallel import DistributedDataParallel

    join()
    rank, world = dist.get_rank(), dist.get_world_size()
    net = DistributedDataParallel(model(width, depth))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    start = 0
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if restarted:
        model_sd, optim_sd = get_state_dict(net, opt)
        state = {"model": model_sd, "optim": optim_sd, "step": 0}
        dcp.load(state, checkpoint_id=ckpt)
        set_state_dict(net, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = int(state["step"])
    for step in range(start, kill_at + 1):
        if step == kill_at and not restarted and rank == world - 1:
            with open(os.path.join(out, "killed"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(step, width)
        x, y = x.chunk(world)[rank], y.chunk(world)[rank]
        train_step(net, opt, x, y)
        if restarted:
            if rank == 0:
                with open(os.path.join(out, "first_step"), "w") as f:
                    f.write(repr(time.time()))
            break
        if (step + 1) % every == 0:
            model_sd, optim_sd = get_state_dict(net, opt)
            dcp.save({"model": model_sd, "optim": optim_sd, "step": step + 1}, checkpoint_id=ckpt)
    dist.destroy_process_group()


def checkpoint(out: str, ckpt: str, width: int, depth: int, reps: int) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    net = model(width, depth)
    fully_shard(net, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x, y = batch(0, width)
    nn.functional.mse_loss(net(x), y).backward()
    opt.step()
    model_sd, optim_sd = get_state_dict(net, opt)
    state = {"model": model_sd, "optim": optim_sd}
    saves, loads = [], []
    for i in range(reps):
        dist.barrier()
        t = time.perf_counter()
        dcp.save(state, checkpoint_id=f"{ckpt}-{i}")
        dist.barrier()
        saves.append(time.perf_counter() - t)
        t = time.perf_counter()
        dcp.load(state, checkpoint_id=f"{ckpt}-{i}")
        dist.barrier()
        loads.append(time.perf_counter() - t)
    if dist.get_rank() == 0:
        with open(os.path.join(out, "ckpt.json"), "w") as f:
            json.dump({"save_s": saves, "load_s": loads}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, out, ckpt, *numbers = sys.argv[1:]
    if mode == "elastic":
        width, depth, kill_at, every = map(int, numbers)
        elastic(out, ckpt, width, depth, kill_at, every)
    else:
        width, depth, reps = map(int, numbers)
        checkpoint(out, ckpt, width, depth, reps)
