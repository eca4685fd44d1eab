"""A program's step run on the local tensors alone, once its first run has shown how (issue 43).

Many shard routes (``shard_ops.py``) compute an op as the op itself on the local tensors of its
DTensor arguments, and give the result a spec that depends only on the arguments' specs and the
op's fixed arguments: pointwise and ``_foreach_`` ops, ``t``, ``mm``, ``addmm``, ``sum`` over
dims, ``detach``, and the ops of a batch split by rows. Such a route says so
(``computes_on_locals``). A program runs the same step with the same kinds of values every
time, so after a step's first run by such a route it keeps (``lower``) the specs its inputs
had and, for each result, the spec the route gave it (or the input it wrote in place). On a
later run whose inputs have the same specs (by identity: the engine reuses specs) and local
strides (any other, or a value that is not a DTensor, runs the route again), the op runs on the
local tensors: no route, no spec work and no checks per argument. A view's route calls the view
with the local sizes (``views_locally``): those the first run's local result had, since the same
spec gives this rank the same local shape. Its results stay local tensors, each with its kept
spec, while only lowered steps read them; one becomes a DTensor in the engine's values when
another step reads it or when it outlives the program (it is not among the ids the batch
drops). A result laid out unlike the first run's (strides) runs the route instead, as a route
declines such a result.

A route whose result is not the op on the locals (a loss over the local blocks: another
reduction, a division by the global count, a replicated target's block) may still say how
its later runs compute it (``computes_locally_as``): a function of the same arguments on the
local tensors, made from its first run's arguments. A lowered step may also read a controller
tensor (a plain tensor): one its route took lifted to a Replicate DTensor, whose local tensor
it is, or as it is (a loss's target); a later run takes the controller tensor of its own run
as it is, where it has the first one's shape, dtype, device and strides (``PlainLayout``).
"""

from __future__ import annotations

from typing import Any

from .dtensors import dtensor_class, wrap


def computes_on_locals(route: Any) -> Any:
    """Mark ``route`` as computing ``func(*args, **kwargs)`` with each DTensor argument (in a
    list too) replaced by its local tensor, whether it takes the op and its results' specs
    decided by the arguments' specs and local strides, the op's arguments that are not floats,
    and its local results' strides."""
    route.on_locals = True
    route.local_args = None
    return route


NOT_TAKEN: Any = object()  # a local form's answer where its route did not take the op


def computes_locally_as(local_form: Any) -> Any:
    """Mark a route as computing its later runs by ``local_form(func, args, kwargs, result)``:
    given a first run's arguments (DTensors, plain tensors, literals) and the result the step
    got, the function that computes the local result from the inputs' local tensors and the
    op's other arguments; None where the route took the op but its later runs cannot skip it;
    ``NOT_TAKEN`` where the route did not take these arguments (another did: ``shard_ops.
    _either``). What it computes must be what the route computes for arguments of those
    specs, strides and literals."""

    def mark(route: Any) -> Any:
        route.on_locals = True
        route.local_args = None
        route.local_form = local_form
        return route

    return mark


def first_else(form: Any, then_on_locals: bool) -> Any:
    """The local form of a route that tries a route of ``form`` first, then another: ``form``'s
    answer where the first took the op; where the other did, the op itself on the local
    tensors if the other computes so (``then_on_locals``), else None (not lowered)."""

    def local_form(func: Any, args: Any, kwargs: Any, result: Any) -> Any:
        found = form(func, args, kwargs, result)
        if found is not NOT_TAKEN:
            return found
        return func._op if then_on_locals else None  # noqa: SLF001

    return local_form


def views_locally(route: Any) -> Any:
    """Mark ``route`` (of ``view`` or ``_unsafe_view``) as computing ``func(local, sizes)`` on
    its input's local tensor, where ``sizes`` is the local result's shape; whether it takes the
    op and its result's spec decided as for ``computes_on_locals``."""
    route.on_locals = True
    route.local_args = _view_sizes
    return route


def takes_view_sizes(route: Any) -> bool:
    """Whether ``route`` is lowered as ``views_locally`` says."""
    return getattr(route, "local_args", None) is _view_sizes


