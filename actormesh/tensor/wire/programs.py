"""A repeated run of ops as a *program*: its structure once, then only what changes (issue 43).

A training loop records the same ops every step: the same kinds, op names, shapes, arguments
and sites, with new ids (ids are never reused) and new floats (a learning rate, AdamW's bias
corrections, which change every step). A run of ops is therefore sent as

- its ops' *template*, once: each op with its ids left out (a ``Ref`` in its payload becomes
  the position of that id in the op's ``ins``), its floats (and a random op's seed) made
  ``VAR``, its lists and dicts hashable tuples (``shape_op``);
- then, for each run, every op's ``out`` and ``ins`` ids one after the other, and the values of
  its ``VAR``s in order.

``rebuild_op`` gives back exactly the op that would have been sent (the controller checks it,
with ``ACTORMESH_CHECK_PROTOCOL=1``, for every program it sends), so the ranks run the same ops
whether they come one by one or by reference. Pure: no MeshTensor, no I/O; both sides use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .ops import IN, Op, Ref

# The kinds a program may hold: their payloads are ids, scalars and placements, never a tensor
# or a user's object (``constant``, ``define``, ``module_build`` ... stay plain ops).
REPLAYABLE = frozenset(
    {"aten", "grad_sync", "relayout", "redistribute", "distribute", "reduce", "placements"}
)


class _Marker:
    """A template's placeholder, pickled by name (one object per kind, as ``IN``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.name


VAR = _Marker("VAR")  # a value of the run: the next of its ``values``
INS = _Marker("INS")  # an aten op's ``inputs`` field: its ``ins``
LIST = _Marker("LIST")  # (LIST, *elements): a list
DICT = _Marker("DICT")  # (DICT, (key, value), ...): a dict

_LITERALS = frozenset(
    {int, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout}
)


class NotReplayable(Exception):
    """An op whose payload holds what a template does not carry (a tensor, a function)."""


def shape_op(op: Op, values: list[Any]) -> tuple[Any, ...]:
    """``op``'s template (hashable; equal for ops that differ only in ids and floats); its
    floats are appended to ``values``. Raises ``NotReplayable``."""
    kind, out, ins, meta, payload, site = op
    if kind not in REPLAYABLE:
        raise NotReplayable(kind)
    if kind == "aten":
        name, args, kwargs, seed, inputs = payload
        p: Any = (name, _shape(args, ins, values), _shape(kwargs, ins, values))
        if seed is not None:
            values.append(seed)
        p = (*p, None if seed is None else VAR, None if inputs is None else INS)
    else:
        p = _shape(payload, ins, values)
    return (kind, len(out), len(ins), meta, p, site)


def fast_values(op: Op, values: list[Any]) -> None:
    """What ``shape_op`` appends to ``values`` for an op of the recorder's fast path (whose
    arguments are inputs, scalars and lists of either), without building its template."""
    _name, args, kwargs, seed, _inputs = op[4]
    for a in (*args, *kwargs.values()):
        t = type(a)
        if t is float:
            values.append(a)
        elif (t is list or t is tuple) and a and type(a[0]) is float:
            values.extend(a)  # a Scalar[] (recording._float_list: all floats)
    if seed is not None:
        values.append(seed)


def _shape(x: Any, ins: tuple[int, ...], values: list[Any]) -> Any:
    t = type(x)
    if t is float:
        values.append(x)
        return VAR
    if t in _LITERALS or x is IN:
        return x
    if t is Ref:
        if x.id not in ins:
            raise NotReplayable("a Ref to a value the op does not list as an input")
        return Ref(ins.index(x.id))  # the position of the id in the op's ins
    if t is tuple:
        return tuple([_shape(e, ins, values) for e in x])
    if t is list:
        return (LIST, *[_shape(e, ins, values) for e in x])
    if t is dict:
        return (DICT, *[(k, _shape(v, ins, values)) for k, v in x.items()])
    if t.__module__.startswith("torch.distributed.tensor"):  # a placement: hashable, plain
        return x
    raise NotReplayable(t.__name__)


def rebuild_op(step: Any, out: tuple[int, ...], ins: tuple[int, ...], vals: Any) -> Op:
    """The op of template ``step`` with these ids (``vals``: an iterator over the run's values,
    at this op's)."""
    kind, _n_out, _n_in, meta, p, site = step
    if kind == "aten":
        name, args, kwargs, seed, inputs = p
        args, kwargs = _filled(args, ins, vals), _filled(kwargs, ins, vals)
        payload = (name, args, kwargs, None if seed is None else next(vals),
                   None if inputs is None else ins)  # fmt: skip
    else:
        payload = _filled(p, ins, vals)
    return (kind, out, ins, meta, payload, site)


def rebuild(template: Sequence[Any], ids: Sequence[int], values: Sequence[Any]) -> list[Op]:
    """All the ops of a run (``ids``: each op's out then ins ids, one op after the other)."""
    vals = iter(values)
    ops: list[Op] = []
    at = 0
    for step in template:
        n_out, n_in = step[1], step[2]
        out = tuple(ids[at : at + n_out])
        ins = tuple(ids[at + n_out : at + n_out + n_in])
        at += n_out + n_in
        ops.append(rebuild_op(step, out, ins, vals))
    return ops


def _filled(x: Any, ins: tuple[int, ...], vals: Any) -> Any:
    if x is VAR:
        return next(vals)
    t = type(x)
    if t is Ref:
        return Ref(ins[x.id])
    if t is tuple:
        if x and x[0] is LIST:
            return [_filled(e, ins, vals) for e in x[1:]]
        if x and x[0] is DICT:
            return {k: _filled(v, ins, vals) for k, v in x[1:]}
        return tuple([_filled(e, ins, vals) for e in x])
    return x


def count_values(x: Any) -> int:
    """How many ``VAR``s a template's part holds."""
    if x is VAR:
        return 1
    if type(x) is tuple:
        return sum(count_values(e) for e in x)
    return 0
