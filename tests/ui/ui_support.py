"""The UI tier's helpers: a JupyterLab server in a temp dir, and screenshots.

(A module of its own: ``tests/kernel`` and ``tests/ui`` both have a ``conftest``, so test
modules cannot import helpers from theirs when both directories run together.)
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import nbformat
import psutil
from support import wait_until

ROOT = Path(__file__).resolve().parents[2]
BUILT = ROOT / "actormesh" / "labextension"
SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
WAIT_MS = 60_000  # every wait in the page: generous, a 2-core machine shared with others


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Lab:
    """A JupyterLab server in a temp dir, with its token and REST helpers."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "notebooks"
        self.root.mkdir()
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / "lab.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        prefix = self.tmp / "prefix"
        subprocess.run(
            [sys.executable, "-m", "actormesh", "install-kernel", "--prefix", str(prefix)],
            check=True,
            timeout=60,
            capture_output=True,
        )
        share = prefix / "share" / "jupyter"
        # The extension as built in this checkout (not a stale copy installed earlier).
        (share / "labextensions").mkdir(parents=True)
        (share / "labextensions" / "actormesh").symlink_to(BUILT)
        settings = self.tmp / "settings"
        notify = settings / "@jupyterlab" / "apputils-extension"
        notify.mkdir(parents=True)
        # No "get notified about Jupyter news?" toast over the sidebar.
        (notify / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False})
        )
        env = dict(os.environ)
        env["JUPYTER_PATH"] = os.pathsep.join([str(share), env.get("JUPYTER_PATH", "")])
        env["JUPYTER_CONFIG_DIR"] = str(self.tmp / "config")
        env["JUPYTER_RUNTIME_DIR"] = str(self.tmp / "runtime")
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            f"--LabApp.workspaces_dir={self.tmp / 'workspaces'}",
            f"--LabApp.user_settings_dir={settings}",
            "--LabApp.expose_app_in_browser=True",
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"jupyter lab exited:\n{self.log()}")
            try:
                self.api("GET", "status")
                return True
            except OSError:
                return False

        wait_until(up, 120, "jupyter lab to answer /api/status")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def kernel_stacks(self) -> str:
        """Every thread's stack in each kernel this server runs (py-spy, from the ui extra):
        what a failed test's kernel was doing, e.g. a control thread that stopped answering."""
        if self.proc is None:
            return ""
        py_spy = str(Path(sys.executable).with_name("py-spy"))
        out = []
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if "actormesh.kernel" not in " ".join(child.cmdline()):
                    continue
            except psutil.Error:
                continue
            try:
                done = subprocess.run(
                    [py_spy, "dump", "--pid", str(child.pid)],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                out.append(f"== kernel pid {child.pid}\n{done.stdout}{done.stderr}")
            except (OSError, subprocess.TimeoutExpired) as exc:
                out.append(f"== kernel pid {child.pid}: py-spy failed: {exc!r}")
        return "\n".join(out) or "(no kernel running)"

    def api(self, method: str, path: str) -> Any:
        req = urllib.request.Request(
            f"{self.url}/api/{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def kernel_tree(self) -> list[int]:
        """Every process below the server (kernels, their agents and workers)."""
        assert self.proc is not None
        try:
            return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.Error:
            return []

    def shutdown_kernels(self) -> None:
        tree = self.kernel_tree()
        for session in self.api("GET", "sessions"):
            self.api("DELETE", f"sessions/{session['id']}")
        for kernel in self.api("GET", "kernels"):
            self.api("DELETE", f"kernels/{kernel['id']}")

        def gone() -> bool:
            return not [p for p in tree if running(p)]

        wait_until(gone, 60, "the test's kernels and their meshes to exit")

    def notebook(self, name: str, cells: list[str], kernel: str = "actormesh") -> str:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
        display = "actormesh (Python 3)" if kernel == "actormesh" else "Python 3 (ipykernel)"
        nb.metadata["kernelspec"] = {"name": kernel, "display_name": display, "language": "python"}
        nbformat.write(nb, self.root / name)
        return name

    def stop(self) -> None:
        if self.proc is None:
            return
        tree = self.kernel_tree()
        self.proc.terminate()  # the server shuts its kernels down on SIGTERM
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        for pid in tree:
            if running(pid):
                try:
                    psutil.Process(pid).kill()
                except psutil.Error:
                    pass


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def shot(page: Any, name: str) -> Path:
    """Save a screenshot of the whole window as tests/ui/screenshots/NAME.png."""
    SCREENSHOTS.mkdir(exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path
