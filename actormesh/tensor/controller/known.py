"""Values the controller knows without asking the ranks (issue 43): a model's integer inputs
and what integer ops make of them alone.

Hugging Face's models read such values in the middle of their forward: the mask code asks
whether the attention mask is all ones (``masking_utils.fast_all``: ``mask.sum() ==
mask.numel()`` in an ``if``). On a mesh each read was a sync point: the batch so far sent, a
round trip to every rank, and the step cut into more batches and programs. Yet the mask came
from the controller: a tensor passed to a meshed model (``inputs.py``) whose dtype is exact
(integers, bools), as it was sent, is *known*, and so is the result of an op whose tensor
arguments are all known or controller tensors, computed here as well as recorded: integer
arithmetic gives the same result in any order, so the ranks hold exactly this value. A sync
point that reads only known values (``item()``, ``bool()``, ``get()``) answers from them,
sending nothing; the ops still go to the ranks, in order, with the rest of the step.

Never stale:

- any op that may write a tensor (an in-place or ``out=`` op, a remote call, a gradient sync,
  ...) forgets every known value of its stream, since a view on the ranks may share a known
  value's memory; so does a MeshTensor handed to an actor or a ``%%mesh`` cell
  (``Stream.handed_out``), which gets the rank's value itself;
- a model's input is known again at its next call as it was sent, while neither it nor its
  MeshTensor changed (their version counters say so) and no user code ran on the ranks since;
- only ops DTensor has a sharding rule for are computed here (``as_strided``, say, has none:
  here it would answer what the ranks refuse), never a random op, and only exact dtypes of at
  most ``LIMIT`` elements (each op here is a real op on the controller's CPU);
- a failure here (an index out of range, say) makes nothing known: the ranks raise it, as
  before.

An op on known values is computed here only when a read needs one of its results, or one of a
later op's (``_Later``): of the 17 that GPT-2's mask code makes known a step, its two reads need
7, and computing each as it was recorded cost ~90 µs of the controller's step. It reads its
arguments as they were: a controller tensor among them is copied as the op is recorded (a write
through numpy moves no version counter), or, past ``LIMIT`` elements, the op is computed at
once.

A stream keeps at most ``KEPT`` known values (past that it forgets them all: a value collected on
the controller is not looked for here).
"""

from __future__ import annotations

from typing import Any

import torch

from .activate import no_mesh
from .tensor import MeshTensor

LIMIT = 1 << 16  # elements in one known value
KEPT = 1024  # known values a stream keeps
DEFERRED = 64  # ops on known values left to compute, in a chain, before one is computed now
_CPU = torch.device("cpu")
_writes: dict[int, bool] = {}  # id(op) -> whether it may write an argument
_foldable: dict[int, bool] = {}  # id(op) -> foldable(op)


def exact(t: torch.Tensor) -> bool:
    return not (t.dtype.is_floating_point or t.dtype.is_complex) and t.numel() <= LIMIT


def writes(func: Any) -> bool:
    """Whether ``func`` may write an argument (an in-place or ``out=`` op)."""
    known = _writes.get(id(func))
    if known is None:
        known = _writes[id(func)] = func._schema.is_mutable  # noqa: SLF001
    return known


def foldable(func: Any) -> bool:
    """Whether ``func``'s results may be known: not a random op (drawn from the controller's
    seed on the ranks, not here), and one DTensor has a sharding rule for: an op without one
    (``as_strided``, ``unfold``, ``nonzero_static``...) may fail on the ranks where it runs
    here, and a value the ranks never made must not be answered from here."""
    found = _foldable.get(id(func))
    if found is None:
        from torch.distributed.tensor import DTensor

        p = DTensor._op_dispatcher.sharding_propagator  # noqa: SLF001
        found = _foldable[id(func)] = torch.Tag.nondeterministic_seeded not in func.tags and (
            func in p.op_strategy_funcs
            or func in p.op_to_rules
            or func in getattr(p, "op_single_dim_strategy_funcs", {})
        )
    return found


def after(
    func: Any,
    args: Any,
    kwargs: dict[str, Any],
    ins: list[int] | tuple[int, ...],
    values: dict[int, Any],
    made: Any,
) -> None:
    """An op was recorded (``ins``: its MeshTensors' ids; ``values``: its stream's known values,
    by id; ``made``: the MeshTensors it returned): forget them all if it may write, else fold it
    where each of ``ins`` is known."""
    # (once per recorded op while any value is known, as through a model's whole step)
    if writes(func):
        values.clear()
        return
    for i in ins:
        if i not in values:
            return
    fold(func, args, kwargs, values, made)


