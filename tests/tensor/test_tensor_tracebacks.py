"""``ACTORMESH_TENSOR_TRACEBACKS=1`` (TENSORS.md §3): a failed op's error shows the whole controller
stack that issued it, not only the user's file:line. The variable is read when actormesh is
imported, so the case runs a controller of its own (with a 2-rank mesh). Without it a site is one
file:line (test_tensor_errors checks that)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROGRAM = """
import json, torch, actormesh as am
from actormesh.tensor import RemoteTensorError, distribute, inspect

@am.remote(propagate=lambda t: t)
def fails(t):
    raise ValueError("failed on purpose")

def inner(t):
    return fails(t) + 1  # INNER

def outer(t):
    return inner(t) * 2  # OUTER

procs = am.this_host().spawn_procs(per_host={"dp": 2})
try:
    result = outer(distribute(torch.ones(4), procs, sharding_spec=["dp"]))
    try:
        inspect(result)
    except RemoteTensorError as err:
        print(json.dumps({"site": err.site, "text": str(err), "ranks": err.ranks}))
finally:
    procs.stop().get(timeout=30)
"""


def run(tmp_path: Path, value: str | None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = dict(os.environ)
    env.pop("ACTORMESH_TENSOR_TRACEBACKS", None)
    if value is not None:
        env["ACTORMESH_TENSOR_TRACEBACKS"] = value
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )


def line_of(marker: str) -> int:
    return next(n for n, text in enumerate(PROGRAM.splitlines(), 1) if marker in text)


def test_full_controller_stack_of_the_failed_op(tmp_path: Path) -> None:
    result = run(tmp_path, "1")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    site, script = report["site"], str(tmp_path / "program.py")
    assert report["ranks"] == ["{dp=0}", "{dp=1}"]
    outer = f'File "{script}", line {line_of("result = outer(")}, in <module>'
    middle = f'File "{script}", line {line_of("# OUTER")}, in outer'
    inner = f'File "{script}", line {line_of("# INNER")}, in inner'
    # Outermost first, as a traceback prints it; the user's innermost line last, with its code.
    assert site.index(outer) < site.index(middle) < site.index(inner), site
    assert site.rstrip().endswith("return fails(t) + 1  # INNER"), site
    assert "actormesh/tensor" not in site  # the recording machinery is not the user's stack
    assert "issued from (controller stack, most recent call last):" in report["text"]
    assert site in report["text"] and "failed on purpose" in report["text"]


def test_a_bad_value_says_what_to_use() -> None:
    env = dict(os.environ, ACTORMESH_TENSOR_TRACEBACKS="yes")
    result = subprocess.run(
        [sys.executable, "-c", "import actormesh"], capture_output=True, text=True, timeout=60,
        env=env,
    )  # fmt: skip
    assert result.returncode != 0
    assert "ACTORMESH_TENSOR_TRACEBACKS='yes': use '0' or '1'" in result.stderr
