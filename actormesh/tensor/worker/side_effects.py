"""Which values an op changes besides its outputs (worker side, used when an op fails).

A failed op poisons its outputs. Ops that work by side effect have none, or not all of what they
change among them, and a failure must still surface where the user looks next:

- an aten op that writes into arguments its schema marks as mutable (``_foreach_add_`` returns
  nothing; ``batch_norm`` updates its running stats) poisons those arguments;
- an aten op with no outputs that writes nothing is a check: ``torch.linalg.cholesky`` records
  ``linalg_cholesky_ex`` and then ``_linalg_check_errors`` on its ``info`` output, and the check
  is what raises. It poisons its inputs *and the values made together with them* (the factor the
  user holds), as the local call would have raised before handing out any of them;
- any other kind of op with no outputs (a remote function that returns nothing, a module's
  ``train()``) may have written into any of its inputs: they are all poisoned; so are a
  checkpoint load's, which writes into every input.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..wire.ops import IN, Op, Ref

# Kinds whose op writes every input whole: a failed input does not make it fail, and once it ran
# the inputs are good again (a checkpoint loaded over values a failed step left behind).
OVERWRITES_INPUTS = frozenset({"checkpoint_load"})


def written(op: Op, siblings: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
    """Ids that op ``op`` may have changed besides its outputs (``siblings``: id -> the ids made
    by the same op, for ops with several outputs)."""
    kind, out, ins, _meta, payload, _site = op
    if kind != "aten":
        return () if out and kind not in OVERWRITES_INPUTS else ins
    mutated = _mutable_arguments(payload, ins)
    if mutated or out:
        return mutated
    found: list[int] = []
    for i in ins:
        for j in siblings.get(i, (i,)):
            if j not in found:
                found.append(j)
    return tuple(found)


def _mutable_arguments(payload: Any, ins: tuple[int, ...]) -> tuple[int, ...]:
    from .aten import resolve_op

    name, args, kwargs = payload[:3]
    # The fast path sends its inputs as IN, in the order of ``payload[4]`` (args first, then
    # kwargs); the general path (``payload[4]`` None) sends Refs.
    inputs = iter(payload[4] or ())
    positional = [list(_ids(a, inputs)) for a in args]
    by_name = {k: list(_ids(v, inputs)) for k, v in kwargs.items()}
    out: list[int] = []
    for position, argument in enumerate(resolve_op(name)._schema.arguments):  # noqa: SLF001
        alias = argument.alias_info
        if alias is None or not alias.is_write:
            continue
        if not argument.kwarg_only and position < len(positional):
            out.extend(positional[position])
        else:
            out.extend(by_name.get(argument.name, ()))
    return tuple(out)


def _ids(x: Any, inputs: Iterator[int]) -> Iterator[int]:
    if x is IN:
        yield next(inputs)
    elif type(x) is Ref:
        yield x.id
    elif type(x) is list or type(x) is tuple:
        for e in x:
            yield from _ids(e, inputs)