def _view_sizes(local_result: Any) -> tuple[tuple[int, Any], ...]:
    return ((1, list(local_result.shape)),)


class PlainLayout:
    """What a plain tensor input of a lowered step was on its first run, in place of a spec:
    one object per layout (``of``), as specs are, so that a chunk's steps that read the same
    tensor agree on it."""

    __slots__ = ("device", "dtype", "kind", "shape")
    _known: dict[tuple[Any, ...], PlainLayout] = {}

    def __init__(self, kind: Any, shape: Any, dtype: Any, device: Any) -> None:
        self.kind, self.shape, self.dtype, self.device = kind, shape, dtype, device

    @classmethod
    def of(cls, x: Any) -> PlainLayout:
        key = (type(x), x.shape, x.dtype, x.device)
        found = cls._known.get(key)
        if found is None:
            if len(cls._known) > 4096:
                cls._known.clear()
            found = cls._known[key] = cls(*key)
        return found

    def fits(self, x: Any) -> bool:
        return (
            type(x) is self.kind
            and x.shape == self.shape
            and x.dtype == self.dtype
            and x.device == self.device
        )


class Lowered:
    """How a step ran on its first run, for the runs after it."""

    __slots__ = ("fixed", "local_op", "outs", "specs", "strides")

    def __init__(
        self,
        local_op: Any,
        specs: tuple[Any, ...],
        strides: tuple[Any, ...],
        outs: tuple[Any, ...],
        fixed: tuple[tuple[int, Any], ...] = (),
    ):
        self.local_op = local_op  # what runs on the locals: the op's own ``_op``, or a route's
        # the input DTensors' specs (a plain tensor's PlainLayout), in the order of the step's ins
        self.specs = specs
        self.strides = strides  # and their local tensors' strides
        # (position, value): the op's arguments that differ on the local tensors (a view's sizes)
        self.fixed = fixed
        # per result in pytree order: an int (the input it wrote in place), None (no tensor at
        # that place), or (spec, local strides)
        self.outs = outs

    def locals_of(self, in_ids: Any, env: dict[int, Any], held: dict[int, Any]) -> Any:
        """The inputs' local tensors, or None when one is not laid out as on the first run."""
        return locals_at(zip(in_ids, self.specs, self.strides, strict=True), env, held)

    def keep(
        self, out: Any, locals_: list[Any], in_ids: Any, out_ids: Any, env: Any, held: Any
    ) -> bool:
        """Keep the op's results under ``out_ids``: a new one in ``held`` (local, spec), one
        written in place as its input. False, keeping nothing, when torch laid a result out
        unlike on the first run (the route then decides)."""
        outs = self.outs
        if out is None:  # an in-place _foreach_ op (it ran: never run by the route again)
            if outs:
                raise RuntimeError("an op that gave results on its first run gave none")
            return True
        parts = (out,) if type(out) is not list and type(out) is not tuple else out
        if len(parts) != len(outs):
            return False
        for o, kept in zip(parts, outs, strict=True):
            if kept is None:
                if o is not None:
                    return False
            elif type(kept) is int:
                if o is not locals_[kept]:
                    raise RuntimeError("an in-place op on local tensors returned another tensor")
            elif o is None or o.stride() != kept[1]:
                return False
        ids = iter(out_ids)
        for o, kept in zip(parts, outs, strict=True):
            if kept is None:
                continue
            i = next(ids)
            if type(kept) is int:  # the input, written: under the output's id too
                source = in_ids[kept]
                if source in held:
                    held[i] = held[source]
                else:
                    env[i] = env[source]
            else:
                held[i] = (o, kept[0])
        return True


def locals_at(entries: Any, env: dict[int, Any], held: dict[int, Any]) -> Any:
    """The local tensors of the values ``entries`` names, each as (id, spec, local strides),
    or None when one has another spec or (a DTensor of the engine's values) other strides.
    One made by an earlier lowered step of this run is in ``held`` (local, spec): its strides
    were checked when it was made."""
    dtensor = dtensor_class()
    out = []
    for i, spec, stride in entries:
        made = held.get(i)
        if made is not None:
            if made[1] is not spec:
                return None
            out.append(made[0])
            continue
        x: Any = env.get(i)
        if type(x) is dtensor and x._spec is spec:  # noqa: SLF001
            local = x._local_tensor  # noqa: SLF001
        elif type(spec) is PlainLayout and spec.fits(x):
            local = x
        else:
            return None
        if local.stride() != stride:
            return None
        out.append(local)
    return out


