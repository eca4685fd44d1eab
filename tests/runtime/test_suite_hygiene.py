"""The test run's own fixtures (issue 45): a test that leaves an actormesh thread running in the
test process fails, naming it; a slow test that passes prints no thread stacks (faulthandler
fires only near that test's own limit, into the test's captured output)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

CASES = """
import time

import pytest

import actormesh as am


class Idle(am.Actor):
    @am.endpoint
    def ping(self):
        return 1


def test_leaves_an_actor_running():
    am.this_proc().spawn("forgotten", Idle).ping.call_one().get(timeout=30)


def test_stops_its_actor():
    actor = am.this_proc().spawn("tidy", Idle)
    actor.ping.call_one().get(timeout=30)
    actor.stop().get(timeout=30)


@pytest.mark.timeout(20)
def test_slow_but_passing():
    time.sleep(3)  # past a tenth of its limit (DUMP_AT): faulthandler fires, into the capture
"""


def test_a_leaked_thread_fails_its_test_and_a_slow_pass_stays_quiet(tmp_path: Path) -> None:
    (tmp_path / "test_cases.py").write_text(CASES)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
         "-o", "timeout=60", str(tmp_path / "test_cases.py")],
        cwd=tmp_path,
        env={**_env(), "PYTHONPATH": f"{TESTS}:{_root()}", "ACTORMESH_TEST_DUMP_AT": "0.1"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert "3 passed, 1 error" in out, out  # the error: at the leaking test's teardown
    assert "ERROR test_cases.py::test_leaves_an_actor_running" in out, out
    assert "['actor-forgotten']" in out, out
    assert "Timeout (" not in out and "Thread 0x" not in out, out  # no stacks in a passing run


def _root() -> str:
    return str(TESTS.parent)


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
