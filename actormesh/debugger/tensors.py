"""Tensor and module summaries: computed on the rank (small dicts travel), compared in the kernel.

``summarize`` runs on a rank, either inside a paused frame (through a DAP ``evaluate``) or in
the rank's ``%%mesh`` namespace. It never sends a tensor: only shape, dtype, device, norm,
min/max/mean and NaN/Inf counts, computed on at most ``cap`` elements (beyond that on the first
``cap`` elements, and the summary says so). :class:`Comparison` lays the ranks side by side
and flags the ranks that stand out: NaN or Inf anywhere, or (for a module, whose parameters
should agree across data-parallel ranks) parameter norms that differ from the majority.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections import Counter
from typing import Any

from ..runtime.meshes import value_cell

DEFAULT_CAP = 10_000_000  # elements summarized per tensor
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def check_name(name: str) -> str:
    """A dotted Python name (``x``, ``model.fc``): what ``inspect`` accepts (never code)."""
    if not _NAME.match(name):
        raise ValueError(f"expected a variable name such as x or model.fc, got {name!r}")
    return name


# -- on the rank -----------------------------------------------------------------------------------


def _number(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v


def _tensor(t: Any, cap: int) -> dict[str, Any]:
    import torch

    numel = int(t.numel())
    out: dict[str, Any] = {
        "kind": "tensor",
        "shape": list(t.shape),
        "dtype": str(t.dtype).replace("torch.", ""),
        "device": str(t.device),
        "requires_grad": bool(t.requires_grad),
        "numel": numel,
        "sampled": numel > cap,
    }
    with torch.no_grad():
        flat = t.detach().reshape(-1)[:cap]
        if flat.is_complex():
            flat = flat.abs()
        if not (flat.is_floating_point() or flat.dtype == torch.bool):
            flat = flat.to(torch.float64)
        elif flat.dtype == torch.bool:
            flat = flat.to(torch.float32)
        if flat.numel() == 0:
            out.update(norm=None, min=None, max=None, mean=None, nan=0, inf=0)
            return out
        f = flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat
        out["nan"] = int(torch.isnan(f).sum())
        out["inf"] = int(torch.isinf(f).sum())
        out["norm"] = _number(torch.linalg.vector_norm(f))
        out["min"] = _number(f.min())
        out["max"] = _number(f.max())
        out["mean"] = _number(f.mean())
    return out


def param_row(name: str, param: Any, grad: Any, cap: int = DEFAULT_CAP) -> dict[str, Any]:
    """One parameter of a module: its shape and norm, NaN/Inf counted over it and its gradient
    (``grad`` may be None), and the gradient's norm."""
    s = _tensor(param, cap)
    g = None if grad is None else _tensor(grad, cap)
    return {
        "name": name,
        "shape": s["shape"],
        "norm": s["norm"],
        "nan": s["nan"] + (g["nan"] if g else 0),
        "inf": s["inf"] + (g["inf"] if g else 0),
        "grad_norm": None if g is None else g["norm"],
    }


def summarize(value: Any, cap: int = DEFAULT_CAP) -> dict[str, Any]:
    """A JSON-able summary of a tensor, a module, or (for anything else) its type and repr."""
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        return _tensor(value, cap)
    if torch is not None and isinstance(value, torch.nn.Module):
        params = [param_row(name, p, p.grad, cap) for name, p in value.named_parameters()]
        return {"kind": "module", "type": type(value).__name__, "params": params}
    text = repr(value)
    return {"kind": "value", "type": type(value).__name__, "repr": text[:200]}


def summarize_json(value: Any, cap: int = DEFAULT_CAP) -> str:
    """``summarize`` as JSON text: what a DAP ``evaluate`` in a paused frame returns."""
    return json.dumps(summarize(value, cap))


def summarize_in(expression: str, namespace: dict[str, Any], cap: int) -> dict[str, Any]:
    """Summarize the dotted name ``expression`` looked up in ``namespace`` (no eval)."""
    head, *rest = check_name(expression).split(".")
    if head not in namespace:
        raise NameError(f"name {head!r} is not defined")
    value = namespace[head]
    for attr in rest:
        value = getattr(value, attr)
    return summarize(value, cap)


def _torch() -> Any:
    import sys

    return sys.modules.get("torch")


# -- in the kernel ---------------------------------------------------------------------------------

_HIGHLIGHT = " class='jp-actormesh-odd' style='background:#fdd'"
_TENSOR_ROWS = ("shape", "dtype", "device", "requires_grad", "norm", "min", "max", "mean", "nan",
                "inf")  # fmt: skip


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        return f"{v:.6g}"
    if isinstance(v, list):
        return "(" + ", ".join(str(x) for x in v) + ")"
    return "" if v is None else str(v)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)
    return bool(a == b)


