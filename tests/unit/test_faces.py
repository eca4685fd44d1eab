"""Each sub-package of the runtime has a face, its ``__init__.py``: what other layers may use,
listed in ``__all__``. Code outside a sub-package imports those names from the face and never
reaches into its modules; the rest of the sub-package is its own business."""

from __future__ import annotations

import importlib
import subprocess
import sys

from import_scan import PACKAGE, Import, imports_in, package_sources

FACES = tuple(
    f"actormesh.runtime.{name}"
    for name in ("faults", "messaging", "actors", "meshes", "procs", "dataplane")
)

# Modules a face declares public as a whole, each with its reason.
PUBLIC_MODULES = {
    "actormesh.runtime.messaging.protocol": "the table of message kinds: every layer that "
    "sends or handles a message names its kind",
    "actormesh.runtime.messaging.envelopes": "each kind's envelope by field name, generated from "
    "the protocol table: read wherever a kind is handled",
    "actormesh.runtime.meshes.tensor_seam": "the seam the tensor layer above fills, as a whole",
}


def runs_as_main(module: str) -> bool:
    """A module run with ``python -m`` (it has an ``if __name__ == "__main__":`` block)."""
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    return path.exists() and '__name__ == "__main__"' in path.read_text()


def face_of(target: str) -> str | None:
    for face in FACES:
        if target == face or target.startswith(face + "."):
            return face
    return None


def exported(face: str) -> set[str]:
    return set(importlib.import_module(face).__all__)


def violations(imports: list[Import]) -> list[str]:
    """Imports that reach past a face: a module of another sub-package, or a name its face
    does not export."""
    found = []
    for imp in imports:
        face = face_of(imp.target) or face_of(f"{imp.target}.{imp.name}")
        if face is None or face_of(imp.module) == face:
            continue  # not the runtime's sub-packages, or inside the sub-package itself
        where = f"{imp.module}:{imp.line}"
        if imp.target == face and imp.name is not None:
            if imp.name not in exported(face):
                found.append(f"{where} imports {imp.name} from {face}, which does not export it")
            continue
        deep = imp.target if imp.target != face else f"{face}.{imp.name}"
        if deep in PUBLIC_MODULES or runs_as_main(deep):
            continue
        found.append(f"{where} reaches into {deep}: import from the face {face}")
    return found


def all_imports() -> list[Import]:
    found: list[Import] = []
    for name, source, is_package in package_sources():
        found += imports_in(source, name, is_package)
    return found


def test_code_outside_a_sub_package_imports_only_its_face() -> None:
    assert violations(all_imports()) == []


def test_every_face_exports_what_it_lists_and_hides_no_module() -> None:
    for face in FACES:
        package = importlib.import_module(face)
        assert package.__doc__, f"{face} says what it is for"
        folder = PACKAGE.parent / face.replace(".", "/")
        modules = {p.stem for p in folder.glob("*.py")}
        for name in package.__all__:
            assert hasattr(package, name), f"{face} lists {name} but has no such name"
            # A name that is also a module's would hide the module: `from face import name`
            # and `import face.name` would give different things.
            assert name not in modules, f"{face} exports {name}, the name of its module"


def test_a_face_never_imports_a_module_that_runs_as_main() -> None:
    """Not even through its other modules: ``python -m`` of a module its package imported
    already warns (runpy's "found in sys.modules after import of package")."""
    mains = [
        f"{face}.{path.stem}"
        for face in FACES
        for path in (PACKAGE.parent / face.replace(".", "/")).glob("*.py")
        if runs_as_main(f"{face}.{path.stem}")
    ]
    assert mains, "the check would see no module that runs as python -m"
    script = (
        "import sys\n"
        + "".join(f"import {face}\n" for face in FACES)
        + f"print([m for m in {mains!r} if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", f"importing the faces imports {out.stdout.strip()}"


def test_the_check_catches_a_deliberate_violation() -> None:
    source = (
        "from ..runtime.messaging.codec import dumps\n"  # a module of messaging
        "from ..runtime.messaging import codec\n"  # the same, through the package
        "from ..runtime.messaging import dumps, Node\n"  # the face: fine
        "from ..runtime.messaging import _no_such_name\n"  # not exported
        "from ..runtime.messaging.protocol import CALL\n"  # a public module: fine
        "from ..runtime.procs.worker import run\n"  # runs as python -m: fine
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import actormesh.runtime.actors.runner\n"  # types count too
    )
    found = violations(list(imports_in(source, "actormesh.kernel.cells", False)))
    assert found == [
        "actormesh.kernel.cells:1 reaches into actormesh.runtime.messaging.codec: import "
        "from the face actormesh.runtime.messaging",
        "actormesh.kernel.cells:2 imports codec from actormesh.runtime.messaging, which does "
        "not export it",
        "actormesh.kernel.cells:4 imports _no_such_name from actormesh.runtime.messaging, "
        "which does not export it",
        "actormesh.kernel.cells:9 reaches into actormesh.runtime.actors.runner: import from "
        "the face actormesh.runtime.actors",
    ]
    inside = "from .codec import dumps\nfrom ..faults.stacks import stopped\n"
    found = violations(list(imports_in(inside, "actormesh.runtime.messaging.node", False)))
    assert found == [  # its own modules are the sub-package's business; another's are not
        "actormesh.runtime.messaging.node:2 reaches into actormesh.runtime.faults.stacks: "
        "import from the face actormesh.runtime.faults"
    ]
