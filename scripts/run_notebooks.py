"""Run every notebook in notebooks/ in the actormesh kernel, top to bottom.

Usage: python scripts/run_notebooks.py [NOTEBOOK ...]   (part of scripts/demo.sh)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import nbclient
import nbformat
from traitlets.config import Config


def ipc_kernel_config(directory: str) -> Config:
    """The kernel's channels over Unix sockets in ``directory`` rather than TCP on localhost:
    no other user of the machine can reach them, and ipykernel does not warn about unencrypted
    TCP. (An absolute path: the kernel runs in the notebook's folder, this script elsewhere.)"""
    return Config({"KernelManager": {"transport": "ipc", "ip": str(Path(directory) / "kernel")}})


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[1] / "notebooks"
    paths = [Path(p) for p in argv] or sorted(root.glob("*.ipynb"))
    with tempfile.TemporaryDirectory(prefix="actormesh-nb-") as sockets:
        for path in paths:
            start = time.monotonic()
            nb = nbformat.read(path, as_version=4)
            client = nbclient.NotebookClient(
                nb,
                timeout=120,
                kernel_name="actormesh",
                config=ipc_kernel_config(sockets),
                resources={"metadata": {"path": str(path.parent)}},
            )
            client.execute()  # raises on a failing cell that is not tagged raises-exception
            print(f"ran {path.name} in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
