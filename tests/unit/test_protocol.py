"""The control protocol table is the truth: every kind has exactly one handler, registered where
the table says, every envelope the runtime builds is a known kind with its fields, and the node
refuses what the table does not allow."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

import actormesh
from actormesh.runtime.messaging import envelopes, protocol
from actormesh.runtime.messaging.node import Node
from actormesh.runtime.messaging.protocol import (
    CALL,
    EVERY_ROLE,
    KINDS,
    ProtocolError,
    check_envelope,
)

PACKAGE = pathlib.Path(actormesh.__file__).parent


def _writer() -> Any:
    """scripts/write_envelopes.py, which writes envelopes.py from the table."""
    path = PACKAGE.parent / "scripts" / "write_envelopes.py"
    spec = importlib.util.spec_from_file_location("write_envelopes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


envelopes_source = _writer().envelopes_source
CONSTANTS = {
    name: value
    for name, value in vars(protocol).items()
    if name.isupper() and isinstance(value, str) and value in KINDS
}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if "labextension" in path.parts or path.name == "config.py":  # config: no messages
            continue
        rel = path.relative_to(PACKAGE).with_suffix("")
        yield ".".join(rel.parts), ast.parse(path.read_text())


def _kind_of(node: ast.expr) -> str | None:
    """The kind a protocol constant (``CALL`` or ``protocol.CALL``) names, else None."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return CONSTANTS.get(name) if name else None


def registrations(modules: Iterator[tuple[str, ast.Module]]) -> dict[str, list[str]]:
    """kind -> every ``module:enclosing function`` that calls ``register(KIND, ...)``."""
    found: dict[str, list[str]] = {}

    def visit(node: ast.AST, module: str, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, module, [*scope, child.name])
                continue
            if isinstance(child, ast.Call) and child.args:
                func = child.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                kind = _kind_of(child.args[0])
                if called == "register" and kind is not None:
                    found.setdefault(kind, []).append(f"{module}:{'.'.join(scope)}")
            visit(child, module, scope)

    for module, tree in modules:
        visit(tree, module, [])
    return found


def literal_envelopes(modules: Iterator[tuple[str, ast.Module]]) -> list[str]:
    """Tuples built with a kind as first element that break the table: a kind spelled as a
    string instead of its constant, or the wrong number of fields."""
    problems = []
    for module, tree in modules:
        if module == "runtime.messaging.envelopes":
            continue  # generated from the table, by name
        for node in ast.walk(tree):
            if not isinstance(node, ast.Tuple) or not node.elts:
                continue
            first = node.elts[0]
            if isinstance(first, ast.Constant) and first.value in KINDS and len(node.elts) > 1:
                problems.append(f"{module}:{node.lineno} spells {first.value!r}: use the constant")
            kind = _kind_of(first)
            if kind is None or any(isinstance(e, ast.Starred) for e in node.elts):
                continue
            least, most = KINDS[kind].arity
            if not least <= len(node.elts) - 1 <= most:
                problems.append(f"{module}:{node.lineno} builds {kind!r} with the wrong fields")
    return problems


def test_the_table_is_consistent() -> None:
    assert sorted(CONSTANTS.values()) == sorted(KINDS)
    for kind in KINDS.values():
        optional = [f.endswith("?") for f in kind.fields]
        assert optional == sorted(optional), f"{kind.name}: only trailing fields are optional"
        assert kind.senders and set(kind.senders) <= set(EVERY_ROLE), kind.name
        assert kind.roles and set(kind.roles) <= set(EVERY_ROLE), kind.name
        assert kind.doc, kind.name
        module, _, qualname = kind.handler.partition(":")
        target: object = importlib.import_module(f"actormesh.{module}")
        for part in qualname.split("."):
            target = getattr(target, part)


def test_every_kind_has_exactly_one_handler_where_the_table_says() -> None:
    found = registrations(_modules())
    assert sorted(found) == sorted(KINDS), "kinds without a handler, or handled but unknown"
    for kind, sites in found.items():
        assert sites == [KINDS[kind].handler], f"{kind!r} is registered at {sites}"


def test_every_envelope_the_code_builds_is_a_known_kind_with_its_fields() -> None:
    assert literal_envelopes(_modules()) == []


def test_the_checks_catch_a_deliberate_violation() -> None:
    bad = ast.parse(
        "def f(node):\n"
        "    node.register(CALL, g)\n"
        "    node.send(a, ('reply', 1, 0, 0))\n"
        "    node.send(a, (STOP, 1))\n"
    )
    assert registrations(iter([("bad", bad)])) == {"call": ["bad:f"]}
    assert literal_envelopes(iter([("bad", bad)])) == [
        "bad:3 spells 'reply': use the constant",
        "bad:4 builds 'stop' with the wrong fields",
    ]


