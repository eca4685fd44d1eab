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

After its first run, a direct step whose route computes the op on the local tensors runs on
them alone while its inputs are laid out as then (``lowered.py``); what such steps make stays
a local tensor until a step that is not lowered reads it or the program ends (then it becomes a
DTensor, unless the batch drops it). Consecutive lowered steps run as one generated function
(``chunks.py``), made after a run and checked once a run, at their first step.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..wire.ops import IN, Ref
from ..wire.programs import INS, count_values, rebuild_op, shape_op
from . import chunks
from .aten import _IN_PLACE_VIEWS, lift_inputs, on_dtensors, resolve_op, tensor_leaves
from .lowered import Lowered, lower, release
from .shard_ops import TAKES_CONSTANTS, route_for
from .step_args import fill, fillable, literal, runs

if TYPE_CHECKING:
    from .state import EngineState


class _Step:
    """One op of a program, with what running it needs worked out once."""

    __slots__ = (
        "args", "at", "direct", "filled_kwargs", "func", "general", "kwargs", "lifts",
        "lowerable", "lowered", "name", "nvars", "op", "order", "route", "simple", "var0",
    )  # fmt: skip

    def __init__(self, op: Any, at: int, var0: int) -> None:
        self.op = op  # the template op
        self.at = at  # where its ids start in a run's ids (its outs, then its ins)
        self.var0 = var0  # where its values start in a run's values
        self.nvars = count_values(op[4])
        self.direct = False  # run from here (else rebuilt and run by the engine's _execute)
        self.general = False  # the general path's op, run from here by its route alone
        self.lifts = False  # its controller tensors are lifted (Replicate DTensors) for its route
        self.order: tuple[int, ...] | None = None  # its inputs by its arguments' order, if not ins'
        self.filled_kwargs: tuple[tuple[str, Any], ...] | None = None  # keywords filled per run
        self.route: Any = None
        self.func: Any = None
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.simple = False
        self.lowerable = False  # its route may let later runs skip it (lowered.py)
        self.lowered: Lowered | None = None
        self.name: tuple[str] = ("",)
        kind, payload = op[0], op[4]
        if kind != "aten":
            return
        name, args, kwargs, seed, inputs = payload
        self.name = (name,)
        if seed is not None or name in _IN_PLACE_VIEWS:
            return  # a random op's, an in-place view's: as sent
        if inputs is not INS:
            # The general path's (controller tensors among its inputs): direct, its inputs
            # taken as the fast path's IN in the order its arguments name them; a loss takes
            # its target's block as it is, another op takes them as Replicate DTensors; a later
            # run of a lowered one takes them as they are (lowered.py).
            # (the keywords' inputs come after the arguments')
            found = _refs_as_inputs((*args, kwargs), op[2])
            if found is None:
                return
            (*args, kwargs), order = found
            self.general = True
            self.lifts = name not in TAKES_CONSTANTS
            self.order = None if order == tuple(range(op[2])) else order
        if not all(fillable(v) for _, v in kwargs[1:]) or not all(fillable(a) for a in args):
            return
        self.direct = True
        self.func = resolve_op(name)
        self.route = route_for(name, self.func)
        self.args = tuple(runs(a) for a in args)
        if all(literal(v) for _, v in kwargs[1:]):
            self.kwargs = dict(kwargs[1:])
            # (a lowered step and a chunk take the inputs in the order of the step's ins, and
            # put them in its arguments' order: ``order``)
            self.lowerable = bool(getattr(self.route, "on_locals", False))
        else:  # (inputs or floats among the keywords, attention's mask and scale: not lowered)
            self.filled_kwargs = tuple(kwargs[1:])
        self.simple = all(a is IN or literal(a) for a in args)

    def shown(self, ids: Sequence[int]) -> Any:
        """What a status poll shows while this step runs (``engine.current``)."""
        return ("aten", ids[self.at : self.at + self.op[1]], (), (), self.name, self.op[5])

    def as_sent(self, ids: Sequence[int], values: Sequence[Any]) -> Any:
        """The op this step stands for in this run."""
        at, n_out, n_in = self.at, self.op[1], self.op[2]
        out = tuple(ids[at : at + n_out])
        ins = tuple(ids[at + n_out : at + n_out + n_in])
        return rebuild_op(self.op, out, ins, iter(values[self.var0 : self.var0 + self.nvars]))


