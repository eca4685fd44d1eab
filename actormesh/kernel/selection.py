"""Pure parsing for the magics: the TARGET expression, ``--ranks`` selections, rank ranges;
and the values of a selection, labelled with the ranks' own coordinates.

Nothing here does I/O, so it is tested without processes. User text is never ``eval()``-ed: a
TARGET is parsed with ``ast`` and walked by hand, allowing only a name, attribute access,
``.slice(...)`` calls with literal arguments and ``[...]`` with a literal key.
"""

from __future__ import annotations

import ast
import builtins
import itertools
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..runtime.extent import Point
from ..runtime.meshes import ValueMesh, new_value_mesh
from ..runtime.shape import Shape


class SelectionError(ValueError):
    """A TARGET or ``--ranks`` the magics cannot use; the message is one line for the user."""


# -- TARGET ---------------------------------------------------------------------------------------

_METHODS = frozenset({"slice"})  # the only calls a TARGET may contain


def resolve_target(text: str, namespace: Mapping[str, Any]) -> Any:
    """The object that ``text`` names in ``namespace``, e.g. ``procs.slice(gpus=1)``.

    Raises:
        SelectionError: the text is not such an expression, or a name is not defined.
    """
    text = text.strip()
    if not text:
        raise SelectionError("give a TARGET: a ProcMesh or ActorMesh, e.g. %%mesh procs")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise SelectionError(f"TARGET {text!r} is not a Python expression") from None
    return _walk(tree.body, namespace, text)


def _walk(node: ast.AST, ns: Mapping[str, Any], text: str) -> Any:
    if isinstance(node, ast.Name):
        try:
            return ns[node.id]
        except KeyError:
            raise SelectionError(f"name {node.id!r} is not defined (TARGET {text!r})") from None
    if isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            raise SelectionError(f"TARGET may not use private attribute {node.attr!r}")
        base = _walk(node.value, ns, text)
        try:
            return getattr(base, node.attr)
        except AttributeError:
            raise SelectionError(
                f"{type(base).__name__} has no attribute {node.attr!r} (TARGET {text!r})"
            ) from None
    if isinstance(node, ast.Call):
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr in _METHODS):
            raise SelectionError(
                f"TARGET {text!r} may only call .slice(...); write e.g. procs.slice(gpus=0)"
            )
        base = _walk(func.value, ns, text)
        args = [_literal(a, text) for a in node.args]
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise SelectionError(f"TARGET {text!r}: **kwargs are not allowed")
            kwargs[kw.arg] = _literal(kw.value, text)
        try:
            return getattr(base, func.attr)(*args, **kwargs)
        except (ValueError, IndexError, TypeError, KeyError) as exc:
            raise SelectionError(f"TARGET {text!r}: {_one_line(exc)}") from None
    if isinstance(node, ast.Subscript):
        base = _walk(node.value, ns, text)
        key = _literal(node.slice, text)
        try:
            return operator.getitem(base, key)
        except (ValueError, IndexError, TypeError, KeyError) as exc:
            raise SelectionError(f"TARGET {text!r}: {_one_line(exc)}") from None
    raise SelectionError(
        f"TARGET {text!r} must be a name, attribute access, .slice(...) or [...] with literal "
        "arguments"
    )


def _literal(node: ast.AST, text: str) -> Any:
    if isinstance(node, ast.Slice):
        parts = [None if p is None else _literal(p, text) for p in (node.lower, node.upper)]
        step = None if node.step is None else _literal(node.step, text)
        return builtins.slice(parts[0], parts[1], step)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "slice"
        and not node.keywords
    ):
        return builtins.slice(*[_literal(a, text) for a in node.args])
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e, text) for e in node.elts)
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise SelectionError(f"TARGET {text!r}: arguments must be literals") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# -- --ranks SEL ----------------------------------------------------------------------------------

_INT = re.compile(r"^-?\d+$")
_SLICE = re.compile(r"^(-?\d+)?:(-?\d+)?(?::(\d+)?)?$")
_NAME = re.compile(r"^[A-Za-z_]\w*$")


@dataclass(frozen=True)
class Selection:
    """The ranks a cell runs on: global ranks in order, and a shape when they form one."""

    ranks: tuple[int, ...]
    shape: Shape | None  # None when the ranks are not evenly spaced (e.g. --ranks 0,1,3)


def _index_or_slice(text: str, what: str) -> int | builtins.slice:
    if _INT.match(text):
        return int(text)
    m = _SLICE.match(text)
    if m is None:
        raise SelectionError(f"bad {what} {text!r}: use N, A:B, A:B:S or ::S")
    start, stop, step = (None if g is None else int(g) for g in m.groups())
    if step == 0:
        raise SelectionError(f"bad {what} {text!r}: the step must be positive")
    return builtins.slice(start, stop, step)


