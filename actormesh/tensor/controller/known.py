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
_CPU = torch.device("cpu")
_writes: dict[int, bool] = {}  # id(op) -> whether it may write an argument
_ruled: dict[int, bool] = {}  # id(op) -> whether DTensor has a sharding rule for it


def exact(t: torch.Tensor) -> bool:
    return not (t.dtype.is_floating_point or t.dtype.is_complex) and t.numel() <= LIMIT


def writes(func: Any) -> bool:
    """Whether ``func`` may write an argument (an in-place or ``out=`` op)."""
    known = _writes.get(id(func))
    if known is None:
        known = _writes[id(func)] = func._schema.is_mutable  # noqa: SLF001
    return known


def ruled(func: Any) -> bool:
    """Whether DTensor has a sharding rule for ``func``: an op without one (``as_strided``,
    ``unfold``, ``nonzero_static``...) may fail on the ranks where it runs here, and a value
    the ranks never made must not be answered from here."""
    found = _ruled.get(id(func))
    if found is None:
        from torch.distributed.tensor import DTensor

        p = DTensor._op_dispatcher.sharding_propagator  # noqa: SLF001
        found = _ruled[id(func)] = (
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


def keep(values: dict[int, Any], t: MeshTensor, value: torch.Tensor) -> None:
    """``t``'s value is ``value``: a copy no user code holds (nothing here writes it: a fold
    only reads it, and ``read`` answers with a copy)."""
    if len(values) >= KEPT:
        values.clear()
    values[t.value_id] = value


def fold(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], values: dict[int, Any], made: Any
) -> None:
    """Where every tensor argument of an op just recorded is known or a controller tensor, the
    op's value here, for its results when each is exact."""
    if torch.Tag.nondeterministic_seeded in func.tags:
        return  # drawn from the controller's seed on the ranks, not here
    if not ruled(func):
        return  # the ranks may refuse it: they answer
    found = [False]

    def value(a: Any) -> Any:
        t = type(a)
        if t is MeshTensor:
            found[0] = True
            return values[a.value_id]  # KeyError: not known
        if t is list or t is tuple:
            return t(value(e) for e in a)
        if t is torch.device:
            return _CPU
        return a

    try:
        local_args = tuple(value(a) for a in args)
        local_kwargs = {k: _CPU if k == "device" else value(v) for k, v in kwargs.items()}
    except KeyError:
        return
    if not found[0]:
        return
    results = made if type(made) is list or type(made) is tuple else (made,)
    if not all(type(r) is MeshTensor and exact(r) for r in results):
        return
    try:
        with no_mesh.activate():
            out = func(*local_args, **local_kwargs)
    except Exception:  # the ranks raise it, named with their rank, op and line
        return
    outs = out if type(out) is list or type(out) is tuple else (out,)
    if len(outs) != len(results):
        return
    for r, o in zip(results, outs, strict=True):
        if not isinstance(o, torch.Tensor) or o.shape != r.shape or o.dtype != r.dtype:
            return
    for r, o in zip(results, outs, strict=True):
        # A copy: the result may be a view of a controller tensor that its owner changes later.
        keep(values, r, o.clone())


def read(leaves: list[Any]) -> list[Any] | None:
    """The values of ``leaves`` (a fetch's) where each tensor among them is known; else None."""
    out = []
    for x in leaves:
        if type(x) is MeshTensor:
            if x.per_rank:
                return None
            v = x.mesh.stream.known.get(x.value_id)
            if v is None:
                return None
            out.append(v.clone())
        elif isinstance(x, torch.Tensor):
            return None  # fetch's own rules for a mix
        else:
            out.append(x)
    return out
