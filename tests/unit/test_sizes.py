"""Modules stay small enough to read as one job, and functions short enough to read at once:
every module of the package at most ``MODULE_LINES`` lines, every function (or method) at most
``FUNCTION_LINES``, except the few listed below, each with the reason it is right as it is.

A module past the limit is split where the split says something (two jobs become two modules
named after them); a long function becomes named steps. An exception is for what a split would
make worse: generated code, a hot path written out on purpose, a table. Measured with ``ast``:
a module's lines, a function's from its ``def`` to its last line (docstring included)."""

from __future__ import annotations

import ast
import pathlib

from import_scan import PACKAGE

MODULE_LINES = 400
FUNCTION_LINES = 60

# Module (relative to actormesh/) -> why it may be longer.
LONG_MODULES = {
    "runtime/messaging/envelopes.py": (
        "generated from protocol.py's table by scripts/write_envelopes.py: one NamedTuple per "
        "message kind, never edited by hand"
    ),
    "runtime/messaging/node.py": (
        "Node, its Port and this process's current node: Port.send reaches the current node "
        "and Node makes Ports, so either one moved out would import the other back (a cycle "
        "test_layers forbids)"
    ),
    "runtime/actors/runner.py": (
        "ActorRunner, whose parts are modules already (lifecycle, reentry, ownership, "
        "response_port: runner_parts.Runner); what is left is its thread's loop and the "
        "handling of one call"
    ),
}

# "module:Class.function" (or "module:function") -> why it is right as it is.
LONG_FUNCTIONS = {
    "tensor/controller/recording.py:dispatch": (
        "the fast path of every recorded op, written out on purpose (its comment says so): a "
        "call frame per step shows in bench T2's cost per op"
    ),
    "runtime/messaging/codec.py:Verifier.decode": (
        "a straight-line check of one signed message (head, signature, destination, sequence, "
        "buffers, digest), run for every message received; the signing is inlined on purpose"
    ),
}


def _sources(root: pathlib.Path = PACKAGE) -> list[tuple[str, str]]:
    return [
        (str(path.relative_to(root)), path.read_text())
        for path in sorted(root.rglob("*.py"))
        if "labextension" not in path.parts
    ]


def long_modules(sources: list[tuple[str, str]], limit: int = MODULE_LINES) -> dict[str, int]:
    """Modules of more than ``limit`` lines, with their length."""
    found = {}
    for name, text in sources:
        lines = len(text.splitlines())
        if lines > limit:
            found[name] = lines
    return found


def long_functions(sources: list[tuple[str, str]], limit: int = FUNCTION_LINES) -> dict[str, int]:
    """Functions and methods of more than ``limit`` lines, as ``module:Class.function``."""
    found = {}
    for name, text in sources:
        for qualname, node in _functions(ast.parse(text)):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found[f"{name}:{qualname}"] = lines
    return found


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.AST]]:
    found: list[tuple[str, ast.AST]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append((prefix + node.name, node))
            found += _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, f"{prefix}{node.name}.")
    return found


def test_every_module_is_short_enough_or_says_why_not() -> None:
    found = long_modules(_sources())
    assert {m: n for m, n in found.items() if m not in LONG_MODULES} == {}


def test_every_function_is_short_enough_or_says_why_not() -> None:
    found = long_functions(_sources())
    assert {f: n for f, n in found.items() if f not in LONG_FUNCTIONS} == {}


def test_every_exception_is_still_needed() -> None:
    """An exception whose module or function got short (or went) is dropped from the list."""
    sources = _sources()
    assert set(LONG_MODULES) - set(long_modules(sources)) == set()
    assert set(LONG_FUNCTIONS) - set(long_functions(sources)) == set()


def test_a_long_module_and_a_long_function_are_found() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(FUNCTION_LINES))
    text = f"class Big:\n    def step(self) -> None:\n{body}\n\n\ndef short() -> None:\n    pass\n"
    text += "\n" * (MODULE_LINES - len(text.splitlines()) + 1)
    sources = [("runtime/big.py", text)]
    assert long_modules(sources) == {"runtime/big.py": MODULE_LINES + 1}
    assert long_functions(sources) == {"runtime/big.py:Big.step": FUNCTION_LINES + 1}
