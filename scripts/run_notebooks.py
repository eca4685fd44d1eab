"""Run every notebook in notebooks/ in the actormesh kernel, top to bottom.

Usage: python scripts/run_notebooks.py [NOTEBOOK ...]   (part of scripts/demo.sh)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbclient
import nbformat


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[1] / "notebooks"
    paths = [Path(p) for p in argv] or sorted(root.glob("*.ipynb"))
    for path in paths:
        start = time.monotonic()
        nb = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(
            nb,
            timeout=120,
            kernel_name="actormesh",
            resources={"metadata": {"path": str(path.parent)}},
        )
        client.execute()  # raises on a failing cell that is not tagged raises-exception
        print(f"ran {path.name} in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
