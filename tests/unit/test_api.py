"""The public API is a deliberate list, and dependencies point one way."""

from __future__ import annotations

import ast
import pathlib

import actormesh

PUBLIC = [
    "Accumulator", "Actor", "ActorError", "ActorMesh", "Channel", "Extent", "Future", "HostMesh",
    "MeshClosedError", "MeshError", "MeshTimeoutError", "MeshUsageError", "Point", "Port",
    "PortReceiver", "ProcMesh", "SupervisionError", "TensorBuffer", "ValueMesh", "context",
    "current_rank", "current_size", "endpoint", "this_host", "this_proc", "MeshFailure",
    "current_actor_name", "unhandled_fault_hook", "Context", "Endpoint", "send",
    "SlurmJob", "listen_for_hosts", "wait_for_hosts", "log_metrics",
    "init_process_group", "destroy_process_group",
    "MeshTensor", "call_on_shard_and_fetch", "distribute", "fetch", "inspect", "module_to_mesh",
    "no_mesh", "remote", "grad_generator", "show", "to_mesh",
    "Stream", "get_active_stream",
    "concurrent_endpoint", "get_or_spawn_controller", "as_endpoint", "shutdown_context",
    "ActorSupervisionError",
    "checkpoint", "FaultTolerant",
]  # fmt: skip


def test_public_names_are_the_checked_in_list() -> None:
    assert sorted(actormesh.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(actormesh, name) is not None


def test_runtime_never_imports_kernel_or_debugger() -> None:
    root = pathlib.Path(actormesh.__file__).parent / "runtime"
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(("kernel", "debugger")), path
                assert "actormesh.kernel" not in node.module, path
                assert "actormesh.debugger" not in node.module, path


def test_runtime_objects_are_not_built_directly() -> None:
    import pytest

    for cls in (actormesh.ActorMesh, actormesh.ProcMesh, actormesh.HostMesh, actormesh.ValueMesh):
        with pytest.raises(TypeError):
            cls()


def test_process_groups_are_public_and_the_documented_ones() -> None:
    from actormesh.runtime.dataplane import distributed

    assert actormesh.init_process_group is distributed.init_process_group
    assert actormesh.destroy_process_group is distributed.destroy_process_group


def _mesh(endpoints: frozenset[str]) -> actormesh.ActorMesh[object]:
    from actormesh.runtime.meshes.proc_table import ProcTable
    from actormesh.runtime.shape import Shape

    shape = Shape.from_extent({"gpus": 2})
    table = ProcTable("unit-mesh", [], [])  # no processes: nothing here sends
    return actormesh.ActorMesh._create(table, shape, "k", "counter", "Counter", endpoints, None)


def test_an_unknown_attribute_is_an_attribute_error_that_lists_the_endpoints() -> None:
    import copy

    import pytest

    mesh = _mesh(frozenset({"incr", "get"}))
    assert not hasattr(mesh, "name")
    assert getattr(mesh, "name", 42) == 42
    with pytest.raises(AttributeError) as info:
        mesh.incrr  # noqa: B018
    assert isinstance(info.value, actormesh.MeshError)  # still what actormesh raises on purpose
    assert "Counter has no endpoint 'incrr'; its endpoints are: get, incr" in str(info.value)
    assert hasattr(mesh, "incr")
    assert copy.copy(mesh)._name == "counter"


def _imports(path: pathlib.Path) -> list[tuple[str, int]]:
    """(module, relative level) of every import in a file, function-level ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, 0) for alias in node.names)
    return found


def test_tensor_reaches_the_runtime_through_compat_only() -> None:
    # (test_layers checks that the runtime never imports the tensor layer.) One module names
    # runtime internals, so a move in the runtime changes one file of the tensor layer.
    root = pathlib.Path(actormesh.__file__).parent
    for path in (root / "tensor").rglob("*.py"):
        if path.name == "compat.py":
            continue
        for module, level in _imports(path):
            assert "runtime" not in module.split("."), (path, module, level)