def _refs_as_inputs(
    args: tuple[Any, ...], n_in: int
) -> tuple[tuple[Any, ...], tuple[int, ...]] | None:
    """A general path's arguments (its keywords' template last) with their ``Ref``s as
    ``IN``, and the inputs they name in that order (one may be named twice: attention's key
    and value); None for a ``Ref`` that is not one of the op's ``n_in`` inputs."""
    seen: list[int] = []

    def swap(a: Any) -> Any:
        if type(a) is Ref:
            seen.append(a.id)
            return IN
        if type(a) is tuple:
            return tuple([swap(e) for e in a])
        return a

    swapped = tuple([swap(a) for a in args])
    return (swapped, tuple(seen)) if all(0 <= i < n_in for i in seen) else None


MAX_BUILDS = 4  # chunks made per program, at most: a program rewired each run stays unchunked


class Program:
    """A program's steps, and its chunks once its steps are lowered (``chunks.py``)."""

    __slots__ = ("builds", "chunks", "steps")

    def __init__(self, ops: Sequence[Any]) -> None:
        self.steps: list[_Step] = []
        at = var0 = 0
        for op in ops:
            step = _Step(shape_op(op, []), at, var0)
            at += len(op[1]) + len(op[2])
            var0 += step.nvars
            self.steps.append(step)
        self.chunks: dict[int, chunks.Chunk] | None = None  # by their first step
        self.builds = 0  # chunks made so far: a run wired otherwise makes them again

    def after_run(self, ids: Any, rewired: bool) -> None:
        """Make the chunks from this run (its ids give their wiring): after the program's first
        run, a run that lowered a step, and one wired or laid out unlike the run the chunks
        were made from. A program that keeps changing its wiring stops being chunked."""
        if self.builds < MAX_BUILDS:
            self.chunks = chunks.build(self.steps, ids)
            self.builds += 1
        elif rewired:
            self.chunks = {}


