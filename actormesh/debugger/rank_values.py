"""``%mesh dbg inspect NAME`` on the ranks: the summary of a variable on each rank, in the paused
frame of a paused rank (a DAP ``evaluate``), in the ``%%mesh`` namespace of a running one (its
``_mesh_debug`` actor), side by side (``tensors.Comparison``).
"""

from __future__ import annotations

import ast
import json
from typing import Any

from ..errors import MeshError
from .session import Debugger
from .tensors import DEFAULT_CAP, Comparison


def compare_on_ranks(
    debugger: Debugger, mesh_id: str, labels: dict[int, str], name: str, frame: int = 0
) -> Comparison:
    """Summaries of ``name`` on the ranks of ``labels`` (rank -> how it is shown), each as its
    rank can give it: a failure to read one is its entry's text. Blocks (at most a minute)."""
    paused = debugger.paused_in(mesh_id)
    summaries: dict[str, dict[str, Any] | str] = {}
    running = {
        r: debugger.agent(mesh_id, r).summarize.call_one(name, DEFAULT_CAP)
        for r in labels
        if r not in paused
    }
    for r, key in labels.items():
        try:
            if r in paused:
                expression = (
                    "__import__('actormesh.debugger.tensors', fromlist=['_'])"
                    f".summarize_json({name}, {DEFAULT_CAP})"
                )
                body = paused[r].evaluate(expression, frame=frame, context="clipboard")
                summaries[key] = _json_result(body.get("result", ""))
            else:
                summaries[key] = running[r].get(timeout=60)
        except (MeshError, ValueError) as exc:
            summaries[key] = str(exc).splitlines()[-1][:120]
    return Comparison(name, summaries)


def _json_result(text: str) -> dict[str, Any]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError) as exc:
        raise ValueError(text) from exc
    if not isinstance(value, str):
        raise ValueError(f"unexpected summary {text[:80]!r}")
    return dict(json.loads(value))
