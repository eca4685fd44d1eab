"""The messages between the kernel and the JupyterLab panel (protocol version 3).

Written down in ``docs/panel-protocol.md``; every message has a JSON fixture under
``tests/fixtures/panel/`` that the Python and the TypeScript tests both check.

Panel -> kernel: a control-channel request ``actormesh_panel_request`` (the control channel is
answered while a cell runs), answered by ``actormesh_panel_reply``. Kernel -> panel: a comm
with target ``actormesh.panel`` that the kernel opens on ``subscribe``; it carries ``hello``,
then ``snapshot``, ``series`` (chart data), ``stacks`` and ``result`` messages over iopub.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# 2: the ``series`` message (per-rank resource and metric series for the charts); a version-1
# panel would refuse it as an unknown type. 3: a mesh's ``recovery`` (a training run's lost
# rank, restored, resumed), a field a version-2 panel would refuse.
PROTOCOL_VERSION = 3
COMM_TARGET = "actormesh.panel"
REQUEST_TYPE = "actormesh_panel_request"
REPLY_TYPE = "actormesh_panel_reply"
OPS = ("subscribe", "interrupt", "stacks", "pause", "resume", "respawn", "stop")
RANK_STATES = ("starting", "idle", "busy", "paused", "dead")
RECOVERY_PHASES = ("restoring", "restored", "resumed", "failed")
RECOVERY_KINDS = ("recover", "shrink", "grow")


class PanelRequestError(ValueError):
    """A request that does not follow the protocol; the message says what is wrong."""


@dataclass(frozen=True)
class Request:
    request_id: str
    op: str
    client: str | None = None
    mesh_id: str | None = None
    ranks: tuple[int, ...] | None = None  # None: the whole mesh


def parse_request(content: Any) -> Request:
    """Check a request from the panel; raises :class:`PanelRequestError` saying what is wrong."""
    if not isinstance(content, dict):
        raise PanelRequestError("request: expected an object")
    version = content.get("protocol")
    if version != PROTOCOL_VERSION:
        raise PanelRequestError(
            f"the panel speaks protocol {version!r}, this kernel speaks {PROTOCOL_VERSION}: "
            "install the same actormesh version in JupyterLab and in the kernel"
        )
    request_id = content.get("request_id")
    if not isinstance(request_id, str):
        raise PanelRequestError("request.request_id: expected a string")
    op = content.get("op")
    if op not in OPS:
        raise PanelRequestError(f"request.op: unknown operation {op!r}; one of {', '.join(OPS)}")
    if op == "subscribe":
        client = content.get("client")
        if not isinstance(client, str) or not client:
            raise PanelRequestError("request.client: subscribe needs the panel's client token")
        return Request(request_id, op, client=client)
    mesh_id = content.get("mesh_id")
    if not isinstance(mesh_id, str):
        raise PanelRequestError(f"request.mesh_id: {op} needs the mesh_id of a proc mesh")
    ranks = content.get("ranks")
    if ranks is None:
        return Request(request_id, op, mesh_id=mesh_id)
    if not isinstance(ranks, list) or not all(
        isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks
    ):
        raise PanelRequestError("request.ranks: expected a list of ranks (integers >= 0) or null")
    return Request(request_id, op, mesh_id=mesh_id, ranks=tuple(ranks))


def reply(request_id: str, error: str | None = None) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "request_id": request_id,
        "status": "ok" if error is None else "error",
        "message": error or "",
    }


def hello(client: str, debugger: bool) -> dict[str, Any]:
    return {"protocol": PROTOCOL_VERSION, "type": "hello", "client": client, "debugger": debugger}


def snapshot(time: float, debugger: bool, meshes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "type": "snapshot",
        "time": time,
        "debugger": debugger,
        "meshes": meshes,
    }


def stacks(request_id: str, mesh_id: str, groups: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "type": "stacks",
        "request_id": request_id,
        "mesh_id": mesh_id,
        "groups": groups,
    }


def series(time: float, reset: bool, meshes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "type": "series",
        "time": time,
        "reset": reset,
        "meshes": meshes,
    }


def result(request_id: str, op: str, ok: bool, message: str) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "type": "result",
        "request_id": request_id,
        "op": op,
        "ok": ok,
        "message": message,
    }


def check_message(msg: Any) -> None:
    """Check a kernel -> panel message against the schema (the tests run every message and
    fixture through this); raises ``ValueError`` saying what is wrong."""
    _check(msg, _MESSAGES.get(msg.get("type") if isinstance(msg, dict) else None), "message")


# The schema, as (key -> expected) tables: a type, a tuple of types (None allowed as type(None)),
# a nested table, or a one-element list (a list of that).
_NONE = type(None)
_NUM = (int, float)
_RANK = {
    "rank": int,
    "label": str,
    "state": RANK_STATES,
    "since": (*_NUM, _NONE),
    "pid": (int, _NONE),
    "rss": (int, _NONE),
    "gpu_mem": (int, _NONE),
    "busy": ({"kind": ("cell", "endpoint"), "what": str, "line": (int, _NONE)}, _NONE),
    "paused": ({"file": str, "line": int, "function": str}, _NONE),
    "dead": ({"exitcode": (int, _NONE), "signal": (str, _NONE), "reason": str}, _NONE),
}
# The last recovery of a training run on the mesh (am.FaultTolerant), as it goes: ``ranks``
# lost (recover, shrink) or rejoining (grow); ``step``: the step being restored, then restored,
# then the first completed after it; ``extent``: the tensor mesh's sizes then.
_RECOVERY = {
    "phase": RECOVERY_PHASES,
    "kind": RECOVERY_KINDS,
    "ranks": [str],
    "step": int,
    "source": (str, _NONE),
    "extent": dict,
    "seconds": (*_NUM, _NONE),
    "time": _NUM,
    "error": (str, _NONE),
}
_MESH = {
    "mesh_id": str,
    "names": [str],
    "extent": dict,
    "actors": [str],
    "hosts": [{"host_rank": int, "hostname": str, "ranks": [_RANK]}],
    "recovery": (_RECOVERY, _NONE),
}
_OPT_NUM = (*_NUM, _NONE)
# Columns of one rank's new resource samples: equal lengths; GPU columns null without NVML.
_RESOURCES = {
    "rank": int,
    "time": [_NUM],
    "cpu": [_NUM],
    "rss": [int],
    "gpu_mem": ([(int, _NONE)], _NONE),
    "gpu_util": ([(int, _NONE)], _NONE),
}
# One metric's new points on one rank; a value is null where it was NaN or infinite.
_POINTS = {"rank": int, "step": [int], "value": [_OPT_NUM]}
_SERIES_MESH = {
    "mesh_id": str,
    "resources": [_RESOURCES],
    "metrics": [{"name": str, "ranks": [_POINTS]}],
}
_HEAD = {"protocol": (PROTOCOL_VERSION,)}
_MESSAGES: dict[Any, dict[str, Any]] = {
    "hello": {**_HEAD, "type": ("hello",), "client": str, "debugger": bool},
    "snapshot": {
        **_HEAD,
        "type": ("snapshot",),
        "time": _NUM,
        "debugger": bool,
        "meshes": [_MESH],
    },
    "series": {
        **_HEAD,
        "type": ("series",),
        "time": _NUM,
        "reset": bool,
        "meshes": [_SERIES_MESH],
    },
    "stacks": {
        **_HEAD,
        "type": ("stacks",),
        "request_id": str,
        "mesh_id": str,
        "groups": [{"ranks": [int], "labels": [str], "text": str}],
    },
    "result": {
        **_HEAD,
        "type": ("result",),
        "request_id": str,
        "op": OPS,
        "ok": bool,
        "message": str,
    },
}


def _check(value: Any, spec: Any, where: str) -> None:
    if spec is None:
        raise ValueError(f"{where}: unknown message type")
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object")
        missing = set(spec) - set(value)
        extra = set(value) - set(spec)
        if missing or extra:
            raise ValueError(f"{where}: missing {sorted(missing)}, unexpected {sorted(extra)}")
        for key, sub in spec.items():
            _check(value[key], sub, f"{where}.{key}")
    elif isinstance(spec, list):
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list")
        for i, item in enumerate(value):
            _check(item, spec[0], f"{where}[{i}]")
        if spec[0] is _RESOURCES or spec[0] is _POINTS:
            _check_columns(value, where)
    elif isinstance(spec, tuple):
        for option in spec:
            if isinstance(option, type):
                if isinstance(value, option) and not (
                    isinstance(value, bool) and option is not bool
                ):
                    return
            elif isinstance(option, (dict, list)):
                if isinstance(value, type(option)):
                    _check(value, option, where)
                    return
            elif value == option and type(value) is type(option):
                return
        raise ValueError(f"{where}: {value!r} is not one of {spec}")
    elif not isinstance(value, spec) or (isinstance(value, bool) and spec is not bool):
        raise ValueError(f"{where}: expected {spec.__name__}, got {value!r}")


def _check_columns(rows: list[dict[str, Any]], where: str) -> None:
    for i, row in enumerate(rows):
        lengths = {k: len(v) for k, v in row.items() if isinstance(v, list)}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{where}[{i}]: columns of different lengths {lengths}")
