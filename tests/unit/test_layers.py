"""The package is layered: every import points down (or sideways within a layer), never up, and
the modules form no cycle. Imports of every form count, function-level ones and those in
``if TYPE_CHECKING:`` blocks included: an import for types only still says that one module
knows the other (and a cycle of them is a knot a reader has to untie)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import NamedTuple

from import_scan import PACKAGE, imports_in, package_sources

# Bottom first. A module belongs to the longest prefix listed; it may import its own layer and
# any layer before it.
LAYERS = [
    ("actormesh.cell_names",),  # imports nothing of actormesh: errors render with it
    ("actormesh.errors", "actormesh.config"),
    (
        "actormesh.runtime.extent",
        "actormesh.runtime.strides",
        "actormesh.runtime.shape",
        "actormesh.runtime.mesh_shape",
    ),
    ("actormesh.runtime.faults",),
    ("actormesh.runtime.messaging",),
    ("actormesh.runtime.actors",),
    ("actormesh.runtime.meshes",),
    ("actormesh.runtime.procs",),
    ("actormesh.runtime.dataplane", "actormesh.runtime"),
    ("actormesh.hosts",),
    # The tensor layer: what both halves share, then the ranks' half, then the controller's
    # (which spawns the ranks' engine), then the package's face and its tools for the kernel.
    ("actormesh.tensor.compat",),
    ("actormesh.tensor.wire",),
    ("actormesh.tensor.worker",),
    ("actormesh.tensor.controller",),
    ("actormesh.tensor",),
    ("actormesh.kernel",),
    ("actormesh.debugger",),  # builds on the kernel: the kernel never imports it
    ("actormesh",),  # the public namespace and the command line
]


# Deliberate exceptions, each with its reason: the public namespace handed to user code.
ALLOWED_UPWARD = {
    ("actormesh.kernel.executor", "actormesh"): "a %%mesh cell's namespace has the API as `am`",
    ("actormesh.kernel.kernel", "actormesh"): "the kernel reports actormesh's __version__",
}

# Imports for types only (``if TYPE_CHECKING:``) that may point up or close a cycle, each with
# its reason; the test checks that they stay type-only.
ALLOWED_TYPE_ONLY = {
    ("actormesh.runtime.meshes.proc_mesh", "actormesh.runtime.procs"): (
        "ProcMesh.host_mesh and heal(hosts) have the HostMesh type users hold; a proc mesh "
        "never calls its host mesh"
    ),
    ("actormesh.runtime.procs.mesh_record", "actormesh.runtime.procs.host_mesh"): (
        "the HostMesh a record keeps for ProcMesh.host_mesh, and never calls"
    ),
    ("actormesh.runtime.meshes.tensor_seam", "actormesh.runtime.meshes.proc_mesh"): (
        "the tensor layer's TensorLayer methods take the ProcMesh that calls them"
    ),
}


def layer_of(module: str) -> int:
    best, best_len = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best >= 0, f"{module} is in no layer: add it to LAYERS"
    return best


def is_module(name: str) -> bool:
    rel = pathlib.Path(*name.split("."))
    base = PACKAGE.parent / rel
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


class Edge(NamedTuple):
    target: str  # the imported actormesh module
    line: int
    type_only: bool  # in an ``if TYPE_CHECKING:`` block


def imports_of(source: str, module: str, is_package: bool) -> Iterator[Edge]:
    """An ``Edge`` for every import of an actormesh module in ``source``."""
    for imp in imports_in(source, module, is_package):
        sub = f"{imp.target}.{imp.name}"
        target = sub if imp.name is not None and is_module(sub) else imp.target
        yield Edge(target, imp.line, imp.type_only)


Graph = dict[str, list[Edge]]


def import_graph(root: pathlib.Path = PACKAGE) -> Graph:
    graph: Graph = {}
    for name, source, is_package in package_sources(root):
        graph[name] = list(imports_of(source, name, is_package))
    return graph


def _allowed(module: str, edge: Edge) -> bool:
    return (module, edge.target) in ALLOWED_UPWARD or (
        edge.type_only and (module, edge.target) in ALLOWED_TYPE_ONLY
    )


def upward_imports(graph: Graph) -> list[str]:
    found = []
    for module, edges in graph.items():
        for target, line, type_only in edges:
            if layer_of(target) > layer_of(module) and not _allowed(
                module, Edge(target, line, type_only)
            ):
                what = "for types, " if type_only else ""
                found.append(f"{module}:{line} imports {target}, {what}a higher layer")
    return found


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm); the
    allowed type-only imports do not count."""
    edges = {
        m: sorted(
            {
                e.target
                for e in es
                if e.target in graph
                and e.target != m
                and not (e.type_only and (m, e.target) in ALLOWED_TYPE_ONLY)
            }
        )
        for m, es in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def _is_ancestor(package: str, module: str) -> bool:
    return module.startswith(package + ".")


def test_no_import_points_up() -> None:
    assert upward_imports(import_graph()) == []


def test_no_import_cycles() -> None:
    graph = import_graph()
    # A package's __init__ re-exporting its own modules is not a cycle of the architecture.
    graph = {m: [e for e in es if not _is_ancestor(e.target, m)] for m, es in graph.items()}
    assert cycles(graph) == []


def test_the_allowed_type_only_imports_are_for_types_only() -> None:
    graph = import_graph()
    for (module, target), reason in ALLOWED_TYPE_ONLY.items():
        found = [e for e in graph[module] if e.target == target]
        assert found, f"{module} no longer imports {target}: drop it from ALLOWED_TYPE_ONLY"
        for edge in found:
            assert edge.type_only, f"{module}:{edge.line} imports {target} to run ({reason})"


def test_runtime_and_hosts_never_import_kernel_debugger_or_tensor() -> None:
    for module, edges in import_graph().items():
        if module.startswith(("actormesh.runtime", "actormesh.hosts")):
            for target, line, _ in edges:
                assert not target.startswith(
                    ("actormesh.kernel", "actormesh.debugger", "actormesh.tensor")
                ), f"{module}:{line} imports {target}"


def test_the_ranks_half_of_the_tensor_layer_never_imports_the_controllers() -> None:
    for module, edges in import_graph().items():
        if module.startswith(("actormesh.tensor.worker", "actormesh.tensor.wire")):
            for target, line, _ in edges:
                assert not target.startswith("actormesh.tensor.controller"), (
                    f"{module}:{line} imports {target}"
                )


def test_the_checker_sees_every_import_form() -> None:
    source = (
        "import actormesh.kernel\n"
        "from .. import kernel\n"
        "from ..kernel import cells\n"
        "def f():\n"
        "    from ..debugger import magics\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ..kernel import selection\n"
    )
    found = sorted(imports_of(source, "actormesh.hosts.listener", False))
    assert found == [
        ("actormesh.debugger.magics", 5, False),
        ("actormesh.kernel", 1, False),
        ("actormesh.kernel", 2, False),
        ("actormesh.kernel.cells", 3, False),
        ("actormesh.kernel.selection", 8, True),
    ]


def test_an_upward_import_and_a_cycle_are_found() -> None:
    graph = {
        "actormesh.runtime.messaging.node": [Edge("actormesh.runtime.procs.controller", 3, False)],
        "actormesh.runtime.procs.controller": [Edge("actormesh.runtime.procs.worker", 5, False)],
        "actormesh.runtime.procs.worker": [Edge("actormesh.runtime.procs.controller", 7, True)],
        "actormesh.runtime.faults.stacks": [Edge("actormesh.runtime.actors.runner", 9, True)],
    }
    assert upward_imports(graph) == [
        "actormesh.runtime.messaging.node:3 imports actormesh.runtime.procs.controller, "
        "a higher layer",
        "actormesh.runtime.faults.stacks:9 imports actormesh.runtime.actors.runner, for types, "
        "a higher layer",
    ]
    assert cycles(graph) == [
        ["actormesh.runtime.procs.controller", "actormesh.runtime.procs.worker"]
    ]
