"""Write actormesh/runtime/messaging/envelopes.py from the table in protocol.py: run it after a
change to the table (tests/unit/test_protocol.py fails until envelopes.py is what it writes).

    python scripts/write_envelopes.py

It loads protocol.py alone, not the package, so it works while envelopes.py is stale; the text
it writes is ``envelopes_source``'s.
"""

from __future__ import annotations

import importlib.util
import pathlib
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

PROTOCOL = (
    pathlib.Path(__file__).resolve().parent.parent / "actormesh/runtime/messaging/protocol.py"
)


def load_protocol() -> Any:
    """protocol.py as a module of its own (it imports nothing of the package)."""
    spec = importlib.util.spec_from_file_location("protocol", PROTOCOL)
    assert spec is not None and spec.loader is not None
    protocol = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(protocol)
    return protocol


def envelopes_source(kinds: Iterable[Any], class_name: Callable[[Any], str]) -> str:
    """The text of envelopes.py, from the table's ``kinds`` (``protocol.KINDS.values()``) and
    ``protocol.class_name``."""
    kinds = list(kinds)
    out = [
        '"""Every message kind\'s envelope by field name, generated from the table in',
        "``protocol.py`` by ``scripts/write_envelopes.py``: do not edit.",
        "",
        "A handler reads ``CallEnvelope.of(msg).endpoint``, not ``msg.envelope[2]``; ``read`` does",
        "the same for an envelope that is not (yet) a message (one a relay passes on): the",
        "envelope's fields as the kind's ``NamedTuple``, optional trailing fields that it leaves",
        'out as ``None``."""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import TYPE_CHECKING, Any, NamedTuple",
        "",
        "if TYPE_CHECKING:",
        "    from .codec import Message",
        "",
        "_new = tuple.__new__",
        "_PADS = ((), (None,), (None, None), (None, None, None))  # for missing optional fields",
    ]
    for kind in kinds:
        out += _envelope_class(kind, class_name(kind))
    to_port = [k.name for k in kinds if k.fields[:1] == ("port_id",)]
    out += [
        "",
        "",
        "def kind_of(envelope: tuple[Any, ...]) -> str:",
        '    """The kind of an envelope that is not (yet) a message (one a relay passes on): its',
        '    first field, in every kind (a message has it as ``Message.kind``)."""',
        "    return envelope[0]  # type: ignore[no-any-return]",
        "",
        "",
        "def port_id_of(msg: Message) -> Any:",
        '    """The port a message goes to (Node.to_port): the first field of '
        + ", ".join(to_port)
        + '."""',
        "    return msg.envelope[1]",
    ]
    return "\n".join(out) + "\n"


def _envelope_class(kind: Any, name: str) -> list[str]:
    """The lines of one kind's NamedTuple, with ``of`` (a message) and ``read`` (an envelope)."""
    out: list[str] = []
    fields = [f.rstrip("?") for f in kind.fields]
    optional = sum(f.endswith("?") for f in kind.fields)
    size = len(fields) + 1
    doc = textwrap.wrap(f"{kind.name!r}: {kind.doc}", 91)
    out += ["", "", f"class {name}(NamedTuple):", f'    """{doc[0]}']
    out += [f"    {line}" for line in doc[1:]]
    out[-1] += '"""'
    out += ["", "    kind: str"]
    out += [f"    {f}: Any" for f in fields[: len(fields) - optional]]
    out += [f"    {f}: Any = None" for f in fields[len(fields) - optional :]]
    for method, arg, env in (("of", "msg: Message", "msg.envelope"),
                             ("read", "envelope: tuple[Any, ...]", "envelope")):  # fmt: skip
        out += ["", "    @classmethod", f"    def {method}(cls, {arg}) -> {name}:"]
        if optional:
            out += [
                f"        env = {env}",
                f"        if len(env) < {size}:",
                f"            env += _PADS[{size} - len(env)]",
                "        return _new(cls, env)",
            ]
        else:
            out += [f"        return _new(cls, {env})"]
    return out


if __name__ == "__main__":
    protocol = load_protocol()
    text = envelopes_source(protocol.KINDS.values(), protocol.class_name)
    PROTOCOL.with_name("envelopes.py").write_text(text)
    print(f"wrote {PROTOCOL.with_name('envelopes.py')}")
