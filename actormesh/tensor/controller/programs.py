"""A repeated step sent by reference (issue 43): what a stream sends in place of a run of ops
it sent before (``wire/programs.py`` says what a program is).

A batch is cut into *segments* at its edges and at the end of each optimizer step over
MeshTensors (``Stream.mark``, from ``optim.py``'s hook): a training step whose loss is read every
step is one batch and one segment; one read every ten steps is a few batches of whole steps
between partial ones. A segment of at least ``MIN_OPS`` ops that has the structure of one sent
before goes as one ``program`` op:

- the second time a structure is seen, the op carries that segment's ops, and each rank keeps
  their decoded steps under the program's index (one of ``KEPT``, the least recently run
  replaced);
- from then on, only the index, each op's ids and the values (the step's floats).

An op that holds a tensor (``constant``: a controller tensor uploaded, as a model's forward does
with the masks and positions it makes each step) or a user's object goes as it is, and cuts its
segment in two. Anything else goes as it is too: a run seen once (a cell run once, a step whose
batch the idle timer cut elsewhere). The ranks run exactly the ops that would have been sent: a
failed op names its rank, op and line as before.

The structure of a segment is cheap to find: an op of the recorder's fast path is keyed by the
identity of its plan's ``meta`` and of its site (each plan, per op, signatures and scalars,
makes its own ``meta``: a tuple, or ``ops.NoOutputs`` for an op with no outputs; and there is
one string per line: ``recording.py``, ``ops.issue_site``), which the kept segments hold alive
so that no other object takes their ids; any other op by its whole template.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import pairwise
from typing import Any

from ..wire.kinds import CHECK, check_op, seen
from ..wire.ops import Op
from ..wire.programs import NotReplayable, fast_values, rebuild, shape_op

MIN_OPS = 8  # a shorter segment costs less to send as it is than to key
KEPT = 16  # programs each rank keeps per mesh
SEEN_KEPT = 64  # structures seen once, remembered until this many


class Programs:
    """One stream's programs: the structures it saw once, and those the ranks keep."""

    def __init__(self) -> None:
        # key -> the segment it was seen in (which keeps its metas and sites alive)
        self.seen: dict[Any, list[Op]] = {}
        # key -> (index on the ranks, the segment that defined it), the least recently run first
        self.kept: OrderedDict[Any, tuple[int, list[Op]]] = OrderedDict()
        self.sent = 0  # program ops sent by reference (tests read it)

    def encode(self, ops: list[Op], marks: list[int]) -> list[Op]:
        """``ops`` as the batch to send: its segments that are programs as one op each."""
        if len(ops) < MIN_OPS:
            return ops
        cuts = [0, *[m for m in marks if 0 < m < len(ops)], len(ops)]
        out: list[Op] = []
        for a, b in pairwise(cuts):
            while a < b:
                key, ids, values, end = _structure(ops, a, b)
                run = ops[a:end]
                op = self._program(run, key, ids, values) if end - a >= MIN_OPS else None
                if op is None:
                    out.extend(run)
                else:
                    out.append(op)
                if end < b:  # an op no program holds (a constant uploaded): as it is
                    out.append(ops[end])
                a = end + 1
        return out

    def _program(
        self, segment: list[Op], key: Any, ids: tuple[int, ...], values: tuple[Any, ...]
    ) -> Op | None:
        kept = self.kept.get(key)
        if kept is not None:
            self.kept.move_to_end(key)
            self.sent += 1
            return self._op(kept[0], None, ids, values, segment, kept[1])
        if key not in self.seen:
            if len(self.seen) >= SEEN_KEPT:
                self.seen.pop(next(iter(self.seen)))
            self.seen[key] = segment
            return None
        del self.seen[key]
        if len(self.kept) >= KEPT:
            _, (index, _) = self.kept.popitem(last=False)  # its index now names this program
        else:
            index = len(self.kept)
        self.kept[key] = (index, segment)
        return self._op(index, tuple(segment), ids, values, segment, segment)

    def _op(
        self,
        index: int,
        definition: tuple[Op, ...] | None,
        ids: tuple[int, ...],
        values: tuple[Any, ...],
        ops: list[Op],
        defining: list[Op],
    ) -> Op:
        op: Op = ("program", (), (), (), (index, definition, ids, values), ops[0][5])
        if CHECK:  # the test suite: the ranks will run exactly the ops recorded
            check_op(op, "controller.programs")
            seen["program"] += 1
            template = [shape_op(o, []) for o in defining]
            rebuilt = rebuild(template, ids, values)
            if rebuilt != ops:
                raise AssertionError(f"a program does not rebuild its ops: {rebuilt!r:.600}")
        return op


def _structure(
    ops: list[Op], start: int, stop: int
) -> tuple[Any, tuple[int, ...], tuple[Any, ...], int]:
    """The key of ``ops[start:end]``, its ops' ids (out then ins, op after op) and its values,
    where ``end`` is the first op from ``start`` on that no program can hold (else ``stop``)."""
    key: list[Any] = []
    ids: list[int] = []
    values: list[Any] = []
    end = start
    while end < stop:
        op = ops[end]
        kind, out, ins, meta, payload, site = op
        if kind == "aten" and payload[4] is not None:  # the fast path's: one plan
            key.append((id(meta), id(site)))
            fast_values(op, values)
        else:
            mark = len(values)
            try:
                key.append(shape_op(op, values))
            except NotReplayable:
                del values[mark:]
                break
        ids.extend(out)
        ids.extend(ins)
        end += 1
    return tuple(key), tuple(ids), tuple(values), end
