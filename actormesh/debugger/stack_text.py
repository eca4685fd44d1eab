"""Stacks as text for the user: identical ones grouped, the debugger's own threads and frames
hidden, paused ranks saying so (pure text work, plus the debugger's record of who is paused)."""

from __future__ import annotations

from ..runtime.faults import without_busy_time
from ..runtime.mesh_shape import view_shape
from ..runtime.meshes import ValueMesh, new_value_mesh
from .session import get_debugger

_PYDEVD = "/debugpy/"


def grouped(texts: dict[int, str]) -> str:
    """Ranks with identical stacks together, the largest group first."""
    groups: dict[str, tuple[list[int], str]] = {}
    for r, text in texts.items():
        groups.setdefault(without_busy_time(text), ([], text))[0].append(r)
    parts = []
    for ranks, text in sorted(groups.values(), key=lambda g: -len(g[0])):
        head = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        parts.append(f"=== {head} ===\n{text}")
    return "\n".join(parts)


def annotate_stacks(stacks: ValueMesh[str], mesh_id: str) -> ValueMesh[str]:
    """``%mesh stacks``: paused ranks say so; the debugger's own threads and frames are hidden."""
    debugger = get_debugger()
    paused = debugger.paused_in(mesh_id)
    if not any(key[0] == mesh_id for key in list(debugger.ranks)):
        return stacks
    texts = []
    for r, text in enumerate(stacks.values()):
        text = without_debugger(text)
        rd = paused.get(r)
        if rd is not None:
            text = f"[{rd.describe()} in the debugger]\n{text}"
        texts.append(text)
    return new_value_mesh(view_shape(stacks), texts)


def without_debugger(text: str) -> str:
    """Drop pydevd's threads, and the pydevd frames under a suspended user frame."""
    blocks: list[list[str]] = []
    for line in text.splitlines(keepends=True):
        if not line.startswith(" ") or not blocks:
            blocks.append([line])
        else:
            blocks[-1].append(line)
    out = []
    for block in blocks:
        head, frames = block[0], block[1:]
        if head.startswith("thread ") and any(_PYDEVD in f for f in frames):
            continue  # one of pydevd's own threads
        cut = next((i for i, f in enumerate(frames) if _PYDEVD in f), len(frames))
        out.append(head + "".join(frames[:cut]))
    return "".join(out)
