"""Write RESULTS.md for one ``run.sh`` output directory.

usage: python3 report.py OUT_DIR > OUT_DIR/RESULTS.md

Reads ``<system>_run<k>.json`` (from the bench scripts), ``status.tsv``, ``command.txt``,
``git.txt`` and ``*.freeze.txt`` written by run.sh.  Standard library only.

Conventions (the same as shared/peers/RESULTS.md):
- a cell is the median over rounds of each round's median, p90 in parentheses for latencies,
  [min-max of the round medians] when there is more than one round;
- a ratio k is a cost ratio against a reference: for a time (µs, s) system / reference, for
  a rate (GB/s, msg/s) reference / system; so k > 1 always means "k times slower";
- a target's ratio is computed within each round (the machine is shared and noisy) and the
  verdict uses the median of those per-round ratios.
"""

from __future__ import annotations

import glob
import json
import os
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Run = dict[str, Any]
SYSTEMS = ["limits", "actormesh", "monarch", "ray", "ray_zc", "ipp"]
TITLE = {
    "limits": "floor (raw pyzmq / memcpy)",
    "actormesh": "actormesh",
    "monarch": "Monarch 0.7.0",
    "ray": "Ray 2.60.0",
    "ray_zc": "Ray 2.60.0 zero-copy torch",
    "ipp": "ipyparallel 9.2.0",
}
FIELD = {"us": "median_us", "s": "seconds", "GB/s": "median_GBps", "msg/s": "msgs_per_s"}
TIME_UNITS = ("us", "s")
X = "\u00d7"  # multiplication sign
ND = "\u2013"  # en dash, for ranges


# ---- loading ---------------------------------------------------------------------------------
def load(d: str) -> dict[str, dict[int, Run]]:
    runs: dict[str, dict[int, Run]] = {}
    for p in sorted(glob.glob(os.path.join(d, "*_run*.json"))):
        m = re.search(r"_run(\d+)\.json$", p)
        with open(p) as f:
            r = json.load(f)
        if "system" not in r:  # one of actormesh's separate scripts (EXTRAS)
            continue
        runs.setdefault(r["system"], {})[int(m.group(1)) if m else 0] = r
    return runs


RUNS: dict[str, dict[int, Run]] = {}
# actormesh's separate scripts, each with its floor inside: name -> round -> its JSON
EXTRAS: dict[str, dict[int, dict[str, Any]]] = {}
EXTRA_SCRIPTS = ("paired", "buffers", "allreduce", "kernel", "tensor")


def load_extras(d: str) -> dict[str, dict[int, dict[str, Any]]]:
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for name in EXTRA_SCRIPTS:
        for p in sorted(glob.glob(os.path.join(d, f"{name}_run*.json"))):
            m = re.search(r"_run(\d+)\.json$", p)
            with open(p) as f:
                out.setdefault(name, {})[int(m.group(1)) if m else 0] = json.load(f)
    return out


def extra_measure(
    name: str, form: Callable[[dict[str, Any]], tuple[float, str]]
) -> Callable[[int], tuple[float, str] | None]:
    def f(k: int) -> tuple[float, str] | None:
        r = EXTRAS.get(name, {}).get(k)
        try:
            return form(r) if r else None
        except (KeyError, TypeError, ZeroDivisionError):
            return None

    return f


def _kernel_ratio(suffix: str = "") -> Callable[[dict[str, Any]], tuple[float, str]]:
    """``%%mesh`` over ``%%px`` for one regime of bench_kernel.py ("", "_back_to_back", ...)."""

    def form(r: dict[str, Any]) -> tuple[float, str]:
        mesh = r["actormesh"][f"mesh_cell{suffix}"]["median_ms"]
        px = r["ipp"][f"px_cell{suffix}"]["median_ms"]
        return mesh / px, f"{mesh:.1f} / {px:.1f} ms"

    return form