def run_program(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    index, definition, ids, values = payload
    if definition is not None:
        engine.programs[index] = Program(definition)
        _settle_collector()
    program = engine.programs.get(index)
    if program is None:
        raise RuntimeError(
            f"program {index} is not known on rank {engine.rank_str}: the controller sent a run "
            "of it before its definition"
        )
    steps, chunked = program.steps, program.chunks
    env = engine.env
    this = engine.current  # this program's op, in its batch
    held: dict[int, Any] = {}  # what lowered steps made: id -> (local tensor, spec)
    rewired = False  # a chunk could not run: this run is wired or laid out otherwise
    lowered = False  # a step was lowered in this run
    k, n = 0, len(steps)
    while k < n:
        if chunked:
            chunk = chunked.get(k)
            if chunk is not None and not engine.poison and engine.broken is None:
                went_on = chunk.run(engine, steps, ids, values, held)
                if went_on != k:
                    k = went_on
                    continue
                rewired = True
        step = steps[k]
        k += 1
        at = step.at
        n_out, n_in = step.op[1], step.op[2]
        in_ids = ids[at + n_out : at + n_out + n_in]
        if not step.direct or engine.poison or engine.broken is not None:
            if held:
                release(in_ids, env, held)
            engine._execute(step.as_sent(ids, values))  # noqa: SLF001  (the engine's own path)
            continue
        outs = ids[at : at + n_out]
        engine.current = ("aten", outs, (), (), step.name, step.op[5])
        if step.lowered is not None and _run_lowered(engine, step, in_ids, outs, ids, values, held):
            continue
        if held:
            release(in_ids, env, held)
        before = step.lowered
        _run_direct(engine, step, in_ids, outs, ids, values)
        lowered = lowered or step.lowered is not before
    if held:
        release(_outliving(engine, this, held), env, held)
    if chunked is None or rewired or lowered:
        program.after_run(ids, rewired)
    return []


def _run_lowered(
    engine: EngineState, step: _Step, in_ids: Any, outs: Any, ids: Any, values: Any, held: Any
) -> bool:
    """Run a lowered step on the local tensors; False when its inputs (or a result) are not
    laid out as on its first run: then nothing ran, or nothing was kept, and the route runs it."""
    lowered = step.lowered
    assert lowered is not None
    env = engine.env
    locals_ = lowered.locals_of(in_ids, env, held)
    if locals_ is None:
        return False
    args, kwargs = _call_args(step, locals_, values)
    if lowered.fixed:
        args = _fixed(args, lowered.fixed)
    try:
        out = lowered.local_op(*args, **kwargs)
        if not lowered.keep(out, locals_, in_ids, outs, env, held):
            return False
    except Exception as exc:
        release(in_ids, env, held)  # a failure poisons what the op wrote
        engine.failed(step.as_sent(ids, values), exc)
        return True
    if len(outs) > 1:
        for o in outs:
            engine.siblings[o] = outs
    return True


def _run_direct(
    engine: EngineState, step: _Step, in_ids: Any, outs: Any, ids: Any, values: Any
) -> None:
    """Run a step by its route (lowering it for the next runs, where the route allows), or by
    DTensor where the route does not take it (a general path's op: by ``run_aten``)."""
    env = engine.env
    try:
        inputs = [env[i] for i in in_ids]
    except KeyError:
        engine._execute(step.as_sent(ids, values))  # noqa: SLF001  (raises, naming the value)
        return
    taken = lift_inputs(engine, inputs) if step.lifts else inputs
    args, kwargs = _call_args(step, taken, values)
    try:
        route = step.route
        result = None if route is None else route(step.func, args, kwargs)
        if result is None and step.general:
            leaves = None  # run_aten's general path: constants as DTensors first (below)
        elif result is None:  # not on the shards: DTensor runs it, as run_aten would
            leaves = on_dtensors(step.name[0], step.func, args, kwargs)
        else:
            leaves = tensor_leaves(result)
            if step.lowerable:
                step.lowered = lower(step.func, route, inputs, taken, (args, kwargs), result)
        if leaves is not None and len(leaves) != len(outs):
            raise RuntimeError(
                f"{step.name[0]} gave {len(leaves)} results where the controller expected "
                f"{len(outs)}; the controller's shape propagation and this rank disagree"
            )
    except Exception as exc:
        engine.failed(step.as_sent(ids, values), exc)
        return
    if leaves is None:
        engine._execute(step.as_sent(ids, values))  # noqa: SLF001
        return
    for o, v in zip(outs, leaves, strict=True):
        env[o] = v
    if len(outs) > 1:
        for o in outs:
            engine.siblings[o] = outs


def _fixed(args: tuple[Any, ...], fixed: tuple[tuple[int, Any], ...]) -> tuple[Any, ...]:
    out = list(args)
    for k, v in fixed:
        out[k] = v
    return tuple(out)


def _outliving(engine: EngineState, this: Any, held: dict[int, Any]) -> list[int]:
    """Of the ids in ``held``, those read after this program: by a later op of its batch, or
    after the batch (it does not drop them)."""
    dropped = set(engine.batch_drops)
    if not dropped:
        return list(held)
    batch = engine.batch_ops
    later: set[int] = set()
    for k, op in enumerate(batch):
        if op is this:
            for after in batch[k + 1 :]:
                later.update(after[4][2] if after[0] == "program" else after[2])
            break
    else:
        return list(held)  # not run from a batch: keep all
    return [i for i in held if i not in dropped or i in later]


_settled = False


def _call_args(
    step: _Step, inputs: list[Any], values: Sequence[Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A direct step's arguments and keywords in this run: its template filled with ``inputs``
    (DTensors, or their local tensors for a lowered step; in the order of its ins, put in its
    arguments' order here) and the run's values."""
    if step.order is not None:
        inputs = [inputs[k] for k in step.order]
    it = iter(inputs)
    if step.simple and step.filled_kwargs is None:
        return tuple([next(it) if a is IN else a for a in step.args]), step.kwargs
    vals = iter(values[step.var0 : step.var0 + step.nvars])
    args = tuple([fill(a, it, vals) for a in step.args])  # (the keywords' come after these)
    if step.filled_kwargs is None:
        return args, step.kwargs
    return args, {k: fill(v, it, vals) for k, v in step.filled_kwargs}


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
