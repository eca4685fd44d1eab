"""The examples in examples/ are documentation that runs."""

from __future__ import annotations

import re
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


def test_the_generator_trainer_example_learns_with_both_meshes_busy_at_once() -> None:
    """Issue 41: weights trainer -> generator and rollouts back with to_mesh, every step."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "rl_generator_trainer.py")],
        capture_output=True,
        text=True,
        timeout=100,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    first, last = map(
        float, re.search(r"first 10 steps ([\d.]+), last 10 steps ([\d.]+)", out).groups()
    )  # type: ignore[union-attr]
    assert last > first + 0.2, out  # it learns (a random policy scores 1/4)
    both = float(re.search(r"both at once ([\d.]+) s", out).group(1))  # type: ignore[union-attr]
    assert both > 0, out  # the generator sampled while the trainer trained
