"""``am.log_metrics`` on ranks and on the controller, read back with ``procs.metrics()``."""

from __future__ import annotations

import os
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
