"""Recovering training (issue 42): actormesh's live recovery against a TorchElastic restart, and
``am.checkpoint`` against DCP called SPMD by ``torchrun``, the same model on the same machine,
interleaved in one run (A, B, A, B...).

- **Recovery** (4 ranks, data parallel, a DCP checkpoint every ``EVERY`` steps): a rank is
  SIGKILLed at step ``KILL_AT``; the figure is the time from the kill to the first training step
  completed after recovery. actormesh: ``am.FaultTolerant`` (``recover()`` heals the rank and
  restores the last committed step from the replicas; the others keep running). TorchElastic:
  ``torchrun --max-restarts=1`` restarts every worker, which load the last checkpoint
  (recovery_spmd.py ``elastic``); that run also loses the steps since the checkpoint, which
  the figure does not count.
- **Checkpoint throughput** (FSDP over 4 ranks, model + AdamW state): ``am.checkpoint.save`` /
  ``load`` from the controller against ``dcp.save`` / ``dcp.load`` timed between barriers in
  a torchrun SPMD program (recovery_spmd.py ``ckpt``); the target is >= 80 % of DCP's rate.

``python bench/bench_recovery.py`` (``BENCH_QUICK=1``: smaller, one round) prints JSON.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common as C
import torch
from recovery_spmd import batch, model, train_step
from torch import nn

import actormesh as am

ROUNDS = 1 if C.QUICK else 3
WIDTH, DEPTH = (256, 4) if C.QUICK else (1024, 4)  # recovery: 4.2 M parameters, float64
CK_WIDTH, CK_DEPTH = (512, 4) if C.QUICK else (2048, 6)  # checkpoint: 25 M (+ AdamW: 604 MB)
KILL_AT, EVERY = 6, 4
REPS = 1 if C.QUICK else 2
SPMD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recovery_spmd.py")


def pid(t: torch.Tensor) -> int:
    return os.getpid()


def actormesh_recovery(tmp: str) -> float:
    procs = am.this_host().spawn_procs(per_host={"dp": 4})
    try:
        net = am.module_to_mesh(model(WIDTH, DEPTH), procs)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        ft = am.FaultTolerant({"model": net, "optim": opt}, checkpoint_id=os.path.join(tmp, "c"),
                              checkpoint_every=EVERY)  # fmt: skip
        killed = first = 0.0
        while first == 0.0:
            try:
                if ft.step == KILL_AT and not killed:
                    first_param = next(net.parameters())
                    victim = am.call_on_shard_and_fetch(pid, first_param, dp=3).get(timeout=60)
                    killed = time.time()
                    os.kill(victim, signal.SIGKILL)
                train_step(net, opt, *batch(ft.step, WIDTH))
                if killed:
                    first = time.time()
                ft.commit()
            except am.SupervisionError:
                ft.recover()
        return first - killed
    finally:
        procs.stop().get(timeout=60)


def torchrun(mode: str, tmp: str, *numbers: int, restarts: int = 0) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
           f"--max-restarts={restarts}", "--monitor-interval=0.1", SPMD, mode, tmp,
           os.path.join(tmp, "ckpt"), *map(str, numbers)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=C_LIMIT)


C_LIMIT = 300


def elastic_recovery(tmp: str) -> float:
    torchrun("elastic", tmp, WIDTH, DEPTH, KILL_AT, EVERY, restarts=1)
    with open(os.path.join(tmp, "killed")) as f:
        killed = float(f.read())
    with open(os.path.join(tmp, "first_step")) as f:
        return float(f.read()) - killed


def actormesh_checkpoint(tmp: str) -> dict[str, Any]:
    procs = am.this_host().spawn_procs(per_host={"dp": 4})
    try:
        net = am.module_to_mesh(model(CK_WIDTH, CK_DEPTH), procs, fsdp=True)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        x, y = batch(0, CK_WIDTH)
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        state = {"model": net, "optim": opt}
        saves, loads = [], []
        for i in range(REPS):
            path = os.path.join(tmp, f"am-{i}")
            am.inspect(next(net.parameters()))  # nothing left in flight
            t = time.perf_counter()
            am.checkpoint.save(state, checkpoint_id=path, timeout=C_LIMIT)
            saves.append(time.perf_counter() - t)
            t = time.perf_counter()
            am.checkpoint.load(state, checkpoint_id=path, timeout=C_LIMIT)
            loads.append(time.perf_counter() - t)
        return {"save_s": saves, "load_s": loads}
    finally:
        procs.stop().get(timeout=60)


def dcp_checkpoint(tmp: str) -> dict[str, Any]:
    import json

    torchrun("ckpt", tmp, CK_WIDTH, CK_DEPTH, REPS)
    with open(os.path.join(tmp, "ckpt.json")) as f:
        return json.load(f)  # type: ignore[no-any-return]


def fresh(fn: Any) -> Any:
    tmp = tempfile.mkdtemp(prefix="bench-recovery-")
    try:
        return fn(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    started = time.time()
    state_bytes = sum(p.numel() for p in model(CK_WIDTH, CK_DEPTH).parameters()) * 8 * 3
    result: dict[str, Any] = {
        "machine": C.machine_info(),
        "quick": C.QUICK,
        "rounds": ROUNDS,
        "recovery_model": [WIDTH, DEPTH],
        "checkpoint_bytes": state_bytes,
    }
    rounds = []
    for _ in range(ROUNDS):
        live = fresh(actormesh_recovery)
        elastic = fresh(elastic_recovery)
        mine = fresh(actormesh_checkpoint)
        theirs = fresh(dcp_checkpoint)
        rounds.append({
            "recovery_s": {"actormesh": live, "torchelastic": elastic,
                           "ratio": elastic / live},
            "save_s": {"actormesh": min(mine["save_s"]), "dcp_spmd": min(theirs["save_s"])},
            "load_s": {"actormesh": min(mine["load_s"]), "dcp_spmd": min(theirs["load_s"])},
        })  # fmt: skip
        r = rounds[-1]
        r["save_share"] = r["save_s"]["dcp_spmd"] / r["save_s"]["actormesh"]
        r["load_share"] = r["load_s"]["dcp_spmd"] / r["load_s"]["actormesh"]
        print(r, flush=True)
    result["rounds_data"] = rounds
    with open("/proc/loadavg") as f:
        result["loadavg_end"] = f.read().split()[:3]
    result["seconds"] = round(time.time() - started, 1)
    C.print_result(result)


if __name__ == "__main__":
    main()