def _paired_ratio(metric: str) -> Callable[[dict[str, Any]], tuple[float, str]]:
    """actormesh over raw pyzmq for one latency of bench_paired.py ("call_one", "call_all_8")."""

    def form(r: dict[str, Any]) -> tuple[float, str]:
        m = r[metric]
        got, floor = m["actormesh"]["median_us"], m["floor"]["median_us"]
        return got / floor, f"{got:,.0f} / {floor:,.0f} µs"

    return form


def _buffer_ratio(r: dict[str, Any]) -> tuple[float, str]:
    got = r["GBps"]
    return got["buffer"] / got["raw_ipc"], f"{got['buffer']:.2f} / {got['raw_ipc']:.2f} GB/s"


def _allreduce_ratio(r: dict[str, Any]) -> tuple[float, str]:
    a, t = r["actormesh"]["median_us"], r["torchrun"]["median_us"]
    return a / t, f"{a / 1000:.1f} / {t / 1000:.1f} ms"


def _tensor_ratio(case: str) -> Callable[[dict[str, Any]], tuple[float, str]]:
    """Controller-driven over its floor for one case of bench_tensor.py ("T1", "T1b", ...)."""

    def form(r: dict[str, Any]) -> tuple[float, str]:
        c = r[case]
        floor = c.get("spmd") or c["local"]
        got, ref = c["controller"]["median_us"], floor["median_us"]
        if got >= 1000:
            return c["ratio"], f"{got / 1000:,.1f} / {ref / 1000:,.1f} ms"
        return c["ratio"], f"{got:,.1f} / {ref:,.1f} µs"

    return form


def _tensor_messages(r: dict[str, Any]) -> tuple[float, str]:
    c = r["T4"]
    return float(c["max"]), f"{c['controller_messages']} sent by the controller"


def run_value(r: Run, key: str, field: str) -> float | None:
    """One run's value; ``key*`` means the median over keys with that prefix (ff repeats)."""
    m = r["metrics"]
    keys = [k for k in m if k == key or (key.endswith("*") and k.startswith(key[:-1]))]
    xs = []
    for k in keys:
        v: Any = m[k]
        for f in field.split("."):
            v = v.get(f) if isinstance(v, dict) else None
        if isinstance(v, (int, float)):
            xs.append(float(v))
    return statistics.median(xs) if xs else None


def per_round(system: str, key: str, field: str) -> dict[int, float]:
    out = {}
    for k, r in RUNS.get(system, {}).items():
        v = run_value(r, key, field)
        if v is not None:
            out[k] = v
    return out


def failure(system: str, key: str) -> str | None:
    """ "failed" or "not measured" when a run recorded an error for ``key``, else None."""
    stem = key.rstrip("*")
    for r in RUNS.get(system, {}).values():
        for e, msg in r.get("errors", {}).items():
            if e.startswith(stem):
                return "not measured" if msg.startswith("not measured") else "failed"
    return None


# ---- formatting ------------------------------------------------------------------------------
def fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "n/a"
    if unit == "us":
        return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"
    if unit == "s":
        return f"{x:.2f}" if x >= 0.1 else f"{x:.3f}"
    if unit == "GB/s":
        return f"{x:.3f}" if x < 1 else f"{x:.2f}"
    if unit == "msg/s":
        return f"{x:,.0f}"
    return f"{x:.3g}"


def cost_ratio(x: float, ref: float, unit: str) -> float:
    return x / ref if unit in TIME_UNITS else ref / x


def cell(system: str, key: str | None, unit: str, field: str | None = None) -> str:
    if key is None:
        return "—"
    field = field or FIELD[unit]
    v = list(per_round(system, key, field).values())
    if not v:
        if not RUNS.get(system):
            return "not run"
        return failure(system, key) or "n/a"
    s = fmt(statistics.median(v), unit)
    if unit == "us" and field == "median_us":
        p = list(per_round(system, key, "p90_us").values())
        if p:
            s += f" ({fmt(statistics.median(p), unit)})"
    if len(v) > 1:
        s += f" [{fmt(min(v), unit)}{ND}{fmt(max(v), unit)}]"
    return s


