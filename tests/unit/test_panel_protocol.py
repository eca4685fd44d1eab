"""The panel protocol's JSON fixtures (tests/fixtures/panel/), checked on the Python side with the
kernel's own schema; ``labextension/test/protocol.test.cjs`` checks the same files with the
panel's parser."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from actormesh.kernel.panel import protocol
from actormesh.kernel.panel.watch import cell_label

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "panel"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def names(prefix: str = "") -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob(f"{prefix}*.json"))


def test_there_is_a_fixture_per_message() -> None:
    kinds = {fixture(n)["type"] for n in names() if "type" in fixture(n)}
    assert kinds == {"hello", "snapshot", "series", "stacks", "result"}
    assert {fixture(n)["op"] for n in names("request_")} >= {"subscribe", "interrupt", "stacks"}
    assert {fixture(n)["status"] for n in names("reply_")} == {"ok", "error"}


@pytest.mark.parametrize("name", [n for n in names() if not n.startswith(("request_", "reply_"))])
def test_kernel_messages_follow_the_schema(name: str) -> None:
    protocol.check_message(fixture(name))


@pytest.mark.parametrize("name", names("request_"))
def test_requests_parse(name: str) -> None:
    data = fixture(name)
    request = protocol.parse_request(data)
    assert request.request_id == data["request_id"] and request.op == data["op"]
    if data.get("ranks") is not None:
        assert request.ranks == tuple(data["ranks"])


@pytest.mark.parametrize("name", names("reply_"))
def test_replies_are_what_the_kernel_sends(name: str) -> None:
    data = fixture(name)
    assert protocol.reply(data["request_id"], data["message"] or None) == data


def test_builders_match_the_fixtures() -> None:
    hello = fixture("hello")
    assert protocol.hello(hello["client"], hello["debugger"]) == hello
    result = fixture("result")
    args = (result["request_id"], result["op"], result["ok"], result["message"])
    assert protocol.result(*args) == result
    stacks = fixture("stacks")
    assert protocol.stacks(stacks["request_id"], stacks["mesh_id"], stacks["groups"]) == stacks
    snap = fixture("snapshot")
    assert protocol.snapshot(snap["time"], snap["debugger"], snap["meshes"]) == snap
    series = fixture("series")
    assert protocol.series(series["time"], series["reset"], series["meshes"]) == series


def test_series_columns_are_checked() -> None:
    series = fixture("series")
    bad = copy.deepcopy(series)
    bad["meshes"][0]["resources"][0]["cpu"].append(3.0)
    with pytest.raises(ValueError, match=r"resources\[0\]: columns of different lengths"):
        protocol.check_message(bad)
    bad = copy.deepcopy(series)
    bad["meshes"][0]["metrics"][0]["ranks"][0]["step"][1] = 1.5
    with pytest.raises(ValueError, match=r"step\[1\]"):
        protocol.check_message(bad)
    bad = copy.deepcopy(series)
    bad["meshes"][0]["resources"][1]["gpu_util"] = 87
    with pytest.raises(ValueError, match="gpu_util"):
        protocol.check_message(bad)


def test_schema_violations_say_where() -> None:
    snap = fixture("snapshot")
    bad = copy.deepcopy(snap)
    bad["meshes"][0]["hosts"][0]["ranks"][2]["state"] = "sleeping"
    with pytest.raises(ValueError, match=r"ranks\[2\]\.state: 'sleeping' is not one of"):
        protocol.check_message(bad)
    bad = copy.deepcopy(snap)
    del bad["meshes"][0]["hosts"][0]["ranks"][0]["pid"]
    with pytest.raises(ValueError, match=r"ranks\[0\]: missing \['pid'\]"):
        protocol.check_message(bad)
    bad = copy.deepcopy(snap)
    bad["meshes"][0]["hosts"][0]["ranks"][0]["pid"] = True
    with pytest.raises(ValueError, match="pid"):
        protocol.check_message(bad)
    with pytest.raises(ValueError, match="unknown message type"):
        protocol.check_message({"protocol": protocol.PROTOCOL_VERSION, "type": "gossip"})
    with pytest.raises(ValueError, match="protocol"):
        protocol.check_message({**fixture("snapshot_empty"), "protocol": 1})


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ([], "expected an object"),
        ({**fixture("request_stacks"), "protocol": 1}, "same actormesh version"),
        ({**fixture("request_stacks"), "op": "reboot"}, "unknown operation 'reboot'"),
        ({**fixture("request_stacks"), "mesh_id": 3}, "needs the mesh_id"),
        ({**fixture("request_stacks"), "ranks": [0, -1]}, "integers >= 0"),
        ({**fixture("request_stacks"), "ranks": [True]}, "integers >= 0"),
        ({**fixture("request_subscribe"), "client": ""}, "client token"),
        ({k: v for k, v in fixture("request_stacks").items() if k != "request_id"}, "request_id"),
    ],
)
def test_bad_requests_are_refused_with_the_reason(content: Any, error: str) -> None:
    with pytest.raises(protocol.PanelRequestError, match=error):
        protocol.parse_request(content)


def test_cell_labels_are_the_notebook_prompts() -> None:
    assert cell_label("<mesh-cell-7>") == "In [7]"
    assert cell_label("<mesh-cell-7.2>") == "In [7]"
    assert cell_label("train.py") == "train.py"