class _Op:
    """An op on known values (and controller tensors) that nothing has read yet."""

    __slots__ = ("args", "depth", "func", "kwargs", "made", "results")
    depth: int  # ops not computed yet in its longest chain of arguments, itself included

    def __init__(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], made: Any, depth: int
    ):
        self.func, self.args, self.kwargs = func, args, kwargs
        self.made = tuple((tuple(r.shape), r.dtype) for r in made)  # what the ranks hold
        self.depth = depth
        self.results: tuple[torch.Tensor, ...] | None = None  # () when it is not known

    def computed(self) -> tuple[torch.Tensor, ...]:
        if self.results is None:
            self.results = self._compute()
            self.args = self.kwargs = None  # type: ignore[assignment]  # (what it held goes)
            self.depth = 0
        return self.results

    def _compute(self) -> tuple[torch.Tensor, ...]:
        try:
            args = _values(self.args)
            kwargs = {k: _values(v) for k, v in self.kwargs.items()}
        except (_Unknown, RecursionError):  # (a read deep in the user's own recursion: ask)
            return ()
        try:
            with no_mesh.activate():
                out = self.func(*args, **kwargs)
        except Exception:  # the ranks raise it, named with their rank, op and line
            return ()
        outs = out if type(out) is list or type(out) is tuple else (out,)
        if len(outs) != len(self.made):
            return ()
        for o, (shape, dtype) in zip(outs, self.made, strict=True):
            if not isinstance(o, torch.Tensor) or o.shape != shape or o.dtype != dtype:
                return ()
        # Copies: a result may be a view of a controller tensor that its owner changes later.
        return tuple(o.clone() for o in outs)


class _Later:
    """A known value not computed yet: result ``index`` of ``op``."""

    __slots__ = ("index", "op")

    def __init__(self, op: _Op, index: int) -> None:
        self.op, self.index = op, index

    def value(self) -> torch.Tensor | None:
        results = self.op.computed()
        return results[self.index] if results else None


class _Unknown(Exception):
    pass


def _values(x: Any) -> Any:
    """An op's argument with its known values computed; raises ``_Unknown``."""
    t = type(x)
    if t is _Later:
        v = x.value()
        if v is None:
            raise _Unknown
        return v
    if t is list or t is tuple:
        return t(_values(e) for e in x)
    return x


def keep(values: dict[int, Any], t: MeshTensor, value: torch.Tensor | _Later) -> None:
    """``t``'s value is ``value``: a copy no user code holds (nothing here writes it: a fold
    only reads it, and ``read`` answers with a copy), or one to compute when read."""
    if len(values) >= KEPT:
        values.clear()
    values[t.value_id] = value


def fold(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], values: dict[int, Any], made: Any
) -> None:
    """Where every tensor argument of an op just recorded is known or a controller tensor, its
    results are known when each is exact: computed here when a read needs them (``_Op``)."""
    if not foldable(func):
        return
    results = made if type(made) is list or type(made) is tuple else (made,)
    if not all(type(r) is MeshTensor and exact(r) for r in results):
        return
    found = [False]
    now = [False]  # a large controller tensor among the arguments: computed at once
    depth = [1]  # the op's, as _Op.depth

    def value(a: Any) -> Any:
        t = type(a)
        if t is MeshTensor:
            found[0] = True
            v = values[a.value_id]  # KeyError: not known
            if type(v) is _Later:
                depth[0] = max(depth[0], 1 + v.op.depth)
            return v
        if t is list or t is tuple:
            return t(value(e) for e in a)
        if t is torch.device:
            return _CPU
        if isinstance(a, torch.Tensor):
            if a.numel() > LIMIT:
                now[0] = True
                return a
            return a.detach().clone()  # as the ranks were sent it
        return a

    try:
        local_args = tuple(value(a) for a in args)
        local_kwargs = {k: _CPU if k == "device" else value(v) for k, v in kwargs.items()}
    except KeyError:
        return
    if not found[0]:
        return
    op = _Op(func, local_args, local_kwargs, results, depth[0])
    if (now[0] or op.depth > DEFERRED) and not op.computed():  # (a read never recurses deep)
        return
    for index, r in enumerate(results):
        keep(values, r, _Later(op, index))


def read(leaves: list[Any]) -> list[Any] | None:
    """The values of ``leaves`` (a fetch's) where each tensor among them is known; else None."""
    out = []
    for x in leaves:
        if type(x) is MeshTensor:
            if x.per_rank:
                return None
            v = x.mesh.stream.known.get(x.value_id)
            if type(v) is _Later:
                v = v.value()
            if v is None:
                return None
            out.append(v.clone())
        elif isinstance(x, torch.Tensor):
            return None  # fetch's own rules for a mix
        else:
            out.append(x)
    return out
