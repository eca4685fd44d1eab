"""Socket directories (``/tmp/am-*``) never outlive their process, even one killed outright."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from actormesh import config
from actormesh.runtime.messaging import run_dir


def test_a_run_dir_names_its_owner_and_outlives_only_a_live_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "RUN_DIR", str(tmp_path))
    mine = run_dir.make_run_dir()
    assert os.path.basename(mine).startswith("am-")
    # A process that made its run dir and was then killed outright (SIGKILL: no cleanup).
    code = (
        "import os, signal\n"
        "from actormesh import config\n"
        f"config.RUN_DIR = {str(tmp_path)!r}\n"
        "from actormesh.runtime.messaging.run_dir import make_run_dir\n"
        "print(make_run_dir(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == -9, out.stderr
    killed = out.stdout.strip()
    assert os.path.isdir(killed)
    unowned = tmp_path / "am-unowned"  # someone else's, or one made before owners were written
    unowned.mkdir()
    elsewhere = tmp_path / "am-elsewhere"  # a /tmp shared with another machine: not judged here
    elsewhere.mkdir()
    (elsewhere / "owner").write_text(f"{socket.gethostname()}-other 1 0.0")

    fresh = run_dir.make_run_dir()  # what every controller and host agent does as it starts
    assert not os.path.exists(killed)
    assert os.path.isdir(mine) and os.path.isdir(fresh)
    assert unowned.is_dir() and elsewhere.is_dir()
    assert run_dir.sweep_run_dirs(str(tmp_path)) == []
