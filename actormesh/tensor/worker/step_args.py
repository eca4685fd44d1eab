"""A program step's arguments (``programs.py``): which parts of its template are the values
themselves, and how a run fills in the rest (its inputs, its values, lists of either).

Both ways of running a step use them: step by step (``programs.py``) and a chunk's generated
function (``chunks.py``), which writes the same filling out as Python once.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from ..wire.ops import IN, Ref
from ..wire.programs import DICT, LIST, VAR


def literal(a: Any) -> bool:
    """A template's argument that is itself the value (no input, value, list or dict in it)."""
    if a is IN or a is VAR or a is LIST or a is DICT or type(a) is Ref:
        return False
    if type(a) is tuple:
        return all(literal(e) for e in a)
    return True


def fillable(a: Any) -> bool:
    """An argument ``fill`` fills: IN, VAR, literals, and tuples or lists of those."""
    if a is IN or a is VAR or literal(a):
        return True
    if type(a) is tuple:
        elements = a[1:] if a and a[0] is LIST else a
        return all(fillable(e) for e in elements)
    return False


class Run:
    """A list argument of ``n`` inputs (a ``Tensor[]``: a foreach op's parameters) or ``n``
    values (a ``Scalar[]``), taken from the run's in one C-level slice each."""

    __slots__ = ("n", "of_inputs")

    def __init__(self, n: int, of_inputs: bool) -> None:
        self.n, self.of_inputs = n, of_inputs


def runs(a: Any) -> Any:
    """A template argument with its lists of only inputs, or only values, as ``Run``s."""
    if type(a) is tuple and len(a) > 1 and a[0] is LIST:
        body = a[1:]
        if all(e is IN for e in body):
            return Run(len(body), True)
        if all(e is VAR for e in body):
            return Run(len(body), False)
    return a


def fill(a: Any, inputs: Any, vals: Any) -> Any:
    if a is IN:
        return next(inputs)
    if a is VAR:
        return next(vals)
    if type(a) is Run:
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
            return [fill(e, inputs, vals) for e in a[1:]]
        return tuple([fill(e, inputs, vals) for e in a])
    return a
