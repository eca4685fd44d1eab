"""What a new user gets: the wheel, built once, in a fresh venv of its own (no system site
packages, so a missing dependency shows), driven from another environment's Jupyter (this
test's). ``pip install torch==2.13.0`` first, as the README says; pip's cache is reused.

The wheel is built the way pip builds it for ``pip install .`` (PEP 517, isolated build
environment), reusing the sidebar that ``scripts/test.sh`` already built into
``actormesh/labextension`` (hatch-jupyter-builder's ``skip-if-exists``): building the sidebar
again with node would take minutes and is checked by that build and by tests/ui.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("jupyter_client")

from jupyter_client.manager import start_new_kernel
from kernel_support import Kernel, spawn_code
from support import wait_until

ROOT = Path(__file__).resolve().parents[2]
SIDEBAR = ROOT / "actormesh" / "labextension" / "static" / "style.js"

# Building and installing take minutes on a loaded machine (setup counts towards the timeout).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _run(cmd: list[str], timeout: float, **kw: object) -> str:
    # Not from the checkout: "python -c" would import its actormesh, not the installed one.
    kw.setdefault("cwd", "/")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return str(out.stdout)


def _clean_env(**extra: str) -> dict[str, str]:
    # Nothing of this checkout or this environment may reach the fresh one.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop("JUPYTER_PATH", None)
    return {**env, **extra}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with torch, then the wheel of this checkout (and its dependencies)."""
    if not SIDEBAR.exists():
        if os.environ.get("ACTORMESH_UI_TESTS") == "1":  # CI: scripts/test.sh built it
            pytest.fail(f"the sidebar was not built ({SIDEBAR} is missing)")
        pytest.skip("the sidebar is not built (pip install -e . with node builds it)")
    tmp = tmp_path_factory.mktemp("install")
    env = _clean_env()
    took: dict[str, float] = {}
    start = time.monotonic()
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", str(ROOT), "-w", str(tmp)], 300, env=env
    )
    (wheel,) = tmp.glob("actormesh-*.whl")
    took["wheel"] = time.monotonic() - start
    root = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(root)], 120, env=env)
    # --no-compile: byte-compiling torch's thousands of modules is CPU time that checks nothing
    # here (what the kernel imports compiles as it is imported).
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile"]
    start = time.monotonic()
    _run([*pip, "torch==2.13.0"], 300, env=env)
    took["torch"] = time.monotonic() - start
    start = time.monotonic()
    _run([*pip, str(wheel)], 300, env=env)
    took["wheel install"] = time.monotonic() - start
    print("install times:", ", ".join(f"{k} {v:.0f} s" for k, v in took.items()))
    return root


def test_the_wheel_gives_a_kernel_jupyter_finds(venv: Path) -> None:
    python = str(venv / "bin" / "python")
    # No system site packages: only what the wheel asked for is there.
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    listing = _run([str(venv / "bin" / "jupyter"), "kernelspec", "list"], 60, env=_clean_env())
    shipped = venv / "share" / "jupyter" / "kernels" / "actormesh"
    assert ["actormesh", str(shipped)] in [line.split() for line in listing.splitlines()], listing
    assert {p.name for p in shipped.iterdir()} == {
        "kernel.json",
        "logo-32x32.png",
        "logo-64x64.png",
    }
    sidebar = venv / "share" / "jupyter" / "labextensions" / "actormesh" / "package.json"
    assert json.loads(sidebar.read_text())["name"]
    where = _run(
        [python, "-c", "import actormesh; print(actormesh.__file__)"], 60, env=_clean_env()
    )
    assert where.startswith(str(venv)), where


@pytest.fixture
def kernel_elsewhere(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    """The kernel of the fresh venv, registered from there, started by this environment's
    jupyter_client: a Jupyter in another environment."""
    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    python = str(venv / "bin" / "python")
    _run(
        [python, "-m", "actormesh", "install-kernel", "--prefix", str(prefix)], 60, env=_clean_env()
    )
    spec_dir = prefix / "share" / "jupyter" / "kernels" / "actormesh"
    assert json.loads((spec_dir / "kernel.json").read_text())["argv"][0] == python
    mp = pytest.MonkeyPatch()
    for name, value in _clean_env(JUPYTER_PATH=str(prefix / "share" / "jupyter")).items():
        mp.setenv(name, value)
    for name in ("PYTHONPATH", "VIRTUAL_ENV"):
        mp.delenv(name, raising=False)
    mp.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    try:
        km, kc = start_new_kernel(kernel_name="actormesh", startup_timeout=60, cwd=str(prefix))
        k = Kernel(km, kc)
        try:
            yield k
        finally:
            k.shutdown()
    finally:
        mp.undo()


def test_mesh_cells_and_a_breakpoint_in_a_kernel_started_from_another_environment(
    venv: Path, kernel_elsewhere: Kernel
) -> None:
    k = kernel_elsewhere
    k.ok("import sys, actormesh")
    assert k.ok("sys.executable").value == repr(str(venv / "bin" / "python"))
    assert k.ok("actormesh.__file__").value == repr(actormesh_file(venv))
    k.ok(spawn_code(4))
    r = k.ok("%%mesh procs\nprint('hello')\nrank * 10")
    assert "[gpus=0-3] hello" in r.stream(), r.stream()
    assert r.value == "ValueMesh({gpus=0: 0, gpus=1: 10, gpus=2: 20, gpus=3: 30})"
    r = k.ok("%%mesh procs\nx = rank + 1\nif rank == 2:\n    breakpoint()\nprint('done', rank)")
    assert "rank 2 {gpus=2} paused at" in r.stream(), r.stream()
    assert any("application/vnd.jupyter.widget-view+json" in d for d in r.displays())  # its widget
    table = "__import__('actormesh').kernel.debugger_seam.installed().widget.table.value"
    wait_until(lambda: "paused at" in str(k.ok(table).value), 10, "the widget to show rank 2")
    assert k.ok("%mesh dbg eval -r 2 x").value == "ValueMesh({gpus=2: 3})"
    k.ok("%mesh dbg continue\n_mesh.get(timeout=60)")
    k.ok("procs.stop().get(timeout=30)")


def actormesh_file(venv: Path) -> str:
    (path,) = (venv / "lib").glob("python3*/site-packages/actormesh/__init__.py")
    return str(path)
