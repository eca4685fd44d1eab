"""Distributed tensors driven from the controller (issue 19), each beside its SPMD floor.

All on one 4-rank mesh {dp: 2, tp: 2} over gloo; the floors run on the *same* processes, as
an endpoint of an actor there that loops in the worker (what a ``python -m actormesh run``
script does, without its start-up, and with its one intra-op thread per rank), using the tensor
engine's own DeviceMesh and groups. The two sides alternate in blocks for ``ROUNDS`` rounds, and
the medians of all samples are compared (ratio, and the µs the controller adds).

- T1: a training step of an MLP 16 -> 32 -> 4 (batch 16, AdamW, ``loss.item()`` every step):
  ``module_to_mesh`` with its defaults (parameters replicated, inputs split along dp, gradients
  summed over dp in backward) against the same step SPMD (the local model on each rank's half
  of the batch, one all-reduce of the flattened gradients over dp, AdamW, the loss averaged over
  dp and read). A step's SPMD time is that of its slowest rank. Target ≤ 1.2x.
- T1b: the same with hidden width 1024 and batch 256. Target ≤ 1.05x.
  Both also report CPU ms per step (median over the blocks): the controller process and the
  4 workers' processes while the controller drives the step, against the workers' during the
  SPMD steps (``cpu_ratio``): on 2 cores the step is CPU-bound, and CPU per step moves far less
  with the VM's regime than wall time does.
- T5: the T1b loop reading the loss every ``READ_EVERY`` steps (as training loops log), against
  the same SPMD loop: wall per step (target 1.15x) and CPU per step.
- T6: a step of Hugging Face's GPT-2 from the tiny config of ``tests/tensor/test_real_models.py``
  (float32, a right-padded batch of 4x8 tokens with labels, AdamW, ``loss.item()`` every step),
  ``module_to_mesh`` with its defaults, against the same model trained SPMD (each dp rank its
  half of the batch, gradients all-reduced over dp): CPU per step (target 1.5x).
  T1, T1b, T5, T6 also report the controller's CPU per step as a share of the SPMD step's
  (target 25 %), and the issue-43 targets of CPU per step: T1 1.5x, T1b 1.15x, T6 1.5x.
- T2: the controller's cost of recording one elementwise op with a shape-cache hit (``a + a`` on
  an 8x8 MeshTensor, 200 in a block, sent after the block) against the same op on local
  tensors. Target ≤ 6x.
- T3: a chain of 200 adds on an 8x8 DTensor (Shard(0) over dp) through the controller, until
  its value is on the controller, against the same chain SPMD until ``full_tensor()``. Per op.
  Target ≤ 1.5x.
- T4: messages for 500 ops with no sync point. Counted twice: where the controller's transport
  signs each message it sends (a broadcast goes once to the host's relay, which fans it out;
  a batch of one-way messages counts once), and per process as the batches its engine
  received. Target ≤ 3 per process.

On a machine with GPUs, ``BENCH_DEVICE=cuda`` runs the same cases on a mesh {gpus: N}, one
rank per GPU (NCCL; the tensor engine computes on the GPUs), both sides on the GPUs, with the
data dimension named ``gpus`` (``module_to_mesh``'s default where no ``dp`` exists). T3 and
T4 split along ``dp`` and need the CPU mesh.

Run:  python bench/bench_tensor.py          (BENCH_QUICK=1: fewer steps, two rounds;
      BENCH_ONLY=T1,T1b,T5,T6: only those)
Prints one JSON object; ``BENCH_OUT=path`` also writes it there. ``code`` in it names the
actormesh the workers imported (an A/B of two checkouts must check it: workers start with
``python -m``, which puts their working directory first on the path).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/
import common as C
import torch
from torch import nn

import actormesh as am
from actormesh.runtime.messaging import node as node_mod
from actormesh.tensor import RemoteTensorError, distribute, inspect, module_to_mesh
from actormesh.tensor.controller.mesh import tensor_mesh

if C.QUICK:
    ROUNDS, STEPS, STEPS_WIDE, CHAINS, RECORD_BLOCKS = 2, 5, 3, 2, 20
else:
    ROUNDS, STEPS, STEPS_WIDE, CHAINS, RECORD_BLOCKS = 5, 20, 8, 5, 100
# A repeated step goes by reference from its third run (controller/programs.py), and its first
# two differ (the optimizer's state, an op's first plan): timed steps start after these.
WARMUP_STEPS = 6
READ_EVERY = 10  # T5: the loss read every this many steps
STEPS_T5 = 20 if not C.QUICK else 10
STEPS_T6 = 8 if not C.QUICK else 3
CHAIN = 200
RECORD_BLOCK = 200
T4_OPS = 500
TARGETS = {"T1": 1.2, "T1b": 1.05, "T2": 6.0, "T3": 1.5, "T4": 3, "T5": 1.15, "T6": None}
# Issue 43: CPU per step of all processes over the SPMD step's, and the controller's share.
CPU_TARGETS = {"T1": 1.5, "T1b": 1.15, "T5": None, "T6": 1.5}
CONTROLLER_SHARE = 0.25
SHAPES = {"T1": (16, 32, 4, 16), "T1b": (16, 1024, 4, 256)}  # d_in, hidden, d_out, batch
DEVICE = os.environ.get("BENCH_DEVICE", "cpu")
# The data dimension: dp on the CPU mesh; on GPUs, the mesh's one dimension (a rank per GPU).
DATA = "gpus" if DEVICE == "cuda" else "dp"


class MLP(nn.Module):
    def __init__(self, d_in: int, hidden: int, d_out: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def mesh_shape() -> dict[str, int]:
    """The mesh the cases run on: {dp: 2, tp: 2} on the CPU, a rank per GPU with BENCH_DEVICE."""
    return {"gpus": torch.cuda.device_count()} if DEVICE == "cuda" else {"dp": 2, "tp": 2}


def gpt2() -> nn.Module:
    """The GPT-2 of tests/tensor/test_real_models.py (tiny, no weights downloaded), float32."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def token_batch() -> dict[str, torch.Tensor]:
    """A right-padded batch of 4 sequences of 8 tokens (the ranks' counted tokens differ)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 64, (4, 8), generator=generator)
    mask = torch.ones(4, 8, dtype=torch.long)
    mask[0, 5:] = 0
    mask[3, 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


class Spmd(am.Actor):
    """The floors: the same work, written as SPMD code that runs in every rank."""

    def _mesh(self, key: str) -> Any:
        from actormesh.tensor.worker.local import REGISTRY

        # What `python -m actormesh run` gives a script with several ranks per host (torchrun's
        # default), and what the tensor engine uses: one intra-op thread per rank.
        torch.set_num_threads(1)
        engine = REGISTRY.get(key)
        assert engine is not None, "the tensor engine runs in this process"
        return engine.mesh

    @am.endpoint
    def train(
        self, key: str, state: dict[str, torch.Tensor], shape: tuple[int, int, int, int],
        x: torch.Tensor, y: torch.Tensor, steps: int, read_every: int = 1,
    ) -> tuple[list[int], float]:  # fmt: skip
        """Each timed step's ns, and this process's CPU seconds over the timed steps."""
        import torch.nn.functional as F

        mesh = self._mesh(key)
        ndp = mesh.size(mesh.mesh_dim_names.index(DATA))
        i = mesh.get_local_rank(DATA)
        d_in, hidden, d_out, batch = shape
        model = MLP(d_in, hidden, d_out)
        model.load_state_dict(state)
        model.to(DEVICE)
        rows = batch // ndp
        xl, yl = (t[i * rows : (i + 1) * rows].to(DEVICE) for t in (x, y))
        return self._loop(mesh, model, lambda: F.mse_loss(model(xl), yl), steps, read_every)

    @am.endpoint
    def train_gpt2(
        self, key: str, state: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], steps: int
    ) -> tuple[list[int], float]:
        """T6's floor: each dp rank its half of the batch (HF's loss averages over the rank's
        own counted tokens: the cost of the step, not quite its numbers)."""
        mesh = self._mesh(key)
        ndp = mesh.size(mesh.mesh_dim_names.index(DATA))
        i = mesh.get_local_rank(DATA)
        model = gpt2()
        model.load_state_dict(state)
        model.to(DEVICE)
        rows = len(batch["input_ids"]) // ndp
        mine = {k: v[i * rows : (i + 1) * rows].to(DEVICE) for k, v in batch.items()}
        return self._loop(mesh, model, lambda: model(**mine).loss, steps, 1)

    def _loop(
        self, mesh: Any, model: nn.Module, loss_of: Any, steps: int, read_every: int
    ) -> tuple[list[int], float]:
        import torch.distributed as dist

        group = mesh.get_group(DATA)
        ndp = mesh.size(mesh.mesh_dim_names.index(DATA))
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-3)
        out = []
        cpu = 0.0
        for step in range(WARMUP_STEPS + steps):
            if step == WARMUP_STEPS:
                cpu = process_cpu()
            t0 = time.perf_counter_ns()
            opt.zero_grad()
            loss = loss_of()
            loss.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
            dist.all_reduce(flat, group=group)
            flat /= ndp
            offset = 0
            for p in params:
                n = p.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p))  # type: ignore[union-attr]
                offset += n
            opt.step()
            if (step + 1) % read_every == 0:
                total = loss.detach().clone()
                dist.all_reduce(total, group=group)
                (total / ndp).item()
            out.append(time.perf_counter_ns() - t0)
        return out[WARMUP_STEPS:], process_cpu() - cpu

    @am.endpoint
    def cpu(self) -> float:
        return process_cpu()

    @am.endpoint
    def code(self) -> str:
        return os.path.dirname(os.path.dirname(am.__file__))

    @am.endpoint
    def chain(self, key: str, n: int) -> int:
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = self._mesh(key)
        d = distribute_tensor(torch.zeros(8, 8), mesh, [Shard(0), Replicate()], src_data_rank=None)
        t0 = time.perf_counter_ns()
        for _ in range(n):
            d = d + 1
        d.full_tensor()
        return time.perf_counter_ns() - t0


def process_cpu() -> float:
    """CPU seconds of this process, all its threads (ZeroMQ's, gloo's, the I/O thread)."""
    return time.process_time()  # os.times() counts in 10 ms ticks


def slowest(per_rank: list[list[int]]) -> list[int]:
    return [max(step) for step in zip(*per_rank, strict=True)]


def compare(name: str, ours: list[float], floor: list[float], unit: str = "us") -> dict[str, Any]:
    a, b = statistics.median(ours), statistics.median(floor)
    if TARGETS[name] is None:
        return {
            "controller": {"median_us": a, "n": len(ours), "min_us": min(ours)},
            "spmd": {"median_us": b, "n": len(floor), "min_us": min(floor)},
            "ratio": a / b,
            "added_us": a - b,
        }
    return {
        "controller": {"median_us": a, "n": len(ours), "min_us": min(ours)},
        "spmd" if name != "T2" else "local": {
            "median_us": b,
            "n": len(floor),
            "min_us": min(floor),
        },
        "ratio": a / b,
        "added_us": a - b,
        "target": TARGETS[name],
        "met": a / b <= TARGETS[name],
    }


def mlp_step(procs: Any, name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor, Any]:
    """The training step of T1, T1b or T5 on ``procs`` (``module_to_mesh``, AdamW, the loss
    read every step, or every ``READ_EVERY`` for T5): the local model it starts from, its batch
    and the step."""
    import torch.nn.functional as F

    d_in, hidden, d_out, batch = SHAPES["T1b" if name == "T5" else name]
    read_every = READ_EVERY if name == "T5" else 1
    torch.manual_seed(0)
    local = MLP(d_in, hidden, d_out)
    x, y = torch.randn(batch, d_in), torch.randn(batch, d_out)
    model = module_to_mesh(local, procs)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    count = [0]

    def step() -> None:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        count[0] += 1
        if count[0] % read_every == 0:
            loss.item()

    return local, x, y, step


def t1(procs: Any, spmd: Any, key: str, name: str, steps: int) -> dict[str, Any]:
    read_every = READ_EVERY if name == "T5" else 1
    local, x, y, step = mlp_step(procs, name)

    def floor_run() -> Any:
        shape = SHAPES["T1b" if name == "T5" else name]
        return spmd.train.call(key, local.state_dict(), shape, x, y, steps, read_every)

    return _versus(name, step, floor_run, steps, read_every, spmd)


def t6(procs: Any, spmd: Any, key: str) -> dict[str, Any]:
    local = gpt2()
    batch = token_batch()
    state = {k: v.clone() for k, v in local.state_dict().items()}
    model = module_to_mesh(local, procs)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        loss.item()

    def floor_run() -> Any:
        return spmd.train_gpt2.call(key, state, batch, STEPS_T6)

    return _versus("T6", step, floor_run, STEPS_T6, 1, spmd)


def _versus(
    name: str, step: Any, floor_run: Any, steps: int, read_every: int, spmd: Any
) -> dict[str, Any]:
    """``steps`` of ``step`` through the controller, then the floor, ``ROUNDS`` times."""
    ours: list[float] = []
    floor: list[float] = []
    # CPU ms per step, per block: the controller, the 4 workers together, both (the VM's wall
    # times swing 2x with its regime and the other tenants; CPU per step far less).
    cpu: dict[str, list[float]] = {"controller": [], "workers": [], "total": []}
    floor_cpu: list[float] = []
    for _ in range(WARMUP_STEPS if read_every == 1 else 2 * read_every):
        step()
    for _ in range(ROUNDS):
        workers = sum(spmd.cpu.call().get(timeout=60).values())
        mine = process_cpu()
        if read_every == 1:
            for _ in range(steps):
                t0 = time.perf_counter_ns()
                step()
                ours.append((time.perf_counter_ns() - t0) / 1e3)
        else:  # the block's time per step: the steps between reads return at once
            t0 = time.perf_counter_ns()
            for _ in range(steps):
                step()
            ours.append((time.perf_counter_ns() - t0) / 1e3 / steps)
        mine = (process_cpu() - mine) * 1e3 / steps
        workers = (sum(spmd.cpu.call().get(timeout=60).values()) - workers) * 1e3 / steps
        for part, ms in (("controller", mine), ("workers", workers), ("total", mine + workers)):
            cpu[part].append(ms)
        replies = floor_run().get(timeout=300)
        if read_every == 1:
            floor.extend(t / 1e3 for t in slowest([r[0] for r in replies.values()]))
        else:
            floor.append(max(sum(r[0]) for r in replies.values()) / 1e3 / steps)
        floor_cpu.append(sum(r[1] for r in replies.values()) * 1e3 / steps)
    result = compare(name, ours, floor)
    result["cpu_ms_per_step"] = {part: statistics.median(v) for part, v in cpu.items()}
    result["spmd_cpu_ms_per_step"] = spmd_cpu = statistics.median(floor_cpu)
    result["cpu_ratio"] = result["cpu_ms_per_step"]["total"] / spmd_cpu
    result["cpu_target"] = CPU_TARGETS[name]
    if CPU_TARGETS[name] is not None:
        result["cpu_met"] = result["cpu_ratio"] <= CPU_TARGETS[name]
    share = result["cpu_ms_per_step"]["controller"] / spmd_cpu
    result["controller_share_of_spmd_cpu"] = share
    result["controller_share_met"] = share <= CONTROLLER_SHARE
    return result


def t2(procs: Any) -> dict[str, Any]:
    a = distribute(torch.ones(8, 8), procs)
    la = torch.ones(8, 8)
    b = a + a  # the shape cache now holds aten.add on 8x8
    inspect(b)
    ours: list[float] = []
    floor: list[float] = []
    for _ in range(RECORD_BLOCKS):
        t0 = time.perf_counter_ns()
        for _ in range(RECORD_BLOCK):
            lb = la + la
        floor.append((time.perf_counter_ns() - t0) / 1e3 / RECORD_BLOCK)
        t0 = time.perf_counter_ns()
        for _ in range(RECORD_BLOCK):
            b = a + a
        ours.append((time.perf_counter_ns() - t0) / 1e3 / RECORD_BLOCK)
        # Sent and run after the block, untimed: T2 is the recording, and the next blocks must
        # not share the 2 cores with 4 workers running this one.
        inspect(b)
    del lb
    return compare("T2", ours, floor)


def t3(procs: Any, spmd: Any, key: str) -> dict[str, Any]:
    x = torch.zeros(8, 8)
    ours: list[float] = []
    floor: list[float] = []
    for r in range(ROUNDS + 1):
        for _ in range(CHAINS):
            d = distribute(x, procs, sharding_spec=["dp", None])
            inspect(d)
            t0 = time.perf_counter_ns()
            for _ in range(CHAIN):
                d = d + 1
            inspect(d)
            if r:  # round 0 warms up
                ours.append((time.perf_counter_ns() - t0) / 1e3 / CHAIN)
            per_rank = spmd.chain.call(key, CHAIN).get(timeout=300).values()
            if r:
                floor.append(max(per_rank) / 1e3 / CHAIN)
    return compare("T3", ours, floor)


def t4(procs: Any) -> dict[str, Any]:
    tm = tensor_mesh(procs)
    node = node_mod._node
    assert node is not None
    signer = node.transport._signer
    counts: Counter[bytes] = Counter()
    kinds: Counter[str] = Counter()  # what the controller sent, by envelope kind
    real = signer.frames

    def counting(dest: Any, envelope: Any, *args: Any, **kwargs: Any) -> Any:
        for m in [dest] if isinstance(dest, bytes) else dest:
            counts[m] += 1
        kinds[str(envelope[0])] += 1
        return real(dest, envelope, *args, **kwargs)

    t = distribute(torch.zeros(4, 4), procs, sharding_spec=["dp", None])
    inspect(t)
    gc.collect()
    before = [s["run"] for s in tm.engine.stats.call().get(timeout=60).values()]
    signer.frames = counting  # type: ignore[method-assign]
    try:
        for _ in range(T4_OPS):
            t = t + 1
        tm.stream.flush()  # what is still buffered goes now (not a sync point: no reply)
    finally:
        signer.frames = real  # type: ignore[method-assign]
    assert torch.equal(inspect(t), torch.full((4, 4), float(T4_OPS)))
    after = [s["run"] for s in tm.engine.stats.call().get(timeout=60).values()]
    per_process = [a - b for a, b in zip(after, before, strict=True)]
    return {
        "controller_messages": sum(counts.values()),
        "controller_destinations": len(counts),
        "controller_message_kinds": dict(kinds),
        "batches_per_process": per_process,
        "max": max(per_process),
        "target": TARGETS["T4"],
        "met": max(per_process) <= TARGETS["T4"],
    }


def main() -> None:
    torch.set_num_threads(1)
    started = time.time()
    shape = mesh_shape()
    procs = am.this_host().spawn_procs(per_host=shape)
    try:
        tm = tensor_mesh(procs)
        spmd = procs.spawn("spmd", Spmd)
        result: dict[str, Any] = {
            "machine": C.machine_info(),
            "quick": C.QUICK,
            "mesh": shape,
            "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
            "engine_device": str(tm.device),
            "rounds": ROUNDS,
            "torch": torch.__version__,
        }
        result["code"] = sorted({os.path.dirname(os.path.dirname(am.__file__)),
                                 *spmd.code.call().get(timeout=60).values()})  # fmt: skip
        every = "T4,T2,T3,T1,T1b,T5,T6" if DEVICE == "cpu" else "T2,T1,T1b,T5,T6"
        only = os.environ.get("BENCH_ONLY", every).split(",")
        if "T4" in only:
            result["T4"] = t4(procs)  # first: nothing else in flight
        if "T2" in only:
            result["T2"] = t2(procs)
        if "T3" in only:
            result["T3"] = t3(procs, spmd, tm.key)
        steps = {
            "T1": lambda: t1(procs, spmd, tm.key, "T1", STEPS),
            "T1b": lambda: t1(procs, spmd, tm.key, "T1b", STEPS_WIDE),
            "T5": lambda: t1(procs, spmd, tm.key, "T5", STEPS_T5),
            "T6": lambda: t6(procs, spmd, tm.key),
        }
        for name, run in steps.items():
            if name not in only:
                continue
            try:
                result[name] = run()
            except RemoteTensorError as exc:  # a rank's op failed; the mesh goes on
                # The other cases still run and are kept (GPT-2's backward fails on a GPU mesh
                # under torch 2.11: docs/gpus.md); the run ends with an error.
                print(f"{name} failed: {exc}", file=sys.stderr)
                result[name] = {"error": str(exc).split("\n", 1)[0]}
        result["programs_sent"] = getattr(tm.stream, "programs", None) and tm.stream.programs.sent
        with open("/proc/loadavg") as f:
            result["loadavg_end"] = f.read().split()[:3]
        result["seconds"] = round(time.time() - started, 1)
    finally:
        procs.stop().get(timeout=60)
    C.print_result(result)
    if any(isinstance(r, dict) and "error" in r for r in result.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
