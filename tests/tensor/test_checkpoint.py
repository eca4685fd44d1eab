"""``am.checkpoint`` (issue 42): DCP checkpoints of a meshed model's training state, written by the
ranks, read back bit for bit in every mode, resharded across mesh shapes and parallelisms,
interchangeable with SPMD DCP checkpoints, saved in the background, and never lost to a failed
write. 4 ranks, gloo, float64."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from training import MLP, MODES, steps

import actormesh as am
from actormesh.tensor import RemoteTensorError, distribute, inspect, module_to_mesh

WAIT = 120


def batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(7, 8, generator=g, dtype=torch.float64),
         torch.randn(7, 4, generator=g, dtype=torch.float64))
        for _ in range(n)
    ]  # fmt: skip


def values(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every number of the training state, fetched: weights, optimizer state, step counts."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = {f"model.{k}": v for k, v in inspect(dict(model.state_dict())).items()}
    for p, entries in opt.state.items():
        for k, v in entries.items():
            out[f"optim.{names[id(p)]}.{k}"] = inspect(v) if isinstance(v, am.MeshTensor) else v
    return {k: v.clone() for k, v in out.items()}


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def meshed(mesh: Any, mode: str, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = module_to_mesh(MLP().double(), mesh, **MODES[mode])
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


@pytest.mark.parametrize("mode", list(MODES))
def test_round_trip_is_bit_for_bit(mesh: Any, mode: str, tmp_path: Any) -> None:
    model, opt = meshed(mesh, mode)
    data = batches(6)
    steps(model, opt, data[:2])
    extra = distribute(torch.randn(4, 6, dtype=torch.float64), mesh, sharding_spec=["dp", "tp"])
    state = {"model": model, "optim": opt, "step": 2, "extra": extra, "note": {"lr": [1e-2]}}
    am.checkpoint.save(state, checkpoint_id=tmp_path / "ckpt", timeout=WAIT)
    saved, saved_extra = values(model, opt), inspect(extra)
    after = steps(model, opt, data[2:4])  # the steps a resumed run must repeat exactly
    extra.mul_(3)
    state.update(step=4, note={"lr": [0.5]})
    am.checkpoint.load(state, checkpoint_id=tmp_path / "ckpt", timeout=WAIT)
    assert state["step"] == 2 and state["note"] == {"lr": [1e-2]} and state["extra"] is extra
    assert_identical(values(model, opt), saved)
    assert torch.equal(inspect(extra), saved_extra)
    assert steps(model, opt, data[2:4]) == after


def test_fresh_model_and_optimizer_resume_exactly(mesh: Any, tmp_path: Any) -> None:
    """A new process's view: a model built again and an optimizer that never stepped load the
    checkpoint and continue with the losses of the run that wrote it."""
    model, opt = meshed(mesh, "fsdp")
    data = batches(4)
    steps(model, opt, data[:2])
    am.checkpoint.save({"model": model, "optim": opt}, checkpoint_id=tmp_path / "c", timeout=WAIT)
    expected = steps(model, opt, data[2:])
    model2, opt2 = meshed(mesh, "fsdp", seed=5)  # other initial weights, no optimizer state
    am.checkpoint.load({"model": model2, "optim": opt2}, checkpoint_id=tmp_path / "c")
    assert steps(model2, opt2, data[2:]) == expected


def test_reshards_across_modes_on_one_mesh(mesh: Any, tmp_path: Any) -> None:
    """fsdp -> tp_plan -> default -> fsdp+tp_plan: each load gives the same numbers."""
    model, opt = meshed(mesh, "fsdp")
    steps(model, opt, batches(2))
    am.checkpoint.save({"model": model, "optim": opt}, checkpoint_id=tmp_path / "a", timeout=WAIT)
    expected = values(model, opt)
    for i, mode in enumerate(["tp_plan", "default", "fsdp+tp_plan"]):
        other, other_opt = meshed(mesh, mode, seed=7)
        state = {"model": other, "optim": other_opt}
        am.checkpoint.load(state, checkpoint_id=tmp_path / ("a" if i == 0 else f"{i}"))
        assert_identical(values(other, other_opt), expected)
        am.checkpoint.save(state, checkpoint_id=tmp_path / f"{i + 1}", timeout=WAIT)


def test_reshards_four_ranks_to_two_and_two_to_four(
    mesh: Any, spawn_procs: Callable[..., Any], tmp_path: Any
) -> None:
    data = batches(4)
    model, opt = meshed(mesh, "fsdp+tp_plan")
    steps(model, opt, data[:2])
    am.checkpoint.save({"model": model, "optim": opt}, checkpoint_id=tmp_path / "4", timeout=WAIT)
    expected = values(model, opt)
    continued = steps(model, opt, data[2:])
    two = spawn_procs(per_host={"dp": 2})
    small, small_opt = meshed(two, "fsdp", seed=9)
    am.checkpoint.load({"model": small, "optim": small_opt}, checkpoint_id=tmp_path / "4")
    assert_identical(values(small, small_opt), expected)
    # Another mesh sums in another order: the same numbers to rounding, not bit for bit.
    assert steps(small, small_opt, data[2:]) == pytest.approx(continued, abs=1e-12, rel=0)
    am.checkpoint.save({"model": small, "optim": small_opt}, checkpoint_id=tmp_path / "2")
    back, back_opt = meshed(mesh, "tp_plan", seed=11)
    am.checkpoint.load({"model": back, "optim": back_opt}, checkpoint_id=tmp_path / "2")
    assert_identical(values(back, back_opt), values(small, small_opt))


class Spmd(am.Actor):
    """An SPMD program, as torchrun would run it: FSDP2 over the ranks, DCP's own calls."""

    def __init__(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        self.model = MLP().double()
        fully_shard(self.model, mesh=init_device_mesh("cpu", (2,)))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)

    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.opt)
        return {"model": model_sd, "optim": optim_sd}

    @am.endpoint
    def train_and_save(self, data: list[Any], path: str) -> None:
        import torch.distributed.checkpoint as dcp

        for x, y in data:
            self.opt.zero_grad()
            nn.functional.mse_loss(self.model(x), y).backward()
            self.opt.step()
        dcp.save(self._state(), checkpoint_id=path)

    @am.endpoint
    def load(self, path: str) -> dict[str, torch.Tensor]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state()
        dcp.load(state, checkpoint_id=path)
        set_state_dict(self.model, self.opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])  # fmt: skip
        return self.full_values()

    @am.endpoint
    def full_values(self) -> dict[str, torch.Tensor]:
        def full(v: Any) -> Any:
            return v.full_tensor() if hasattr(v, "full_tensor") else v

        out = {f"model.{k}": full(v) for k, v in self.model.state_dict().items()}
        names = {id(p): n for n, p in self.model.named_parameters()}
        for p, entries in self.opt.state.items():
            for k, v in entries.items():
                out[f"optim.{names[id(p)]}.{k}"] = full(v)
        return {k: v.detach().clone() for k, v in out.items()}


