"""The examples in examples/ are documentation that runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[2] / "examples"


# ddp.py runs in tests/runtime/test_distributed.py (its main(), in the test's process, checked
# against one process): a second run here, in an interpreter of its own, took 50-100 s.
@pytest.mark.parametrize("name", ["quickstart.py", "heal_training.py", "param_server.py"])
def test_example_runs(name: str) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=100
    )
    assert result.returncode == 0, result.stdout + result.stderr
    if name == "heal_training.py":
        assert "was killed by SIGKILL" in result.stdout
        assert "same final loss" in result.stdout
