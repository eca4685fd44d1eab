"""A program's runs of lowered steps, each run as one generated Python function (issue 43).

Once a program's steps are lowered (``lowered.py``), each still costs its run through
``programs.py``'s loop: ids sliced out of the run's, each input looked up and checked, the
arguments filled in, each result checked and kept, about 15 µs a step against a few for the op
itself, and the Python between two ops empties the caches the next op would have met. A
*chunk* is a run of consecutive lowered steps turned into one function, made once from a run
of the program, whose body calls the ops one after another on local variables::

    def chunk(values, x0, x1):
        v0 = f0(x0, c0)
        v1 = f1(v0, x1, values[3])
        ...

Its inputs (values made before it: in the engine's values as DTensors, or kept by an earlier
lowered step as local tensors) are looked up and checked once, as a step's are; the steps in
between need no check, since an op on local tensors of the same specs and strides makes
results of the same specs and strides every time. Nothing else of a step is worked out at run
time: which input of which step is which value, the literals, the values' positions in the run.

What ties a chunk to the run it was made from is its wiring: which step reads which value. A
program's key (``controller/programs.py``) is its ops' structure, not the ids they read, so a
later run may wire them otherwise (a step that read an earlier step's result now reads a
parameter). Each run checks, with two C-level comparisons of its ids, that every input the
chunk takes from an earlier step has that step's result's id in this run, and that every other
input's id is older than the chunk's first new result (ids only grow: a value made in the chunk
cannot be among them). Any other run, and any run while a value of this rank is poisoned, runs
step by step as before. A step that raises keeps what the steps before it made, fails as it
would have alone (its rank, op and line), and the program goes on step by step after it.
"""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any

from ..wire.kinds import CHECK
from ..wire.ops import IN
from ..wire.programs import LIST, VAR
from .lowered import locals_at, release
from .step_args import Run, literal

if TYPE_CHECKING:
    from .state import EngineState

MIN_STEPS = 2  # one lowered step alone gains nothing from a chunk


class Chunk:
    """Steps ``start`` to ``stop`` (excluded) of a program as one function."""

    __slots__ = (
        "fn", "fresh_after", "loads", "multi", "new_at", "new_specs", "new_strides", "olds",
        "outs_of", "same_left", "same_right", "start", "stop",
    )  # fmt: skip

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop
        self.fn: Any = None
        # per input the chunk looks up: (position of its id in a run's ids, spec, local strides)
        self.loads: tuple[tuple[int, Any, Any], ...] = ()
        # ids equal in a run as in the one the chunk was made from (None: no such pair)
        self.same_left: Any = None
        self.same_right: Any = None
        self.olds: Any = None  # the looked-up inputs' ids, all older than ...
        self.fresh_after: int | None = None  # ... the id at this position (the first result)
        self.new_at: Any = None  # the new results' ids, from a run's ids
        self.new_specs: tuple[Any, ...] = ()
        self.new_strides: tuple[Any, ...] = ()
        # per step: its new results' names in the function's locals, in new_at's order
        self.outs_of: list[list[str]] = []
        self.multi: tuple[tuple[int, int], ...] = ()  # (at, n_out) of steps with several outputs

    def run(self, engine: EngineState, steps: list[Any], ids: Any, values: Any, held: Any) -> int:
        """Run the chunk in this run; the index of the step to go on from (``start`` when the
        run is not wired as the chunk, or an input is laid out otherwise: nothing ran)."""
        if self.same_left is not None and self.same_left(ids) != self.same_right(ids):
            return self.start
        if self.fresh_after is not None and self.olds is not None:
            olds = self.olds(ids)
            if (max(olds) if type(olds) is tuple else olds) >= ids[self.fresh_after]:
                return self.start
        inputs = locals_at([(ids[p], spec, st) for p, spec, st in self.loads], engine.env, held)
        if inputs is None:
            return self.start
        engine.current = steps[self.start].shown(ids)
        failed, made, scope = self.fn(values, *inputs)
        if failed is not None:
            return self._fail(engine, steps, ids, values, held, failed, made, scope)
        new_at = self.new_at
        if new_at is not None:
            if CHECK:
                _check_layouts(made, self.new_strides)
            new_ids = new_at(ids)
            if type(new_ids) is tuple:
                held.update(zip(new_ids, zip(made, self.new_specs, strict=True), strict=True))
            else:
                held[new_ids] = (made[0], self.new_specs[0])
        _siblings(engine, ids, self.multi, len(ids))
        return self.stop

    def _fail(
        self,
        engine: EngineState,
        steps: list[Any],
        ids: Any,
        values: Any,
        held: Any,
        failed: int,
        exc: Exception,
        scope: dict[str, Any],
    ) -> int:
        """Step ``failed`` raised ``exc``: keep what the steps before it made (``scope``: the
        function's locals), fail it as ``programs._run_lowered`` does, go on after it."""
        new_ids = self.new_at(ids) if self.new_at is not None else ()
        new_ids = new_ids if type(new_ids) is tuple else (new_ids,)
        k = 0
        for offset, names in enumerate(self.outs_of):
            if self.start + offset >= failed:
                break
            for name in names:
                held[new_ids[k]] = (scope[name], self.new_specs[k])
                k += 1
        step = steps[failed]
        _siblings(engine, ids, self.multi, step.at)
        at, n_out, n_in = step.at, step.op[1], step.op[2]
        release(ids[at + n_out : at + n_out + n_in], engine.env, held)
        engine.current = step.shown(ids)
        engine.failed(step.as_sent(ids, values), exc)
        return failed + 1