class Comparison:
    """Per-rank summaries of one name, side by side. ``flagged``: ranks that stand out."""

    def __init__(self, name: str, summaries: dict[str, dict[str, Any] | str]) -> None:
        self.name = name
        self.summaries = summaries  # rank label -> summary, or the error text
        self.rows: list[tuple[str, dict[str, str]]] = []
        self.odd: set[tuple[str, str]] = set()  # (row, rank) cells that differ from most ranks
        self.flagged: list[str] = []
        self._build()

    def _build(self) -> None:
        ok = {r: s for r, s in self.summaries.items() if isinstance(s, dict)}
        kinds = {s["kind"] for s in ok.values()}
        flagged: set[str] = set()
        # (row, rank -> value, rank -> block): a block names the piece of a distributed value a
        # rank holds, and only ranks holding the same piece (replicas) must agree.
        fields: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
        if kinds == {"tensor"}:
            blocks = {r: s.get("block") for r, s in ok.items()}
            for row in _TENSOR_ROWS:
                fields.append((row, {r: s.get(row) for r, s in ok.items()}, blocks))
            flagged |= {r for r, s in ok.items() if s.get("nan") or s.get("inf")}
        elif kinds == {"module"}:
            names = [p["name"] for p in next(iter(ok.values()))["params"]]
            for pname in names:
                for what in ("norm", "grad_norm"):
                    values, blocks = {}, {}
                    for r, s in ok.items():
                        p = next((p for p in s["params"] if p["name"] == pname), None)
                        values[r] = None if p is None else p[what]
                        blocks[r] = None if p is None else p.get("block")
                        if p is not None and (p["nan"] or p["inf"]):
                            flagged.add(r)
                    fields.append((f"{pname} {what.replace('_', ' ')}", values, blocks))
        else:
            fields.append(("type", {r: s.get("type") for r, s in ok.items()}, {}))
            fields.append(("value", {r: s.get("repr") for r, s in ok.items()}, {}))
        for row, values, blocks in fields:
            pieces = any(b is not None for b in blocks.values())
            for group in _replica_groups(values, blocks):
                odd = _differing([values[r] for r in group], replicas=pieces)
                for r, differs in zip(group, odd, strict=True):
                    if differs:
                        self.odd.add((row, r))
                        if kinds == {"module"} or pieces:
                            flagged.add(r)  # replicas (data-parallel ones too) should agree
            self.rows.append((row, {r: _fmt(v) for r, v in values.items()}))
        errors = {r: s for r, s in self.summaries.items() if isinstance(s, str)}
        if errors:
            self.rows.append(("error", {r: errors.get(r, "") for r in self.summaries}))
        self.flagged = [r for r in self.summaries if r in flagged]

    def __repr__(self) -> str:
        ranks = list(self.summaries)
        header = [self.name, *(f"{r}{' (!)' if r in self.flagged else ''}" for r in ranks)]
        body = [[row, *(cells.get(r, "") for r in ranks)] for row, cells in self.rows]
        widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                 for line in [header, *body]]  # fmt: skip
        if self.flagged:
            lines.append(f"flagged: {', '.join(self.flagged)}")
        return "\n".join(lines)

    def _odd(self, row: str, rank: str, text: str) -> bool:
        return (row, rank) in self.odd or (row in ("nan", "inf") and text not in ("0", ""))

    def _repr_html_(self) -> str:
        ranks = list(self.summaries)
        head = "".join(
            f"<th class='{'jp-actormesh-flagged' if r in self.flagged else ''}'>"
            f"{html.escape(r)}</th>"
            for r in ranks
        )
        body = []
        for row, cells in self.rows:
            # Values shown rounded (0.3, not 0.30000000000000004), the exact text on hover.
            texts = [cells.get(r, "") for r in ranks]
            tds = "".join(
                value_cell(text, None, _HIGHLIGHT if self._odd(row, r, text) else "")
                for r, text in zip(ranks, texts, strict=True)
            )
            body.append(f"<tr><th>{html.escape(row)}</th>{tds}</tr>")
        return (
            f"<table class='jp-actormesh-dbg-inspect'><thead><tr><th>{html.escape(self.name)}"
            f"</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        )


class _NoneType:
    pass


_NONE = _NoneType()


def _replica_groups(values: dict[str, Any], blocks: dict[str, Any]) -> list[list[str]]:
    """The ranks grouped by the block they hold (one group when blocks are not known)."""
    if not any(b is not None for b in blocks.values()):
        return [list(values)]
    groups: dict[Any, list[str]] = {}
    for r in values:
        groups.setdefault(blocks.get(r), []).append(r)
    return list(groups.values())


def _differing(values: list[Any], replicas: bool) -> list[bool]:
    """Which values differ from the majority. With no majority among replicas (two of them
    that disagree), every one that is not shared is marked: one of them is wrong."""
    majority = _majority(values)
    if majority is not _NONE:
        return [not _same(v, majority) for v in values]
    if not replicas or len(values) < 2:
        return [False] * len(values)
    return [sum(_same(v, w) for w in values) == 1 for v in values]


def _majority(values: list[Any]) -> Any:
    """The value most ranks have (``_NONE`` if there is no strict majority to compare with)."""
    if len(values) < 2:
        return _NONE
    keys = [json.dumps(v, sort_keys=True, default=str) if not isinstance(v, float) or
            not math.isnan(v) else "nan" for v in values]  # fmt: skip
    key, count = Counter(keys).most_common(1)[0]
    if count * 2 <= len(values):
        return _NONE
    return values[keys.index(key)]
