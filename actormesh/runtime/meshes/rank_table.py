"""``ProcMesh.to_table()``: where each point of a mesh runs, as a text grid (pure, no I/O).

One row per point of every dimension but the last, one column per index of the last; a cell is
the process's rank in the mesh it was spawned as (a slice or a rename shows which processes of
the original it covers)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def rank_table(labels: Sequence[str], sizes: Sequence[int], ranks: Sequence[int]) -> str:
    """The grid of ``ranks`` (row-major over ``labels``/``sizes``) as aligned text."""
    if not labels:
        return f"(one process)\n{ranks[0]}"
    *outer, last = labels
    columns = [f"{last}={i}" for i in range(sizes[-1])]
    rows = []
    for index, point in enumerate(itertools.product(*(range(n) for n in sizes[:-1]))):
        start = index * sizes[-1]
        rows.append(([str(c) for c in point], [str(r) for r in ranks[start : start + sizes[-1]]]))
    left = [max([len(name)] + [len(r[0][k]) for r in rows]) for k, name in enumerate(outer)]
    width = max(len(c) for c in columns + [cell for r in rows for cell in r[1]])
    sep = " | " if outer else ""

    def line(heads: Sequence[str], cells: Sequence[str]) -> str:
        head = " ".join(h.rjust(w) for h, w in zip(heads, left, strict=True))
        return (head + sep + " ".join(c.rjust(width) for c in cells)).rstrip()

    return "\n".join([line(outer, columns), *(line(h, c) for h, c in rows)])
