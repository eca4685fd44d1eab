"""The ranks' side of ``controller/programs.py``: a program's steps, decoded once and kept, then
run with each run's ids and values.

Each step is one op of the template (``wire/programs.py``). An aten op from the controller's
fast path (inputs and scalars as arguments) is run straight from the step, with its function,
its shard path's route (``shard_ops.route_for``: pointwise ops, an optimizer's foreach ops, a
linear layer's ops...) and the shape of its arguments worked out when the program came, and
DTensor running what the route does not take, as ``aten.run_aten`` does; everything else, and
every step while a value of this rank is poisoned (or its process group failed), is rebuilt as
the op it stands for and run by ``_TensorEngine._execute`` as if it had been sent. Either way
the results, failures and what the sidebar shows are those of the ops themselves.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from ..wire.ops import IN, Ref
from ..wire.programs import DICT, INS, LIST, VAR, count_values, rebuild_op, shape_op
from .aten import _IN_PLACE_VIEWS, on_dtensors, resolve_op, tensor_leaves
from .shard_ops import route_for

if TYPE_CHECKING:
    from .state import EngineState


class _Step:
    """One op of a program, with what running it needs worked out once."""

    __slots__ = (
        "args", "at", "direct", "func", "kwargs", "name", "nvars", "op", "route", "simple", "var0"
    )  # fmt: skip

    def __init__(self, op: Any, at: int, var0: int) -> None:
        self.op = op  # the template op
        self.at = at  # where its ids start in a run's ids (its outs, then its ins)
        self.var0 = var0  # where its values start in a run's values
        self.nvars = count_values(op[4])
        self.direct = False  # run from here (else rebuilt and run by the engine's _execute)
        self.route: Any = None
        self.func: Any = None
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.simple = False
        self.name: tuple[str] = ("",)
        kind, payload = op[0], op[4]
        if kind != "aten":
            return
        name, args, kwargs, seed, inputs = payload
        self.name = (name,)
        if inputs is not INS or seed is not None or name in _IN_PLACE_VIEWS:
            return  # the general path's, a random op's, an in-place view's: as sent
        if not all(_literal(v) for _, v in kwargs[1:]) or not all(_fillable(a) for a in args):
            return
        self.direct = True
        self.func = resolve_op(name)
        self.route = route_for(name, self.func)
        self.args = tuple(_runs(a) for a in args)
        self.kwargs = dict(kwargs[1:])
        self.simple = all(a is IN or _literal(a) for a in args)


def _literal(a: Any) -> bool:
    """A template's argument that is itself the value (no input, value, list or dict in it)."""
    if a is IN or a is VAR or a is LIST or a is DICT or type(a) is Ref:
        return False
    if type(a) is tuple:
        return all(_literal(e) for e in a)
    return True


def _fillable(a: Any) -> bool:
    """An argument ``_arg`` fills: IN, VAR, literals, and tuples or lists of those."""
    if a is IN or a is VAR or _literal(a):
        return True
    if type(a) is tuple:
        elements = a[1:] if a and a[0] is LIST else a
        return all(_fillable(e) for e in elements)
    return False


def compile_program(ops: Sequence[Any]) -> list[_Step]:
    steps = []
    at = var0 = 0
    for op in ops:
        step = _Step(shape_op(op, []), at, var0)
        at += len(op[1]) + len(op[2])
        var0 += step.nvars
        steps.append(step)
    return steps


