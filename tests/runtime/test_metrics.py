"""``am.log_metrics`` on ranks and on the controller, read back with ``procs.metrics()``."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch
from support import wait_until

import actormesh as am


class Trainer(am.Actor):
    @am.endpoint
    def train(self, steps: int) -> int:
        rank = am.current_rank()["gpus"]
        for step in range(steps):
            am.log_metrics({"loss": 10.0 * rank + step, "lr": torch.tensor(0.5)}, step=step)
        return steps

    @am.endpoint
    def log(self, values: object, step: object = None) -> None:
        am.log_metrics(values, step=step)  # type: ignore[arg-type]

    @am.endpoint
    def train_until(self, flag: str, timeout: float) -> int:
        am.log_metrics({"loss": 1.0}, step=0)
        deadline = time.monotonic() + timeout
        while not os.path.exists(flag):  # the test lets it finish once it saw the value
            if time.monotonic() > deadline:
                raise TimeoutError("the test never let this endpoint finish")
            time.sleep(0.01)
        return 0


@pytest.fixture(scope="module")
def trainers(shared_procs: am.ProcMesh) -> am.ActorMesh[Trainer]:
    return shared_procs.spawn("metrics_trainer", Trainer)


def rows(procs: am.ProcMesh, *names: str) -> list[dict[str, object]]:
    table = procs.metrics(*names)
    return table.to_dict("records") if hasattr(table, "to_dict") else list(table)


def test_values_logged_by_an_endpoint_are_there_when_its_call_returns(
    shared_procs: am.ProcMesh, trainers: am.ActorMesh[Trainer]
) -> None:
    before = len(rows(shared_procs, "loss"))
    trainers.train.call(5).get(timeout=30)
    loss = rows(shared_procs, "loss")[before:]
    assert len(loss) == 4 * 5
    by_rank = {(r["gpus"], r["step"]): r["value"] for r in loss}
    assert by_rank == {(g, s): 10.0 * g + s for g in range(4) for s in range(5)}
    first = loss[0]
    assert set(first) == {"name", "value", "step", "time", "rank", "hosts", "gpus"}
    assert all(r["rank"] == r["gpus"] for r in loss)
    lr = rows(shared_procs, "lr")
    assert lr and all(r["value"] == 0.5 for r in lr)  # a 0-d tensor became a float on the rank


def test_a_slice_reports_its_own_ranks(
    shared_procs: am.ProcMesh, trainers: am.ActorMesh[Trainer]
) -> None:
    trainers.slice(gpus=slice(2, 4)).train.call(1).get(timeout=30)
    sliced = rows(shared_procs.slice(gpus=slice(2, 4)), "loss")
    assert sliced and {r["gpus"] for r in sliced} == {0, 1}
    assert {r["value"] for r in sliced if r["step"] == 0} >= {20.0, 30.0}


def test_values_of_an_endpoint_still_running_arrive_within_a_second(
    shared_procs: am.ProcMesh, trainers: am.ActorMesh[Trainer], tmp_path: object
) -> None:
    flag = os.path.join(str(tmp_path), "go")
    before = len(rows(shared_procs, "loss"))
    running = trainers.slice(gpus=0).train_until.call_one(flag, 30.0)
    try:
        wait_until(lambda: len(rows(shared_procs, "loss")) > before, timeout=10, what="a value")
        assert not running.done()  # it came while the endpoint was still running
    finally:
        open(flag, "w").close()
    assert running.get(timeout=30) == 0


@pytest.mark.parametrize(
    ("values", "step", "message"),
    [
        ({"loss": "high"}, None, "'loss' must be a number or a 0-d tensor, got str"),
        ({"loss": torch.ones(3)}, None, r"'loss' is a tensor of shape \(3,\)"),
        ([("loss", 1.0)], None, "takes a mapping of name to number"),
        ({"": 1.0}, None, "a metric name must be a non-empty str"),
        ({"loss": 1.0}, 1.5, "step must be an int or None"),
    ],
)
def test_bad_values_are_refused_on_the_rank_with_a_clear_error(
    trainers: am.ActorMesh[Trainer], values: object, step: object, message: str
) -> None:
    with pytest.raises(am.ActorError, match=message):
        trainers.slice(gpus=0).log.call_one(values, step).get(timeout=30)


def test_the_controller_logs_into_this_proc() -> None:
    am.log_metrics({"reward": 2.5}, step=7)
    mine = [r for r in rows(am.this_proc(), "reward") if r["step"] == 7]
    assert mine and mine[-1]["value"] == 2.5 and mine[-1]["rank"] == 0
    with pytest.raises(am.MeshError, match="must be a number"):
        am.log_metrics({"reward": object()})


EXPORT_SCRIPT = """
import actormesh as am

class Trainer(am.Actor):
    @am.endpoint
    def train(self):
        gpus = am.current_rank()["gpus"]
        for step in range(3):
            am.log_metrics({"loss": 10.0 * gpus + step}, step=step)
        am.log_metrics({"lr": 0.5})

procs = am.this_host().spawn_procs(per_host={"gpus": 2}, name="tb")
procs.spawn("trainer", Trainer).train.call().get(timeout=60)
procs.stop().get(timeout=60)
"""


def test_metrics_go_to_tensorboard_when_asked(tmp_path: pathlib.Path) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="tensorboard is not installed (pip install tensorboard)",
    )
    script = tmp_path / "train.py"
    script.write_text(EXPORT_SCRIPT)
    env = {**os.environ, "ACTORMESH_TENSORBOARD_DIR": str(tmp_path / "tb")}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    (run,) = (tmp_path / "tb").iterdir()  # one run for the one mesh
    events = event_accumulator.EventAccumulator(str(run))
    events.Reload()
    tags = sorted(events.Tags()["scalars"])
    assert tags == ["loss/gpus=0", "loss/gpus=1", "lr/gpus=0", "lr/gpus=1"]
    loss = [(e.step, e.value) for e in events.Scalars("loss/gpus=1")]
    assert loss == [(0, 10.0), (1, 11.0), (2, 12.0)]
    assert [e.step for e in events.Scalars("lr/gpus=0")] == [0]  # no step given: counted


class Spinner(am.Actor):
    @am.endpoint
    def spin_until(self, flag: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not os.path.exists(flag) and time.monotonic() < deadline:
            pass  # busy on purpose: the sampled CPU use must show it


def test_host_agents_sample_each_ranks_cpu_and_memory(
    shared_procs: am.ProcMesh, tmp_path: pathlib.Path
) -> None:
    history = shared_procs._record.resources  # the controller's samples, for the sidebar
    wait_until(
        lambda: all(len(history.series(r)) >= 2 for r in range(4)),
        timeout=15,
        what="two samples of every rank",
    )
    assert all(s.rss > 10 << 20 for s in history.latest().values())  # a Python + torch
    flag = tmp_path / "stop"
    spinning = (
        shared_procs.spawn("spinner", Spinner).slice(gpus=1).spin_until.call_one(str(flag), 30.0)
    )
    try:
        wait_until(
            lambda: any(s.cpu > 20 for s in history.series(1)[-3:]),
            timeout=15,
            what="rank 1's busy loop in its CPU samples",
        )
    finally:
        flag.touch()
    spinning.get(timeout=30)