def test_spmd_dcp_checkpoint_loads_into_a_meshed_model_and_back(
    mesh: Any, spawn_procs: Callable[..., Any], tmp_path: Any
) -> None:
    procs = spawn_procs(per_host={"gpus": 2})
    am.init_process_group(procs).get(timeout=WAIT)
    spmd = procs.spawn("spmd", Spmd)
    path = str(tmp_path / "spmd")
    spmd.train_and_save.call(batches(2), path).get(timeout=WAIT)
    written = spmd.full_values.call().get(timeout=WAIT).values()[0]
    for mode in ("default", "fsdp+tp_plan"):
        model, opt = meshed(mesh, mode, seed=3)
        am.checkpoint.load({"model": model, "optim": opt}, checkpoint_id=path, timeout=WAIT)
        assert_identical(values(model, opt), written)
    steps(model, opt, batches(1, seed=8))  # the meshed run goes on, then SPMD takes it back
    am.checkpoint.save({"model": model, "optim": opt}, checkpoint_id=tmp_path / "m", timeout=WAIT)
    back = spmd.load.call(str(tmp_path / "m")).get(timeout=WAIT).values()
    assert_identical(back[0], values(model, opt))
    assert_identical(back[1], back[0])
    am.destroy_process_group(procs).get(timeout=WAIT)