def _siblings(engine: EngineState, ids: Any, multi: Any, before: int) -> None:
    """The results of each step with several (``multi``: where its ids start, how many) whose
    ids start before ``before``, named as one another's siblings, as ``_execute`` does."""
    for at, n_out in multi:
        if at < before:
            outs = ids[at : at + n_out]
            for o in outs:
                engine.siblings[o] = outs


def _check_layouts(made: tuple[Any, ...], strides: tuple[Any, ...]) -> None:
    """(The test suite's protocol checks.) Each new result is laid out as in the run the
    chunk was made from, as ``Lowered.keep`` would have required one by one."""
    for result, stride in zip(made, strides, strict=True):
        if result.stride() != stride:
            raise AssertionError(
                f"a chunk's result has strides {result.stride()}, not {stride} as when it was made"
            )


def build(steps: list[Any], ids: Any) -> dict[int, Chunk]:
    """The chunks of ``steps``: each run of at least ``MIN_STEPS`` consecutive lowered steps
    (by their start), wired as in the run whose ids are ``ids``."""
    chunks: dict[int, Chunk] = {}
    k = 0
    while k < len(steps):
        if steps[k].lowered is None:
            k += 1
            continue
        chunk = _make(steps, k, ids)
        if chunk is None:
            k += 1
            continue
        chunks[k] = chunk
        k = chunk.stop
    return chunks


def _make(steps: list[Any], start: int, ids: Any) -> Chunk | None:
    """The longest chunk from ``start`` on, or None when it would be shorter than
    ``MIN_STEPS``."""
    source = _Source(ids)
    stop = start
    while stop < len(steps) and steps[stop].lowered is not None and source.add(steps[stop]):
        stop += 1
    if stop - start < MIN_STEPS:
        return None
    return source.chunk(start, stop)


def _one_tensor(func: Any) -> bool:
    """Whether ``func`` returns one tensor (not a tuple or a list of them)."""
    returns = func._schema.returns  # noqa: SLF001
    return len(returns) == 1 and str(returns[0].type) == "Tensor"