def median_of(system: str, key: str, unit: str) -> float | None:
    v = list(per_round(system, key, FIELD[unit]).values())
    return statistics.median(v) if v else None


def ratio_cell(system: str, key: str | None, ref_sys: str, ref_key: str | None, unit: str) -> str:
    if key is None or ref_key is None:
        return "—"
    a, b = median_of(system, key, unit), median_of(ref_sys, ref_key, unit)
    if a is None or b is None or a == 0 or b == 0:
        return "—"
    r = cost_ratio(a, b, unit)
    return f"{X}{r:.2f}" if r >= 0.1 else f"{X}{r:.2g}"


# ---- main table ------------------------------------------------------------------------------
@dataclass
class Row:
    label: str
    unit: str
    keys: dict[str, str]  # system -> metric key
    floor: str | None  # limits key used as the floor for this row


def rows() -> list[Row]:
    out = [
        Row(
            "runtime init (this_host / ray.init)",
            "s",
            {"actormesh": "init_s", "monarch": "init_s", "ray": "init_s"},
            None,
        )
    ]
    peers_same = ("actormesh", "monarch", "ray", "ipp")
    for n in (2, 4, 8):
        keys = {s: f"spawn_{n}" for s in peers_same} | {"limits": f"zmq_spawn_{n}"}
        out.append(
            Row(f"spawn {n} procs (import torch) until first reply", "s", keys, keys["limits"])
        )
    keys = {"actormesh": "spawn_cold_8", "monarch": "spawn_cold_8", "limits": "zmq_spawn_8"}
    out.append(Row("spawn 8, fresh controller process, this_host() included", "s", keys, None))
    keys = {s: "call_one" for s in peers_same} | {"limits": "zmq_tcp_rtt_pickle"}
    out.append(Row("call_one no-op round trip", "us", keys, keys["limits"]))
    for n in (2, 4, 8):
        keys = {s: f"call_all_{n}" for s in peers_same} | {"limits": f"zmq_tcp_call_all_{n}"}
        out.append(Row(f"call all {n} + gather", "us", keys, keys["limits"]))
    keys = {s: "ff_rep*" for s in peers_same} | {"limits": "zmq_tcp_ff_rep*"}
    out.append(Row("fire-and-forget to 1 actor (until confirmed)", "msg/s", keys, keys["limits"]))
    for sz in ("1MB", "64MB"):
        keys = {s: f"send_{sz}" for s in peers_same} | {"limits": f"zmq_tcp_send_{sz}"}
        out.append(Row(f"ctrl→actor {sz} (send + ack)", "GB/s", keys, keys["limits"]))
        keys = {s: f"fetch_{sz}" for s in peers_same} | {"limits": f"zmq_tcp_fetch_{sz}"}
        out.append(Row(f"actor→ctrl {sz} (fetch)", "GB/s", keys, keys["limits"]))
    for sz in ("64MB", "256MB"):
        keys = {s: f"a2a_msg_{sz}" for s in ("actormesh", "monarch", "ray")}
        keys |= {"ipp": f"a2a_relay_{sz}", "limits": f"zmq_tcp_send_{sz}"}
        out.append(Row(f"actor→actor {sz}: by message", "GB/s", keys, keys["limits"]))
        keys = {
            "actormesh": f"a2a_buffer_{sz}",
            "monarch": f"a2a_rdma_{sz}",
            "ray": f"a2a_putget_{sz}",
            "limits": f"shm_mp_{sz}",
        }
        out.append(
            Row(
                f"actor→actor {sz}: TensorBuffer / RDMABuffer / ray.put+get / shm",
                "GB/s",
                keys,
                f"zmq_tcp_send_{sz}",
            )
        )
    out.append(Row("stack dump of every rank, 8 ranks", "us", {"actormesh": "stacks_8"}, None))
    out.append(
        Row("SIGKILL of a worker → caller's error", "s", {"actormesh": "fault_detect_s"}, None)
    )
    return out


