"""Every code block of the README runs as written (issue 45): each ``python`` block as a script of
its own, each ``bash`` block line by line, from the checkout's root. A block that cannot run here
(it installs packages, needs a cluster, starts a server that runs until stopped) says so in an
HTML comment just above it, ``<!-- not run: why -->``; it must still parse (Python) and the files
of this repository that it names must exist."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```\n", re.S | re.M)
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\n$")
# What a block names in this repository: scripts/..., examples/..., notebooks/...
PATHS = re.compile(r"(?<![\w/.])((?:scripts|examples|notebooks|tests|docs)/[\w./-]+)")


@dataclass
class Block:
    language: str
    code: str
    line: int
    not_run: str  # the reason given, or ""

    @property
    def name(self) -> str:
        return f"README.md:{self.line}"


def blocks() -> list[Block]:
    text = README.read_text()
    found = []
    for m in FENCE.finditer(text):
        before = text[: m.start()]
        reason = NOT_RUN.search(before[-300:])
        found.append(
            Block(m.group(1), m.group(2), before.count("\n") + 2, reason.group(1) if reason else "")
        )
    return found


RUN = [b for b in blocks() if not b.not_run]
NOT_RUN_BLOCKS = [b for b in blocks() if b.not_run]


def test_the_readme_has_the_blocks_this_test_expects() -> None:
    assert {b.language for b in blocks()} == {"python", "bash"}
    assert len([b for b in RUN if b.language == "python"]) >= 4  # quickstart, tensors...


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


@pytest.mark.timeout(300)
@pytest.mark.parametrize("block", RUN, ids=lambda b: b.name)
def test_the_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    if block.language == "python":
        script = tmp_path / "block.py"
        script.write_text(block.code)
        commands = [[sys.executable, str(script)]]
    else:
        commands = []
        for line in block.code.splitlines():
            line = line.split("  #")[0].strip()
            if line:
                words = shlex.split(line)
                # `python` is the environment's interpreter, as in the user's venv.
                commands.append([sys.executable if w == "python" else w for w in words])
    for command in commands:
        result = subprocess.run(
            command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=240
        )
        assert result.returncode == 0, (
            f"{block.name}: {command} exited {result.returncode}\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )


@pytest.mark.parametrize("block", NOT_RUN_BLOCKS, ids=lambda b: b.name)
def test_a_block_that_does_not_run_here_parses_and_names_real_files(block: Block) -> None:
    if block.language == "python":
        ast.parse(block.code)
    for path in PATHS.findall(block.code):
        assert (ROOT / path.rstrip(".")).exists() or "*" in path, f"{block.name} names {path}"
