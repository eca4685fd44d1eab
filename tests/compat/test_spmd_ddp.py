"""docs/monarch.md, "SPMD": Monarch's SPMD-DDP example as written (only the imports name
actormesh), with its training script on CPU with gloo; Monarch's rank rules."""

from __future__ import annotations

import json
import os
import textwrap

from actormesh import Actor, endpoint, this_host
from actormesh.spmd import SPMDActor, setup_torch_elastic_env

TRAIN = """
import json, os, sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.Linear(10, 1)
    ddp_model = DDP(model)
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01)
    for step in range(5):
        inputs = torch.randn(4, 10)
        loss = ddp_model(inputs).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"[Rank {rank}] Step {step} loss={loss.item()}")
    weights = [float(w) for w in model.weight.detach().flatten()]
    with open(f"{sys.argv[1]}.{rank}", "w") as f:
        json.dump({"world": dist.get_world_size(), "weights": weights}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def test_spmd_ddp_example(tmp_path) -> None:
    train_script = tmp_path / "train.py"
    train_script.write_text(textwrap.dedent(TRAIN))
    out = str(tmp_path / "result")

    local_proc_mesh = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        spmd_actors = local_proc_mesh.spawn("_SPMDActor", SPMDActor)
        first_values = dict.fromkeys(local_proc_mesh._labels, 0)
        master_addr, master_port = (
            spmd_actors.slice(**first_values).get_host_port.call_one(None).get()
        )
        spmd_actors.main.call(master_addr, master_port, [str(train_script), out]).get(timeout=120)
    finally:
        local_proc_mesh.stop().get(timeout=30)
    results = [json.loads((tmp_path / f"result.{r}").read_text()) for r in range(2)]
    assert [r["world"] for r in results] == [2, 2]
    assert results[0]["weights"] == results[1]["weights"]  # DDP kept the replicas in step


class EnvReader(Actor):
    @endpoint
    def env(self) -> dict[str, str]:
        names = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "WORLD_SIZE")
        return {name: os.environ[name] for name in names}


def test_setup_torch_elastic_env_takes_the_last_dimension_as_local() -> None:
    procs = this_host().spawn_procs(per_host={"replicas": 2, "gpus": 2})
    try:
        setup_torch_elastic_env(procs)
        envs = procs.spawn("env_reader", EnvReader).env.call().get(timeout=60).values()
    finally:
        procs.stop().get(timeout=30)
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["GROUP_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
