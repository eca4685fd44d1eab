"""torchvision's resnet18 (BatchNorm, train() and eval()) on a mesh, in every mode, equal to one
process (float64): resnet18_differential.py, run in .venv-torchvision, where torchvision imports
(scripts/setup-torchvision-venv.sh says why it is a venv of its own; scripts/test.sh makes it).
Without that venv the test skips, saying how to make it, unless ACTORMESH_TORCHVISION_TESTS=1
(scripts/test.sh sets it), which makes a missing venv a failure."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-torchvision" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_resnet18_trains_as_in_one_process_in_every_mode() -> None:
    if not PYTHON.exists():
        if os.environ.get("ACTORMESH_TORCHVISION_TESTS") == "1":
            pytest.fail(f"{PYTHON} is missing: run bash scripts/setup-torchvision-venv.sh")
        pytest.skip("no .venv-torchvision: bash scripts/setup-torchvision-venv.sh makes it")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "tensor"), str(ROOT)]))
    result = subprocess.run(
        [str(PYTHON), str(ROOT / "tests" / "tensor" / "resnet18_differential.py")],
        capture_output=True, text=True, timeout=850, env=env, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    for mode in ("default", "fsdp", "tp_plan", "fsdp+tp_plan", "eval"):
        assert f"resnet18 {mode}: equal to one process" in result.stdout
