"""Every import statement of the actormesh package, of every form, for the tests that check
how its parts depend on each other (``unit/test_layers.py``, ``unit/test_faces.py``)."""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator
from typing import NamedTuple

import actormesh

PACKAGE = pathlib.Path(actormesh.__file__).parent


class Import(NamedTuple):
    module: str  # the module the statement is in
    line: int
    target: str  # the module or package imported (``from target import name``), absolute
    name: str | None  # the name imported from it, or None for ``import target``
    type_only: bool  # in an ``if TYPE_CHECKING:`` block


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for child in node.body:
                    inside.update(id(n) for n in ast.walk(child))
    return inside


def imports_in(source: str, module: str, is_package: bool) -> Iterator[Import]:
    """Every import of an actormesh module in ``source``: module-level, in functions and in
    ``if TYPE_CHECKING:`` blocks; relative ones made absolute."""
    tree = ast.parse(source)
    type_only = _type_checking_nodes(tree)
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "actormesh":
                    yield Import(module, node.lineno, alias.name, None, id(node) in type_only)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "actormesh":
                for alias in node.names:
                    yield Import(module, node.lineno, target, alias.name, id(node) in type_only)


def package_sources(root: pathlib.Path = PACKAGE) -> Iterator[tuple[str, str, bool]]:
    """``(module, source, is_package)`` for every module of the package."""
    for path in sorted(root.rglob("*.py")):
        if "labextension" not in path.parts:
            yield module_name(path), path.read_text(), path.name == "__init__.py"