def release(ids: Any, env: dict[int, Any], held: dict[int, Any]) -> None:
    """The values of ``ids`` that lowered steps made, as DTensors in ``env`` (for a step that
    is not lowered, a failure's bookkeeping, or what outlives the program)."""
    for i in ids:
        made = held.pop(i, None)
        if made is not None:
            env[i] = wrap(*made)


def lower(
    func: Any, route: Any, inputs: list[Any], taken: list[Any], call_args: Any, result: Any
) -> Lowered | None:
    """What a step's first run of ``func`` by ``route`` shows about the next ones, or None when
    they cannot skip the route (a route that does not compute on the locals, or not for these
    inputs, as its ``lowers_if`` or its local form says; a result that is not a DTensor).

    ``inputs``: the step's inputs as the engine holds them; ``taken``: as the route took them,
    where a controller tensor (a plain tensor) was lifted to a Replicate DTensor whose local
    tensor is the controller tensor itself (``aten.lift_inputs``), or taken as it is by a
    route with a local form of its own; ``call_args``: the route's arguments and keywords.
    A later run takes such an input as it is (``PlainLayout``)."""
    if not getattr(route, "on_locals", False) or not inputs or result is None:
        return None  # (None: no route took the op)
    dtensor = dtensor_class()
    local_form = getattr(route, "local_form", None)
    plain = _controller_tensors(inputs, taken, local_form is not None)
    if plain is None:
        return None
    lowers_if = getattr(route, "lowers_if", None)
    if lowers_if is not None and not lowers_if(taken):
        return None  # the route took the op another way for such inputs
    local_op = func._op if local_form is None else local_form(func, *call_args, result)  # noqa: SLF001
    if local_op is None or local_op is NOT_TAKEN:
        return None
    specs = tuple(x._spec if type(x) is dtensor else PlainLayout.of(x) for x in inputs)  # noqa: SLF001
    strides = tuple((x._local_tensor if type(x) is dtensor else x).stride() for x in inputs)  # noqa: SLF001
    if type(result) is list and not result:
        outs: tuple[Any, ...] = ()
    else:
        parts = result if type(result) is list or type(result) is tuple else (result,)
        kept: list[Any] = []
        for r in parts:
            if r is None:
                kept.append(None)
            elif type(r) is not dtensor:
                return None
            else:
                alias = next((k for k, x in enumerate(taken) if x is r), None)
                if alias in plain:
                    return None  # written into a controller tensor: the route keeps its DTensor
                if alias is not None:
                    kept.append(alias)
                else:
                    kept.append((r._spec, r._local_tensor.stride()))  # noqa: SLF001
        if any(type(k) is int for k in kept) and any(type(k) is tuple for k in kept):
            return None  # a later run that had to decline a result would write twice
        outs = tuple(kept)
    local_args = getattr(route, "local_args", None)
    if local_args is None:
        return Lowered(local_op, specs, strides, outs)
    if len(outs) != 1 or type(outs[0]) is not tuple:
        return None  # a view's route gives one new tensor
    return Lowered(local_op, specs, strides, outs, local_args(result._local_tensor))  # noqa: SLF001


def _controller_tensors(inputs: list[Any], taken: list[Any], as_they_are: bool) -> Any:
    """The positions of the controller tensors among ``inputs``, or None when one cannot be
    taken as it is in a later run: not a plain tensor, or the route took another tensor for
    it (lifted to another device), or took it as it is without a local form of its own."""
    import torch

    dtensor = dtensor_class()
    plain = []
    for k, (x, t) in enumerate(zip(inputs, taken, strict=True)):
        if type(x) is dtensor:
            continue
        if type(x) is not torch.Tensor:
            return None
        lifted = type(t) is dtensor and t._local_tensor is x  # noqa: SLF001  (not moved)
        if not lifted and (t is not x or not as_they_are):
            return None
        plain.append(k)
    return plain