def run_program(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    index, definition, ids, values = payload
    if definition is not None:
        engine.programs[index] = compile_program(definition)
        _settle_collector()
    steps = engine.programs.get(index)
    if steps is None:
        raise RuntimeError(
            f"program {index} is not known on rank {engine.rank_str}: the controller sent a run "
            "of it before its definition"
        )
    env = engine.env
    for step in steps:
        if not step.direct or engine.poison or engine.broken is not None:
            engine._execute(_op(step, ids, values))  # noqa: SLF001  (the engine's own path)
            continue
        at = step.at
        n_out = step.op[1]
        try:
            inputs = iter([env[i] for i in ids[at + n_out : at + n_out + step.op[2]]])
        except KeyError:
            engine._execute(_op(step, ids, values))  # noqa: SLF001  (raises, naming the value)
            continue
        if step.simple:
            args = tuple([next(inputs) if a is IN else a for a in step.args])
        else:
            vals = iter(values[step.var0 : step.var0 + step.nvars])
            args = tuple([_arg(a, inputs, vals) for a in step.args])
        outs = ids[at : at + n_out]
        engine.current = ("aten", outs, (), (), step.name, step.op[5])
        try:
            route = step.route
            result = None if route is None else route(step.func, args, step.kwargs)
            if result is None:  # not on the shards: DTensor runs it, as run_aten would
                leaves = on_dtensors(step.name[0], step.func, args, step.kwargs)
            else:
                leaves = tensor_leaves(result)
            if len(leaves) != n_out:
                raise RuntimeError(
                    f"{step.name[0]} gave {len(leaves)} results where the controller expected "
                    f"{n_out}; the controller's shape propagation and this rank disagree"
                )
        except Exception as exc:
            engine.failed(_op(step, ids, values), exc)
            continue
        for o, v in zip(outs, leaves, strict=True):
            env[o] = v
        if n_out > 1:
            for o in outs:
                engine.siblings[o] = outs
    return []


_settled = False


def _settle_collector() -> None:
    """The first program on this rank: what the first steps left alive (torch's lazily
    imported modules, DTensor's caches, the compiled steps) is exempt from the collector, as
    what a module's build loaded is (``module.py``): left to it, each full collection walked
    it all (T1: 23-26 ms every 100 to 300 steps, up to a tenth of a rank's CPU). Once, after
    a collection, so that no garbage of those steps is kept."""
    global _settled
    if not _settled:
        _settled = True
        gc.collect()
        gc.freeze()


def _op(step: _Step, ids: Sequence[int], values: Sequence[Any]) -> Any:
    """The op a step stands for in this run."""
    at, n_out, n_in = step.at, step.op[1], step.op[2]
    out = tuple(ids[at : at + n_out])
    ins = tuple(ids[at + n_out : at + n_out + n_in])
    return rebuild_op(step.op, out, ins, iter(values[step.var0 : step.var0 + step.nvars]))


class _Run:
    """A list argument of ``n`` inputs (a ``Tensor[]``: a foreach op's parameters) or ``n``
    values (a ``Scalar[]``), taken from the run's in one C-level slice each."""

    __slots__ = ("n", "of_inputs")

    def __init__(self, n: int, of_inputs: bool) -> None:
        self.n, self.of_inputs = n, of_inputs


def _runs(a: Any) -> Any:
    """A template argument with its lists of only inputs, or only values, as ``_Run``s."""
    if type(a) is tuple and len(a) > 1 and a[0] is LIST:
        body = a[1:]
        if all(e is IN for e in body):
            return _Run(len(body), True)
        if all(e is VAR for e in body):
            return _Run(len(body), False)
    return a


def _arg(a: Any, inputs: Any, vals: Any) -> Any:
    if a is IN:
        return next(inputs)
    if a is VAR:
        return next(vals)
    if type(a) is _Run:
        run = list(islice(inputs if a.of_inputs else vals, a.n))
        if len(run) != a.n:
            raise RuntimeError(
                f"a program's step takes a list of {a.n} {'inputs' if a.of_inputs else 'values'}"
                f" but its run has {len(run)} left; the controller and this rank disagree on "
                "the program (a bug)"
            )
        return run
    if type(a) is tuple:
        if a and a[0] is LIST:
            return [_arg(e, inputs, vals) for e in a[1:]]
        return tuple([_arg(e, inputs, vals) for e in a])
    return a
