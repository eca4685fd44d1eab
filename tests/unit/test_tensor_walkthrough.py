"""The tensor layer's own docs (``actormesh/tensor/__init__.py``) stay true: its module table
lists every module of the package, and every module and name its walk-through of ``dt @ dt.T``
then ``.item()`` cites exists."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re
from typing import Any

import actormesh

PACKAGE = pathlib.Path(actormesh.__file__).parent
TENSOR = PACKAGE / "tensor"
DOC = (TENSOR / "__init__.py").read_text().split('"""')[1]
# Cited code that is the example's own, not the package's.
EXAMPLE = {"dt.T"}


def cited() -> list[str]:
    return re.findall(r"``([^`]+)``", DOC)


def _path(text: str) -> pathlib.Path | None:
    for base in (TENSOR, PACKAGE, PACKAGE.parent):
        if (base / text).is_file():
            return base / text
    return None


def _candidates(root: str) -> list[Any]:
    """Modules of actormesh.tensor and actormesh.runtime named ``root``, and the classes of that
    name they define; ``torch`` itself."""
    found: list[Any] = []
    if root == "torch":
        found.append(importlib.import_module("torch"))
    for base in (TENSOR, PACKAGE / "runtime"):
        for path in base.rglob("*.py"):
            name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
            if path.stem == root:
                found.append(importlib.import_module(name))
            elif re.search(rf"^class {re.escape(root)}\b", path.read_text(), re.M):
                found.append(getattr(importlib.import_module(name), root))
    return found


def _attribute(obj: Any, name: str) -> Any:
    """``obj.name``; for a class, an attribute its methods (or its bases') set on instances
    counts too."""
    try:
        return getattr(obj, name)
    except AttributeError:
        for cls in obj.__mro__[:-1] if isinstance(obj, type) else ():
            if re.search(rf"self\.{name}\b[^=\n]*=", inspect.getsource(cls)):
                return None
        raise


def _resolves(dotted: str) -> bool:
    root, *rest = dotted.split(".")
    for obj in _candidates(root):
        try:
            for part in rest:
                obj = _attribute(obj, part)
        except AttributeError:
            continue
        return True
    return False


def test_every_module_and_name_the_walk_through_cites_exists() -> None:
    paths = [c for c in cited() if c.endswith(".py")]
    names = [
        c
        for c in cited()
        if re.fullmatch(r"[A-Za-z_]\w*(\.\w+)+", c) and c not in EXAMPLE and c not in paths
    ]
    assert [p for p in paths if _path(p) is None] == []
    assert [n for n in names if not _resolves(n)] == []
    assert len(names) > 30  # the walk-through names its hops, not only modules


def test_every_hop_names_its_module() -> None:
    walk = DOC.split("The life of an op")[1]
    hops = re.split(r"\n(?=\d\. )", walk)[1:]
    assert len(hops) == 6
    for hop in hops:
        assert any(c.endswith(".py") for c in re.findall(r"``([^`]+)``", hop)), hop


def test_the_module_table_lists_every_module_of_the_package() -> None:
    listed = {c for c in cited() if c.endswith(".py")}
    modules = {str(p.relative_to(TENSOR)) for p in TENSOR.rglob("*.py") if p.name != "__init__.py"}
    assert modules - listed == set()


def test_a_wrong_citation_is_caught() -> None:
    assert _resolves("recording.dispatch") and _resolves("MeshTensor.__torch_dispatch__")
    assert not _resolves("recording.dispatch_op") and not _resolves("Stream.send_batch")
    assert _resolves("_TensorEngine.env") and not _resolves("_TensorEngine.environment")
    assert _resolves("EngineState.env") and _resolves("_TensorEngine.mesh")
    assert _path("worker/aten.py") and _path("worker/handlers.py")
    assert _path("worker/registry.py") is None