MAIN_SYSTEMS = ["limits", "actormesh", "monarch", "ray", "ipp"]
PEERS = ["monarch", "ray", "ipp"]


def main_table() -> str:
    hdr = ["metric", "unit"] + [TITLE[s] for s in MAIN_SYSTEMS]
    hdr += [f"actormesh {X}floor"] + [f"actormesh {X}{TITLE[p].split()[0]}" for p in PEERS]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for row in rows():
        cells = [row.label, row.unit.replace("us", "µs")]
        cells += [
            cell(s, row.keys.get(s), row.unit) if s in row.keys else "—" for s in MAIN_SYSTEMS
        ]
        am_key = row.keys.get("actormesh")
        cells.append(ratio_cell("actormesh", am_key, "limits", row.floor, row.unit))
        cells += [ratio_cell("actormesh", am_key, p, row.keys.get(p), row.unit) for p in PEERS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- targets (DESIGN.md §7) ------------------------------------------------------------------
@dataclass
class Target:
    what: str
    goal: str
    # round -> (ratio or absolute value, how it was formed); None when not measurable
    measure: Callable[[int], tuple[float, str] | None] | None
    ok: Callable[[float], bool] | None
    show: Callable[[float], str]
    why_not: str = ""


def value(system: str, key: str, unit: str, k: int, field: str | None = None) -> float | None:
    r = RUNS.get(system, {}).get(k)
    return run_value(r, key, field or FIELD[unit]) if r else None


def ratio_target(
    sys_a: str, key_a: str, sys_b: str, key_b: str, unit: str
) -> Callable[[int], tuple[float, str] | None]:
    def f(k: int) -> tuple[float, str] | None:
        a, b = value(sys_a, key_a, unit, k), value(sys_b, key_b, unit, k)
        if a is None or b is None or a == 0 or b == 0:
            return None
        return a / b, f"{fmt(a, unit)} / {fmt(b, unit)} {unit.replace('us', 'µs')}"

    return f


def a2a_best(k: int) -> tuple[float, str] | None:
    paths = {
        "TensorBuffer": value("actormesh", "a2a_buffer_256MB", "GB/s", k),
        "message": value("actormesh", "a2a_msg_256MB", "GB/s", k),
    }
    mem = value("limits", "memcpy_np_256MB", "GB/s", k)
    got = {n: v for n, v in paths.items() if v}
    if not got or not mem:
        return None
    name, best = max(got.items(), key=lambda kv: kv[1])
    return best / mem, f"{name} {fmt(best, 'GB/s')} / memcpy {fmt(mem, 'GB/s')} GB/s"


def absolute(system: str, key: str, unit: str) -> Callable[[int], tuple[float, str] | None]:
    def f(k: int) -> tuple[float, str] | None:
        v = value(system, key, unit, k)
        return None if v is None else (v, "")

    return f


def pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def times(x: float) -> str:
    return f"{x:.2f} {X}"


TARGETS = [
    Target(
        "`call_one` round trip, no-op endpoint",
        f"≤ 2 {X} raw pyzmq pickled call",
        ratio_target("actormesh", "call_one", "limits", "zmq_tcp_rtt_pickle", "us"),
        lambda r: r <= 2.0,
        times,
    ),
    Target(
        "  same, interleaved with the floor in one process (`bench_paired.py`)",
        f"≤ 2 {X} raw pyzmq pickled call",
        extra_measure("paired", _paired_ratio("call_one")),
        lambda r: r <= 2.0,
        times,
        "run with SYSTEMS including paired",
    ),
    Target(
        "`call` to 8 actors and gather",
        f"≤ 1.5 {X} raw pyzmq fan-out to 8",
        ratio_target("actormesh", "call_all_8", "limits", "zmq_tcp_call_all_8", "us"),
        lambda r: r <= 1.5,
        times,
    ),
    Target(
        "  same, interleaved with the floor in one process (`bench_paired.py`)",
        f"≤ 1.5 {X} raw pyzmq fan-out to 8",
        extra_measure("paired", _paired_ratio("call_all_8")),
        lambda r: r <= 1.5,
        times,
        "run with SYSTEMS including paired",
    ),
    Target(
        "fire-and-forget messages to one actor",
        "≥ 50 % of raw pyzmq's rate",
        ratio_target("actormesh", "ff_rep*", "limits", "zmq_tcp_ff_rep*", "msg/s"),
        lambda r: r >= 0.5,
        pct,
    ),
    Target(
        "64 MB tensor controller → actor",
        "≥ 80 % of raw pyzmq bandwidth",
        ratio_target("actormesh", "send_64MB", "limits", "zmq_tcp_send_64MB", "GB/s"),
        lambda r: r >= 0.8,
        pct,
    ),
    Target(
        "256 MB tensor actor → actor, one host (best path)",
        "≥ 50 % of memcpy into an existing buffer",
        a2a_best,
        lambda r: r >= 0.5,
        pct,
    ),
    Target(
        "spawn 8 procs that import torch, until first reply",
        "≤ 25 % of Monarch's time",
        ratio_target("actormesh", "spawn_8", "monarch", "spawn_8", "s"),
        lambda r: r <= 0.25,
        pct,
    ),
    Target(
        "  same, cold: a fresh controller process, `this_host()` included",
        "≤ 25 % of Monarch's time",
        ratio_target("actormesh", "spawn_cold_8", "monarch", "spawn_cold_8", "s"),
        lambda r: r <= 0.25,
        pct,
    ),
    Target(
        "SIGKILL of a worker → caller's error",
        "≤ 1 s",
        absolute("actormesh", "fault_detect_s", "s"),
        lambda r: r <= 1.0,
        lambda x: f"{x:.2f} s",
    ),
    *(
        Target(
            label,
            "≤ 25 % of ipyparallel `%%px` on 8 engines",
            extra_measure("kernel", _kernel_ratio(suffix)),
            lambda r: r <= 0.25,
            pct,
            "run with SYSTEMS including kernel",
        )
        for label, suffix in (
            ("`%%mesh` trivial cell on 8 ranks, end to end (`bench_kernel.py`)", ""),
            ("  same, cells back to back (ten in a row per kernel, as Run All)", "_back_to_back"),
            (
                "  same, each cell after 0.1 s idle (as a user runs cells one by one)",
                "_after_pause",
            ),
        )
    ),
    Target(
        "64 MB through `TensorBuffer`'s socket path (`bench_buffers.py`)",
        "≥ 80 % of raw pyzmq between the same two processes",
        extra_measure("buffers", _buffer_ratio),
        lambda r: r >= 0.80,
        pct,
        "run with SYSTEMS including buffers",
    ),
    Target(
        "gloo all-reduce of 64 MB across 4 actors (`bench_allreduce.py`)",
        "within 10 % of torchrun",
        extra_measure("allreduce", _allreduce_ratio),
        lambda r: r <= 1.10,
        lambda x: f"{x:.2f} {X}",
        "run with SYSTEMS including allreduce",
    ),
    *(
        Target(
            label,
            f"≤ {limit} {X} {floor}",
            extra_measure("tensor", _tensor_ratio(case)),
            lambda r, limit=limit: r <= limit,
            times,
            "run with SYSTEMS including tensor",
        )
        for label, case, limit, floor in (
            (
                "T1 training step of a 16-32-4 MLP on {dp: 2, tp: 2} from the controller "
                "(`bench_tensor.py`)",
                "T1",
                1.2,
                "the same step SPMD",
            ),
            ("  same, hidden width 1024 and batch 256", "T1b", 1.05, "the same step SPMD"),
            ("T2 recording one elementwise op (shape cache hit)", "T2", 6, "the local op"),
            ("T3 chain of 200 small DTensor ops, per op", "T3", 1.5, "the same chain SPMD"),
        )
    ),
    Target(
        "T4 messages per process for 500 tensor ops with no sync point",
        "≤ 3",
        extra_measure("tensor", _tensor_messages),
        lambda r: r <= 3,
        lambda x: f"{x:.0f}",
        "run with SYSTEMS including tensor",
    ),
    Target(
        "stack dump of every rank, 8 ranks",
        "≤ 100 ms",
        absolute("actormesh", "stacks_8", "us"),
        lambda r: r <= 100_000,
        lambda x: f"{x / 1000:.1f} ms",
    ),
    Target(
        "controller cost of a cast",
        "grows with hosts, not with actors",
        None,
        None,
        str,
        'needs several hosts: see the "Many hosts" section below (bench_multihost.py)',
    ),
]


def targets_table() -> str:
    every = [*RUNS.values(), *EXTRAS.values()]
    rounds = sorted(set().union(*[set(r) for r in every])) if every else []
    lines = [
        "| target | goal | measured (median of rounds) | per round | verdict |",
        "|---|---|---|---|---|",
    ]
    for t in TARGETS:
        if t.measure is None:
            lines.append(f"| {t.what} | {t.goal} | — | — | not measured: {t.why_not} |")
            continue
        got = [(k, m) for k in rounds if (m := t.measure(k)) is not None]
        if not got:
            lines.append(f"| {t.what} | {t.goal} | — | — | not measured (see errors) |")
            continue
        med = statistics.median(v for _, (v, _) in got)
        per = "; ".join(f"r{k}: {t.show(v)}" + (f" ({how})" if how else "") for k, (v, how) in got)
        verdict = "**met**" if t.ok and t.ok(med) else "**not met**"
        lines.append(f"| {t.what} | {t.goal} | {t.show(med)} | {per} | {verdict} |")
    return "\n".join(lines)


# ---- extra rows ------------------------------------------------------------------------------
EXTRA: list[tuple[str, str, str, str, str | None]] = [
    # system, key, unit, label, field (None: the unit's default)
    ("limits", "zmq_tcp_rtt_raw", "us", "pyzmq tcp RTT, raw 8 B echo", None),
    ("limits", "zmq_ipc_rtt_pickle", "us", "pyzmq ipc RTT, pickled call", None),
    ("limits", "zmq_ipc_ff_rep*", "msg/s", "pyzmq ipc fire-and-forget", None),
    ("limits", "zmq_ipc_send_64MB", "GB/s", "pyzmq ipc send 64 MB + ack", None),
    ("limits", "zmq_tcp_send_256MB", "GB/s", "pyzmq tcp send 256 MB + ack", None),
    ("limits", "popen_spawn_8", "s", f"bare Popen of 8 {X} `python -c 'import torch'`", None),
    ("limits", "pipe_rtt_bytes", "us", "multiprocessing.Pipe RTT, 8 B", None),
    ("limits", "pipe_rtt_obj", "us", "multiprocessing.Pipe RTT, pickled tuple", None),
    ("limits", "memcpy_np_256MB", "GB/s", "memcpy 256 MB numpy copyto (existing dst)", None),
    ("limits", "memcpy_np_fresh_256MB", "GB/s", "memcpy 256 MB numpy .copy() (fresh dst)", None),
    ("limits", "memcpy_torch_256MB", "GB/s", "memcpy 256 MB torch copy_ (existing dst)", None),
    ("limits", "shm_mp_256MB", "GB/s", "shared_memory create+write+handoff 256 MB", None),
    ("limits", "shm_mp_256MB", "us", "  ...handoff only, 256 MB", "handoff_only.median_us"),
    ("actormesh", "spawn_cold_8", "s", "cold spawn 8: `this_host()` returns", "init_s"),
    ("actormesh", "spawn_8", "s", "spawn 8: `spawn_procs` returns", "spawn_procs_s"),
    ("actormesh", "spawn_8", "s", "spawn 8: `spawn` returns", "spawn_s"),
    ("actormesh", "spawn_8", "s", "spawn 8: first `call` returns", "first_call_s"),
    (
        "actormesh",
        "ff_rep*",
        "msg/s",
        "broadcast enqueue rate (controller side)",
        "send_msgs_per_s",
    ),
    (
        "actormesh",
        "a2a_msg_256MB",
        "GB/s",
        "actor B awaits A.produce 256 MB, inside B",
        "inner.median_GBps",
    ),
    (
        "actormesh",
        "a2a_buffer_256MB",
        "GB/s",
        "TensorBuffer.read_into 256 MB, inside B",
        "inner.median_GBps",
    ),
    ("actormesh", "fault_next_call_s", "s", "next call to a killed actor → error", None),
    ("actormesh", "heal_one_s", "s", "heal one killed rank until its actor answers", None),
    ("actormesh", "stacks_busy_8", "us", "stack dump of 8 ranks all busy in an endpoint", None),
    ("monarch", "ff_rep*", "msg/s", "Monarch broadcast enqueue rate", "send_msgs_per_s"),
    (
        "monarch",
        "a2a_rdma_256MB",
        "GB/s",
        "Monarch RDMABuffer.read_into 256 MB, inside reader",
        "inner.median_GBps",
    ),
    ("ray", "a2a_putget_256MB_np", "GB/s", "Ray put in A / get in B 256 MB numpy", None),
    ("ray_zc", "send_64MB", "GB/s", "Ray zero-copy torch: ctrl→actor 64 MB", None),
    ("ray_zc", "fetch_64MB", "GB/s", "Ray zero-copy torch: actor→ctrl 64 MB", None),
    ("ray_zc", "a2a_msg_256MB", "GB/s", "Ray zero-copy torch: actor→actor 256 MB", None),
    ("ipp", "send_64MB_torch", "GB/s", "ipp apply(consume, torch 64 MB) (pickled)", None),
]


def extra_table() -> str:
    lines = ["| system | measurement | unit | median [range over rounds] |", "|---|---|---|---|"]
    for system, key, unit, label, field in EXTRA:
        lines.append(
            f"| {TITLE[system]} | {label} | {unit.replace('us', 'µs')} "
            f"| {cell(system, key, unit, field)} |"
        )
    return "\n".join(lines)


# ---- context ---------------------------------------------------------------------------------
def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def machine(out_dir: str) -> list[str]:
    ms = [r["machine"] for rs in RUNS.values() for r in rs.values()]
    if not ms:
        return ["- no results"]
    m0 = min(ms, key=lambda m: m.get("date", ""))
    loads = [float(m["loadavg"][0]) for m in ms if m.get("loadavg")]
    status = [line.split("\t") for line in read(os.path.join(out_dir, "status.tsv")).splitlines()]
    ends = [float(s[5].split()[0]) for s in status[1:] if len(s) > 5 and s[5] != "-"]
    loads += ends
    lines = [
        f"- **CPU**: {m0.get('cpu_model', '?')}, {m0.get('cpus', '?')} logical cores; "
        f"**memory** {m0.get('mem_total_kB', 0) / 2**20:.1f} GiB; {m0.get('platform', '?')}; "
        f"Python {m0.get('python', '?')}",
        f"- **Date**: {m0.get('date', '?')} (first benchmark start)",
    ]
    if loads:
        lines.append(
            f"- **1-minute load average** at the start/end of each benchmark: "
            f"{min(loads):.2f}{ND}{max(loads):.2f} (median {statistics.median(loads):.2f}); "
            "the machine is shared, so read ranges and within-round ratios"
        )
    return lines


def versions(out_dir: str) -> list[str]:
    out = []
    for s in SYSTEMS:
        rs = RUNS.get(s)
        if rs:
            v = next(iter(rs.values())).get("versions", {})
            out.append(f"- {TITLE[s]}: " + ", ".join(f"{k} {x}" for k, x in v.items()))
    git = read(os.path.join(out_dir, "git.txt")).replace("\n", "; ")
    if git:
        out.append(f"- actormesh source: commit {git}")
    freezes = sorted(glob.glob(os.path.join(out_dir, "*.freeze.txt")))
    if freezes:
        out.append(
            "- full `pip freeze` of each venv: "
            + ", ".join(f"`{os.path.basename(f)}`" for f in freezes)
            + " beside the JSON files of this run"
        )
    return out


def one_line(msg: str, limit: int = 400) -> str:
    msg = " ".join(msg.split())
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def errors() -> str:
    out = []
    for s, rs in RUNS.items():
        for k, r in sorted(rs.items()):
            for key, msg in r.get("errors", {}).items():
                out.append(f"- {s} round {k} `{key}`: {one_line(msg)}")
            for n in r.get("notes", []):
                out.append(f"- {s} round {k} note: {one_line(n)}")
    return "\n".join(out) or "- none"


def runs_list(out_dir: str) -> str:
    status = read(os.path.join(out_dir, "status.tsv")).splitlines()
    if len(status) <= 1:
        return "- (no status.tsv)"
    lines = ["| system | round | exit code | seconds | load at start | load at end |"]
    lines.append("|---|---|---|---|---|---|")
    for line in status[1:]:
        lines.append("| " + " | ".join(line.split("\t")) + " |")
    return "\n".join(lines)


def main() -> None:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    RUNS.update(load(out_dir))
    EXTRAS.update(load_extras(out_dir))
    quick = any(r["params"].get("quick") for rs in RUNS.values() for r in rs.values())
    n_rounds = max((len(rs) for rs in RUNS.values()), default=0)
    p: list[str] = ["# actormesh benchmark: floor, peers and actormesh side by side", ""]
    if quick:
        p += [
            f"> **Smoke run (QUICK=1)**: about 10{X} fewer iterations than the real comparison.",
            "> The figures only show that everything runs; do not quote them.",
            "",
        ]
    p += machine(out_dir)
    p += ["", "## Versions", "", *versions(out_dir)]
    p += ["", "## Command", "", "```bash", read(os.path.join(out_dir, "command.txt")), "```"]
    p += [
        "",
        f"Rounds: {n_rounds}; in each round the systems run one after another, never two at once.",
        "Raw JSON and logs: the directory of this file (`bench/out/<time>/` for "
        "`bench/RESULTS.md`).",
        "",
        "## Targets (DESIGN.md §7)",
        "",
        "Each ratio is formed within one round and the verdict uses their median. The rows "
        "marked interleaved time actormesh and its floor in one process, alternating in short "
        "blocks, so that both see the same machine.",
        "",
        targets_table(),
        "",
        "## Medians",
        "",
        "Cell: median of the round medians (p90) [range of round medians]. "
        f"{X}k: cost relative to the reference (time ratio, or inverse rate ratio), "
        f"so {X}k > 1 means actormesh is k times slower and {X}k < 1 that it is faster. "
        "Floor per row: pickled-call RTT, pickled fan-out, pickled one-way messages, zero-copy "
        "frames + ack over tcp, tcp send for actor→actor (shared-memory handoff shown in its "
        "cell), Popen + import torch + zmq hello for spawn.",
        "",
        main_table(),
        "",
        "## Floor details and extra variants",
        "",
        extra_table(),
        "",
        "## Errors and notes",
        "",
        errors(),
        "",
        "## Runs",
        "",
        runs_list(out_dir),
    ]
    # What run.sh does not measure (fake hosts, a debugger session, GPUs, separate benchmarks
    # and the before/after passes of their issues) is kept by hand in RESULTS-<topic>.md files
    # beside this report, so that a full run's copy to RESULTS.md keeps it.
    for extra in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "RESULTS-*.md"))):
        p += ["", read(extra).rstrip()]
    print("\n".join(p))


if __name__ == "__main__":
    main()
