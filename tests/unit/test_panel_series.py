"""The charts' feed (``kernel/panel/series.py``): only what is new goes to the panel, bounded,
and a new subscription starts over with the whole kept history."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from actormesh.kernel.panel import protocol, series
from actormesh.runtime.messaging.metrics import MetricsLog
from actormesh.runtime.procs.sampling import ResourceHistory, Sample


def record(mesh_id: str = "mesh-1") -> Any:
    return SimpleNamespace(
        table=SimpleNamespace(mesh_id=mesh_id), resources=ResourceHistory(), metrics=MetricsLog()
    )


def loss(rec: Any, rank: int, steps: range, step: bool = True) -> None:
    rec.metrics.add(rank, [("loss", 1.0 / (s + 1), s if step else None, 100.0 + s) for s in steps])


def test_only_new_points_are_sent() -> None:
    feed = series.SeriesFeed()
    rec = record()
    first = feed.update([rec])
    assert first is not None and first["reset"] and first["meshes"] == []
    assert feed.update([rec]) is None  # nothing new: nothing sent
    for t in range(3):
        rec.resources.add(0, Sample(100.0 + t, 50.0, 1 << 20))
    loss(rec, 0, range(3))
    loss(rec, 1, range(2))
    msg = feed.update([rec])
    assert msg is not None and not msg["reset"]
    protocol.check_message(msg)
    (mesh,) = msg["meshes"]
    assert mesh["resources"] == [
        {
            "rank": 0,
            "time": [100.0, 101.0, 102.0],
            "cpu": [50.0] * 3,
            "rss": [1 << 20] * 3,
            "gpu_mem": None,
            "gpu_util": None,
        }
    ]
    (metric,) = mesh["metrics"]
    assert metric["name"] == "loss"
    assert [(r["rank"], r["step"]) for r in metric["ranks"]] == [(0, [0, 1, 2]), (1, [0, 1])]

    rec.resources.add(0, Sample(103.0, 20.0, 2 << 20, 5 << 20, 70))
    loss(rec, 0, range(3, 4))
    msg = feed.update([rec])
    assert msg is not None
    protocol.check_message(msg)
    (mesh,) = msg["meshes"]
    assert mesh["resources"][0]["time"] == [103.0] and mesh["resources"][0]["gpu_util"] == [70]
    assert mesh["metrics"][0]["ranks"] == [{"rank": 0, "step": [3], "value": [0.25]}]


def test_bounded_and_reset_resends_history() -> None:
    feed = series.SeriesFeed()
    rec = record()
    feed.update([rec])
    loss(rec, 2, range(series.METRIC_POINTS + 10))
    for t in range(series.RESOURCE_POINTS + 5):
        rec.resources.add(1, Sample(float(t), 1.0, 1))
    msg = feed.update([rec])
    assert msg is not None
    points = msg["meshes"][0]["metrics"][0]["ranks"][0]
    assert len(points["step"]) == series.METRIC_POINTS and points["step"][-1] == 2009
    # the history keeps 600 samples, and sends the newest of them
    assert len(msg["meshes"][0]["resources"][0]["time"]) == series.RESOURCE_POINTS
    feed.reset()
    again = feed.update([rec])
    assert again is not None and again["reset"]
    assert again["meshes"][0]["metrics"][0]["ranks"][0]["step"][-1] == 2009


def test_steps_default_to_ordinals_and_nan_is_null() -> None:
    feed = series.SeriesFeed()
    rec = record()
    loss(rec, 0, range(2), step=False)
    rec.metrics.add(0, [("loss", float("nan"), None, 1.0)])
    msg = feed.update([rec])
    assert msg is not None
    protocol.check_message(msg)
    assert msg["meshes"][0]["metrics"][0]["ranks"][0] == {
        "rank": 0,
        "step": [0, 1, 2],
        "value": [1.0, 0.5, None],
    }
    loss(rec, 0, range(1), step=False)
    msg = feed.update([rec])
    assert msg is not None and msg["meshes"][0]["metrics"][0]["ranks"][0]["step"] == [3]


def test_a_stopped_mesh_is_forgotten() -> None:
    feed = series.SeriesFeed()
    rec = record()
    loss(rec, 0, range(2))
    feed.update([rec])
    assert feed.update([]) is None
    msg = feed.update([rec])  # the same id again (say, a panel test): all of it anew
    assert msg is not None and msg["meshes"][0]["metrics"][0]["ranks"][0]["step"] == [0, 1]


def test_metrics_log_since_survives_trimming() -> None:
    log = MetricsLog(keep=5)
    log.add(0, [("x", float(i), i, 0.0) for i in range(3)])
    rows, cursor = log.since(0)
    assert [r[3] for r in rows] == [0, 1, 2] and cursor == 3
    log.add(0, [("x", float(i), i, 0.0) for i in range(3, 10)])
    rows, cursor = log.since(cursor)
    assert [r[3] for r in rows] == [5, 6, 7, 8, 9] and cursor == 10  # 3, 4 were trimmed
    assert log.since(cursor) == ([], 10)