def test_envelopes_are_checked_against_their_kind() -> None:
    check_envelope((CALL, "key", "ep", (), None))
    check_envelope((protocol.READY, "m", 0, 123))  # the optional tcp port left out
    check_envelope((protocol.READY, "m", 0, 123, 4567))
    with pytest.raises(ProtocolError, match="unknown message kind"):
        check_envelope(("no_such_kind", 1))
    with pytest.raises(ProtocolError, match="has the fields"):
        check_envelope((CALL, "key"))


def test_a_node_refuses_a_second_handler_and_an_unknown_kind(node: Node) -> None:
    node.register(CALL, lambda msg: None)
    with pytest.raises(ProtocolError, match="handled already"):
        node.register(CALL, lambda msg: None)
    with pytest.raises(ProtocolError, match="no message kind 'spawn'"):
        node.register("spawn", lambda msg: None)


# -- envelopes by field name -------------------------------------------------------------------


def test_envelopes_py_is_what_the_table_generates() -> None:
    written = (PACKAGE / "runtime" / "messaging" / "envelopes.py").read_text()
    assert written == envelopes_source(KINDS.values(), protocol.class_name), (
        "envelopes.py is not what protocol.py's table gives: python scripts/write_envelopes.py"
    )
    for kind in KINDS.values():
        cls = getattr(envelopes, protocol.class_name(kind))
        assert cls._fields == ("kind", *(f.rstrip("?") for f in kind.fields)), kind.name


def test_an_envelope_reads_by_name_with_optional_fields_as_none() -> None:
    reply = envelopes.ReplyEnvelope.read((protocol.REPLY, 7, 2, protocol.OK))
    assert (reply.kind, reply.port_id, reply.index, reply.status, reply.after) == (
        "reply", 7, 2, protocol.OK, None,
    )  # fmt: skip
    assert envelopes.ReplyEnvelope.read((protocol.REPLY, 7, 2, protocol.OK, 41)).after == 41
    call = envelopes.CallEnvelope.read((CALL, "key", "step", (), None))
    assert (call.key, call.endpoint, call.reply) == ("key", "step", None)
    assert protocol.ReplyTo.read((("h", None, None, b"m"), 3)).after is None
    assert protocol.ReplyTo.read((("h", None, None, b"m"), 3, b"c")).after == b"c"


def positional_reads(modules: Iterator[tuple[str, ast.Module]]) -> list[str]:
    """Envelopes read by position: ``msg.envelope[i]``, ``a, b = msg.envelope``, and the same
    of an envelope held as ``envelope`` (one a relay passes on). Only the modules that make
    messages and the envelope classes read them so."""
    found = []
    for module, tree in modules:
        if module.rpartition(".")[2] in ("codec", "protocol", "envelopes"):
            continue
        for node in ast.walk(tree):
            value = None
            unpack = isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)
            if unpack or isinstance(node, ast.Subscript):
                value = node.value  # type: ignore[attr-defined]
            named = isinstance(value, ast.Name) and value.id == "envelope"
            if named or (isinstance(value, ast.Attribute) and value.attr == "envelope"):
                found.append(f"{module}:{node.lineno}")
    return found


def test_handlers_read_envelopes_by_field_name() -> None:
    assert positional_reads(_modules()) == []


def test_the_envelope_checks_catch_a_deliberate_violation() -> None:
    bad = ast.parse(
        "def on_call(msg):\n"
        "    _, key, endpoint, shape, reply = msg.envelope\n"
        "    index = msg.envelope[3]\n"
        "    call = CallEnvelope.of(msg)\n"
        "def on_relay(envelope):\n"
        "    kind = envelope[0]\n"
        "    key = CallEnvelope.read(envelope).key\n"
    )
    assert positional_reads(iter([("bad", bad)])) == ["bad:2", "bad:3", "bad:6"]
    table = list(protocol._TABLE)
    try:  # a field added to the table, and envelopes.py not written again
        protocol._TABLE[0] = protocol._TABLE[0]._replace(fields=("port_id", "index", "new"))
        written = (PACKAGE / "runtime" / "messaging" / "envelopes.py").read_text()
        assert written != envelopes_source(protocol._TABLE, protocol.class_name)
    finally:
        protocol._TABLE[:] = table