def select(shape: Shape, sel: str | None) -> Selection:
    """The ranks of ``shape`` picked by ``sel``.

    ``sel`` is positions in ``shape``'s row-major order (``0``, ``0,2``, ``1:4``, ``::2``) or
    coordinates (``gpus=1``, ``hosts=0,gpus=0:2``); ``None`` selects every rank.
    """
    if sel is None or not sel.strip():
        return Selection(shape.ranks(), shape)
    items = [s.strip() for s in sel.split(",")]
    if any(not s for s in items):
        raise SelectionError(f"bad --ranks {sel!r}: empty item")
    if any("=" in s for s in items):
        return _select_coords(shape, sel, items)
    return _select_positions(shape, sel, items)


def _select_coords(shape: Shape, sel: str, items: list[str]) -> Selection:
    selectors: dict[str, int | builtins.slice] = {}
    for item in items:
        dim, eq, value = item.partition("=")
        dim = dim.strip()
        if not eq or not _NAME.match(dim):
            raise SelectionError(
                f"bad --ranks {sel!r}: mix of positions and coordinates; write e.g. "
                "hosts=0,gpus=0:2"
            )
        if dim in selectors:
            raise SelectionError(f"bad --ranks {sel!r}: dimension {dim!r} given twice")
        selectors[dim] = _index_or_slice(value.strip(), f"selector for {dim!r}")
    try:
        view = shape.slice(**selectors)
    except (ValueError, IndexError, TypeError) as exc:
        raise SelectionError(f"bad --ranks {sel!r}: {_one_line(exc)}") from None
    return Selection(view.ranks(), view)


def _select_positions(shape: Shape, sel: str, items: list[str]) -> Selection:
    all_ranks = shape.ranks()
    n = len(all_ranks)
    picked: list[int] = []
    for item in items:
        index = _index_or_slice(item, "rank")
        if isinstance(index, int):
            if not -n <= index < n:
                raise SelectionError(f"rank {index} is out of range: the target has {n} ranks")
            picked.append(index % n)
        else:
            got = range(n)[index]
            if not got:
                raise SelectionError(f"--ranks {item!r} selects no rank of {n}")
            picked.extend(got)
    positions = sorted(set(picked))
    ranks = tuple(all_ranks[i] for i in positions)
    return Selection(ranks, _shape_of_positions(shape, positions))


def _shape_of_positions(shape: Shape, positions: list[int]) -> Shape | None:
    """A view of ``shape`` holding exactly ``positions`` (row-major), if one exists."""
    n = len(shape)
    if len(positions) == n:
        return shape
    step = positions[1] - positions[0] if len(positions) > 1 else 1
    if any(b - a != step for a, b in itertools.pairwise(positions)):
        return None
    sel = builtins.slice(positions[0], positions[-1] + 1, step)
    big = [label for label, size in zip(shape.labels, shape.sizes, strict=True) if size > 1]
    try:
        if len(big) == 1:  # keep the dimension's name: procs --ranks 1:3 is {gpus: 2}
            return shape.slice(**{big[0]: sel})
        return shape.flatten("ranks").slice(ranks=sel)
    except ValueError:
        return None


# -- rendering ------------------------------------------------------------------------------------


class RankValues(ValueMesh[Any]):
    """The values of some ranks of a mesh, each shown with its rank's own coordinates in the
    mesh (``-r 2`` shows ``gpus=2``, not ``gpus=0``, its position in the selection). Indexing,
    ``items()`` and slicing go by the selection's extent, as in any ``ValueMesh``."""

    __slots__ = ("_own",)
    _own: tuple[str, ...]  # by position in ``_base``, which slices share

    def _render_point(self, point: Point, shown: list[int]) -> str:
        index = self._base.local_index(self._shape.global_rank(point.rank))
        assert index is not None
        return self._own[index]

    def _new_with_shape(self, shape: Shape) -> RankValues:
        view = RankValues.__new__(RankValues)
        for name, value in (("_shape", shape), ("_base", self._base), ("_values", self._values)):
            object.__setattr__(view, name, value)
        object.__setattr__(view, "_own", self._own)
        return view


def values_of(mesh: Shape, selection: Selection, values: Sequence[Any]) -> ValueMesh[Any]:
    """One value per selected rank of ``mesh``, labelled with the ranks' own coordinates."""
    shape = selection.shape or Shape.from_extent({"ranks": len(values)})
    if tuple(selection.ranks) == tuple(mesh.ranks()):
        return new_value_mesh(shape, values)
    shown = [i for i, size in enumerate(mesh.sizes) if size > 1] or list(range(len(mesh.sizes)))
    own = []
    for rank in selection.ranks:
        point = Point(rank, mesh.extent)
        text = ", ".join(f"{mesh.labels[i]}={point[mesh.labels[i]]}" for i in shown)
        own.append(text if len(shown) == 1 else f"({text})")
    result = RankValues._create(shape, values)  # noqa: SLF001  ValueMesh's, for this module's subclass
    object.__setattr__(result, "_own", tuple(own))
    return result