def test_async_save_writes_the_state_of_its_point_in_the_stream(mesh: Any, tmp_path: Any) -> None:
    model, opt = meshed(mesh, "fsdp")
    data = batches(5)
    steps(model, opt, data[:1])
    state = {"model": model, "optim": opt, "step": 1}
    future = am.checkpoint.async_save(state, checkpoint_id=tmp_path / "bg")
    at_save = values(model, opt)  # fetched after the save's op: the same point of the stream
    after = steps(model, opt, data[1:3])  # training goes on while the ranks write
    metadata = future.get(timeout=WAIT)
    assert metadata is not None and os.path.exists(tmp_path / "bg" / ".metadata")
    assert not [p for p in os.listdir(tmp_path) if ".partial-" in p]
    # A second background save queues behind nothing and overlaps the steps too.
    second = am.checkpoint.async_save(state, checkpoint_id=tmp_path / "bg2")
    steps(model, opt, data[3:])
    second.get(timeout=WAIT)
    am.checkpoint.load(state, checkpoint_id=tmp_path / "bg", timeout=WAIT)
    assert_identical(values(model, opt), at_save)
    assert steps(model, opt, data[1:3]) == after


def test_a_rank_lost_during_a_background_save_fails_it_and_keeps_the_previous_checkpoint(
    mesh: Any, tmp_path: Any, unhandled_failures: list[Any]
) -> None:
    """The victim is held in a remote function before the save's op reaches it (the other
    ranks wait for it inside DCP) and killed there: the save cannot have completed."""
    model, opt = meshed(mesh, "default")
    steps(model, opt, batches(1))
    path = tmp_path / "ckpt"
    am.checkpoint.save({"model": model, "optim": opt}, checkpoint_id=path, timeout=WAIT)
    before = sorted(os.listdir(path))
    victim = am.call_on_shard_and_fetch(pid, model.fc1.weight, dp=1, tp=1).get(timeout=WAIT)
    hold(model.fc1.weight, str(tmp_path / "held"))
    future = am.checkpoint.async_save({"model": model, "optim": opt}, checkpoint_id=path)
    wait_for_file(tmp_path / "held")
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(am.SupervisionError) as caught:
        future.get(timeout=WAIT)
    message = str(caught.value)
    assert "background checkpoint was not completed" in message and "dp=1,tp=1" in message
    assert "_checkpoint_watch" not in message  # the user's words, not the runtime's
    assert sorted(os.listdir(path)) == before
    unhandled_failures.clear()


def pid(t: torch.Tensor) -> int:
    return os.getpid()


@am.remote(propagate=lambda t, *_: t)
def hold(t: torch.Tensor, flag: str) -> torch.Tensor:
    if am.current_rank() == {"dp": 1, "tp": 1}:
        open(flag, "w").close()
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:  # killed from outside well before
            time.sleep(0.01)
    return t


def wait_for_file(path: Any) -> None:
    deadline = time.monotonic() + WAIT
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear within {WAIT} s"
        time.sleep(0.01)  # polling a file with a deadline