class _Source:
    """A chunk's function, written step by step, and what its runs check."""

    def __init__(self, ids: Any) -> None:
        self.ids = ids
        self.lines: list[str] = []
        self.names: dict[str, Any] = {}  # the function's globals: ops, literals
        self.made: dict[int, tuple[str, Any, int]] = {}  # id -> (variable, spec, position)
        self.loaded: dict[int, tuple[str, Any, Any, int]] = {}  # id -> (var, spec, stride, pos)
        self.same: list[tuple[int, int]] = []
        self.new: list[tuple[int, Any, Any]] = []  # (position, spec, strides) per new result
        self.outs_of: list[list[str]] = []
        self.multi: list[tuple[int, int]] = []

    def add(self, step: Any) -> bool:
        """Write ``step``'s call; False (nothing written) when it cannot join the chunk."""
        lowered, ids, at, n_out = step.lowered, self.ids, step.at, step.op[1]
        in_at = range(at + n_out, at + n_out + step.op[2])
        taken = self._inputs(lowered, in_at)
        if taken is None:
            return False
        inputs, same, loads = taken
        n = len(self.outs_of)
        given = self._results(lowered, range(at, at + n_out), in_at, inputs, n)
        if given is None:
            return False
        results, new, outs = given
        call = self._call(step, inputs, n)
        if not lowered.outs:
            line = call
        elif _one_tensor(step.func):
            line = f"{results[0] or '_'} = {call}"
        else:
            line = f"r{n} = {call}" + "".join(
                f"; {name} = r{n}[{r}]" for r, name in enumerate(results) if name.startswith("v")
            )
        self.lines.append(f"k = {n}")
        self.lines.append(line)
        self.same.extend(same)
        self.loaded.update(loads)
        for (position, spec, _), name in zip(new, outs, strict=True):
            self.made[ids[position]] = (name, spec, position)
        for kept in lowered.outs:
            if type(kept) is int:
                self.made[ids[in_at[kept]]] = (inputs[kept], lowered.specs[kept], in_at[kept])
        self.new.extend(new)
        self.outs_of.append(outs)
        if n_out > 1:
            self.multi.append((at, n_out))
        return True

    def _inputs(self, lowered: Any, in_at: range) -> Any:
        """A step's inputs as the chunk's variables, the pairs of positions whose ids a run must
        find equal, and the inputs the chunk looks up first; None when one is laid out unlike
        what the chunk holds under its id."""
        inputs: list[str] = []
        same: list[tuple[int, int]] = []
        loads: dict[int, tuple[str, Any, Any, int]] = {}
        for position, spec, stride in zip(in_at, lowered.specs, lowered.strides, strict=True):
            i = self.ids[position]
            if i in self.made:
                name, made_spec, defined = self.made[i]
                if made_spec is not spec:
                    return None
                same.append((position, defined))
            else:
                known = self.loaded.get(i) or loads.get(i)
                if known is None:
                    known = loads[i] = (f"x{len(self.loaded) + len(loads)}", spec, stride, position)
                elif known[1] is not spec or known[2] != stride:
                    return None
                else:
                    same.append((position, known[3]))
                name = known[0]
            inputs.append(name)
        return inputs, same, loads

    def _results(self, lowered: Any, out_at: range, in_at: range, inputs: list[str], n: int) -> Any:
        """Step ``n``'s results as variables ("" for none; an input's for one written in
        place), its new ones (position, spec, strides) and their names; None when its ids do
        not match its first run's results."""
        results: list[str] = []
        new: list[tuple[int, Any, Any]] = []
        outs: list[str] = []
        positions = iter(out_at)
        for r, kept in enumerate(lowered.outs):
            if kept is None:
                results.append("")
                continue
            position = next(positions, None)
            if position is None:
                return None
            if type(kept) is int:  # written in place: the input, under the same id
                if self.ids[position] != self.ids[in_at[kept]]:
                    return None
                results.append(inputs[kept])
            else:
                results.append(f"v{n}_{r}")
                new.append((position, kept[0], kept[1]))
                outs.append(f"v{n}_{r}")
        if next(positions, None) is not None:
            return None
        return results, new, outs

    def _call(self, step: Any, inputs: list[str], n: int) -> str:
        """The expression that calls ``step``'s op on the variables ``inputs``."""
        self.names[f"f{n}"] = step.lowered.local_op
        # (the inputs in the order of the step's ins; its arguments may name them otherwise)
        feed = iter(inputs if step.order is None else [inputs[k] for k in step.order])
        var = iter(range(step.var0, step.var0 + step.nvars))
        literals = 0

        def expression(a: Any) -> str:
            nonlocal literals
            if a is IN:
                return next(feed)
            if a is VAR:
                return f"values[{next(var)}]"
            if type(a) is Run:
                if a.of_inputs:
                    return "[" + ", ".join(next(feed) for _ in range(a.n)) + "]"
                return "[" + ", ".join(f"values[{next(var)}]" for _ in range(a.n)) + "]"
            if type(a) is tuple and a and a[0] is LIST:
                return "[" + ", ".join(expression(e) for e in a[1:]) + "]"
            if type(a) is tuple and not literal(a):  # inputs, values or lists inside
                return "(" + "".join(expression(e) + ", " for e in a) + ")"
            name = f"c{n}_{literals}"
            literals += 1
            self.names[name] = a
            return name

        args = [expression(a) for a in step.args]
        for position, value in step.lowered.fixed:
            name = f"c{n}_{literals}"
            literals += 1
            self.names[name] = value
            args[position] = name
        if step.kwargs:
            self.names[f"w{n}"] = step.kwargs
            args.append(f"**w{n}")
        return f"f{n}({', '.join(args)})"

    def chunk(self, start: int, stop: int) -> Chunk:
        chunk = Chunk(start, stop)
        loads = sorted(self.loaded.values(), key=lambda load: int(load[0][1:]))
        chunk.loads = tuple((position, spec, stride) for _, spec, stride, position in loads)
        if self.same:
            chunk.same_left = itemgetter(*[p for p, _ in self.same])
            chunk.same_right = itemgetter(*[q for _, q in self.same])
        if self.new and loads:
            chunk.olds = itemgetter(*[position for *_, position in loads])
            chunk.fresh_after = self.new[0][0]
        if self.new:
            chunk.new_at = itemgetter(*[position for position, _, _ in self.new])
            chunk.new_specs = tuple(spec for _, spec, _ in self.new)
            chunk.new_strides = tuple(strides for _, _, strides in self.new)
        chunk.outs_of = self.outs_of
        chunk.multi = tuple(self.multi)
        made = ", ".join(name for names in self.outs_of for name in names)
        body = "\n".join(f"        {line}" for line in self.lines)
        params = "".join(f", {name}" for name, *_ in loads)
        source = (
            f"def chunk(values{params}):\n"
            "    k = 0\n"
            "    try:\n"
            f"{body}\n"
            "    except Exception as exc:\n"
            f"        return k + {start}, exc, locals()\n"
            f"    return None, ({made}{',' if made else ''}), None\n"
        )
        namespace = dict(self.names)
        exec(compile(source, f"<chunk of steps {start}-{stop - 1}>", "exec"), namespace)
        chunk.fn = namespace["chunk"]
        return chunk
