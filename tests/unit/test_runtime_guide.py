"""The guide in ``actormesh/runtime/__init__.py`` stays true: its table lists every module of the
runtime, and every name, file and envelope it cites exists as it says (a rename that forgets
the guide fails here)."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re
import types
from collections.abc import Iterator

import actormesh.runtime
from actormesh.runtime.messaging.protocol import KINDS

RUNTIME = pathlib.Path(actormesh.runtime.__file__).parent
REPO = RUNTIME.parent.parent
GUIDE = ast.get_docstring(ast.parse((RUNTIME / "__init__.py").read_text())) or ""

# Cited words that are not names of the runtime: arguments and example names in the guide.
NOT_NAMES = {"c", "fn", "hook", "i", "rank", "step", "None", "SLF001", "TYPE_CHECKING"}
NOT_NAMES |= {
    "__cleanup__",
    "__init__",
    "__main__",
    "mesh.step.call(x).get()",
    "poll()",
    "python -m",
}
NOT_NAMES |= {"python -m actormesh run", "(mesh_id, rank)"}


def runtime_modules() -> dict[str, types.ModuleType]:
    """Every module of the runtime by its last name (``codec``, ``relay``, ``stacks``...)."""
    found = {}
    for path in sorted(RUNTIME.rglob("*.py")):
        if path.name == "__init__.py" or path.stem == "__main__":
            continue
        name = ".".join(path.relative_to(RUNTIME.parent.parent).with_suffix("").parts)
        found[path.stem] = importlib.import_module(name)
    return found


def cited(text: str) -> Iterator[str]:
    for token in re.findall(r"``(.+?)``", text, re.S):
        yield " ".join(token.split())


def resolves(token: str, modules: dict[str, types.ModuleType]) -> bool:
    """Whether a cited ``Name.attr`` (call arguments aside) names something that exists: its
    first part a runtime module, a name defined in one, or an actormesh module."""
    dotted = re.sub(r"\(.*\)$", "", token).lstrip("@")
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", dotted):
        return False
    first, *rest = dotted.split(".")
    starts: list[object] = []
    if first in modules:
        starts.append(modules[first])
    starts += [vars(m)[first] for m in modules.values() if first in vars(m)]
    if first == "actormesh":
        try:
            starts.append(importlib.import_module(dotted))
            rest = []
        except ImportError:
            pass
    for start in starts:
        target = start
        for part in rest:
            target = getattr(target, part, None)
            if target is None:
                break
        else:
            return True
    return False


def envelope_problem(token: str) -> str | None:
    """An envelope ``(KIND, field, ...[, optional])`` that the protocol table does not have."""
    kind_name, *fields = [f.strip(" []") for f in token.strip("()").split(",")]
    kind = KINDS.get(getattr(actormesh.runtime.messaging.protocol, kind_name, ""))
    if kind is None:
        return f"{token}: no message kind {kind_name}"
    optional = "[" in token and token.index("[") < len(token)
    wanted = [f.rstrip("?") for f in kind.fields]
    if fields != wanted[: len(fields)] or (len(fields) < len(wanted) and not optional):
        return f"{token}: {kind_name} has the fields {kind.fields}"
    return None


def problems(text: str) -> list[str]:
    modules = runtime_modules()
    found = []
    for token in cited(text):
        if token in NOT_NAMES or re.sub(r"\(.*\)$", "", token) in NOT_NAMES:
            continue
        if re.fullmatch(r"\([A-Z_]+,.*\)", token):
            problem = envelope_problem(token)
            if problem:
                found.append(problem)
        elif token.endswith((".py", "/")):
            if not ((RUNTIME / token).exists() or (REPO / token).exists()):
                found.append(f"{token}: no such file")
        elif not resolves(token, modules):
            found.append(f"{token}: names nothing in the runtime")
    return found


def table_rows(text: str) -> dict[str, str]:
    """The layer table: the text of each row, by its first column (``faults/``, ``shape.py``)."""
    lines = text.splitlines()
    borders = [i for i, line in enumerate(lines) if re.fullmatch(r"====  =+  =+", line)]
    header = lines[borders[0]]
    second, third = (m.start() for m in re.finditer(r"(?<= )=", header))
    rows: dict[str, str] = {}
    key = ""
    for line in lines[borders[0] + 1 : borders[1]]:
        name = line[second:third].strip()
        if name:
            key = name.strip("`")
            rows[key] = ""
        rows[key] += " " + line[third:]
    return rows


def test_every_name_file_and_envelope_the_guide_cites_exists() -> None:
    assert problems(GUIDE) == []


def test_the_table_lists_every_module_of_the_runtime() -> None:
    rows = table_rows(GUIDE)
    top = {p.name for p in RUNTIME.glob("*.py") if p.name != "__init__.py"}
    assert top == {name for name in rows if name.endswith(".py")}
    for folder in sorted(p for p in RUNTIME.iterdir() if (p / "__init__.py").exists()):
        listed = {token.split(".")[0] for token in cited(rows.get(f"{folder.name}/", ""))}
        modules = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
        assert modules - listed == set(), f"{folder.name}/ has modules the table leaves out"


def test_the_checks_catch_a_deliberate_violation() -> None:
    text = (
        "``Endpoint.call`` and ``Endpoint.no_such_method``, ``meshes/nowhere.py``, "
        "``(CALL, key, endpoint, shape, reply)``, ``(REPLY, port_id, status)``, "
        "``(REPLY, port_id, index, status[, after])``, ``codec.Signer.frames``"
    )
    assert problems(text) == [
        "Endpoint.no_such_method: names nothing in the runtime",
        "meshes/nowhere.py: no such file",
        "(REPLY, port_id, status): REPLY has the fields ('port_id', 'index', 'status', 'after?', "
        "'datagrams?')",
    ]
    rows = table_rows(GUIDE)
    assert "codec" in set(cited(rows["messaging/"]))