@pytest.fixture
def small_disk(tmp_path: Any) -> Any:
    """A 512 KiB tmpfs: a disk that fills up. Needs root (CI and these machines are)."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def test_a_full_disk_fails_the_save_and_keeps_the_previous_checkpoint(
    mesh: Any, small_disk: Any
) -> None:
    model, opt = meshed(mesh, "default")
    steps(model, opt, batches(1))
    path = small_disk / "ckpt"
    am.checkpoint.save({"model": model, "optim": opt}, checkpoint_id=path, timeout=WAIT)
    kept = values(model, opt)
    before = sorted(os.listdir(path))
    steps(model, opt, batches(1, seed=4))
    big = distribute(torch.zeros(256, 1024, dtype=torch.float64), mesh)  # 2 MiB: does not fit
    with pytest.raises(RemoteTensorError, match="No space left on device"):
        am.checkpoint.save({"model": model, "optim": opt, "big": big}, checkpoint_id=path,
                           timeout=WAIT)  # fmt: skip
    assert sorted(os.listdir(path)) == before  # the previous checkpoint, whole
    assert os.listdir(small_disk) == ["ckpt"]  # and the failed one's files are gone
    am.checkpoint.load({"model": model, "optim": opt}, checkpoint_id=path, timeout=WAIT)
    assert_identical(values(model, opt), kept)
    future = am.checkpoint.async_save({"model": model, "big": big}, checkpoint_id=path)
    with pytest.raises(am.ActorError, match="No space left on device"):
        future.get(timeout=WAIT)
    assert sorted(os.listdir(path)) == before


def test_a_failed_value_is_never_written(mesh: Any, tmp_path: Any) -> None:
    @am.remote(propagate=lambda t: t)
    def boom(t: torch.Tensor) -> torch.Tensor:
        if am.current_rank()["tp"] == 1:
            raise ValueError("boom on tp=1")
        return t

    good = distribute(torch.ones(4, 4), mesh, sharding_spec=["dp", None])
    bad = boom(good)
    with pytest.raises(RemoteTensorError, match="boom on tp=1"):
        inspect(bad)
    with pytest.raises(RemoteTensorError, match="never holds a failed value"):
        am.checkpoint.save({"good": good, "bad": bad}, checkpoint_id=tmp_path / "x", timeout=WAIT)
    assert not os.path.exists(tmp_path / "x") and os.listdir(tmp_path) == []
    am.checkpoint.save({"t": good}, checkpoint_id=tmp_path / "y", timeout=WAIT)
    am.checkpoint.load({"t": bad}, checkpoint_id=tmp_path / "y", timeout=WAIT)
    assert torch.equal(inspect(bad), torch.ones(4, 4))  # loaded over: good again


def test_bad_requests_are_refused_at_the_call(mesh: Any, tmp_path: Any) -> None:
    model, opt = meshed(mesh, "default")
    with pytest.raises(am.MeshUsageError, match="a dict of state"):
        am.checkpoint.save(model, checkpoint_id=tmp_path / "a")  # type: ignore[arg-type]
    with pytest.raises(am.MeshUsageError, match="put the model in the state too"):
        am.checkpoint.save({"optim": opt}, checkpoint_id=tmp_path / "a")
    with pytest.raises(am.MeshUsageError, match="holds no MeshTensor"):
        am.checkpoint.save({"step": 1}, checkpoint_id=tmp_path / "a")
    with pytest.raises(am.MeshUsageError, match="checkpoint_id"):
        am.checkpoint.save({"model": model}, checkpoint_id=None)
    with mesh.activate():
        per_rank = torch.ones(2)
    with pytest.raises(am.MeshUsageError, match="per-rank MeshTensor"):
        am.checkpoint.save({"t": per_rank}, checkpoint_id=tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="no DCP checkpoint"):
        am.checkpoint.load({"model": model}, checkpoint_id=tmp_path / "missing")
    weights = values(model, opt)
    am.checkpoint.save({"model": model}, checkpoint_id=tmp_path / "m", timeout=WAIT)
    other = module_to_mesh(nn.Linear(3, 3).double(), mesh)
    with pytest.raises(RuntimeError, match="nothing was changed"):
        am.checkpoint.load({"model": other}, checkpoint_id=tmp_path / "m", timeout=WAIT)
    assert_identical(values(model, opt), weights)
    assert inspect(other.weight).shape == (3, 3)  # both models stay usable
