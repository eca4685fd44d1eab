"""The notebooks' committed outputs are what any user would see (issue 45): no path of the
machine that ran them (a checkout, a home or temp directory, a kernel's cell file)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
MACHINE_PATH = re.compile(r"(/tmp/|/home/|/root/|/work/|/Users/|site-packages|ipykernel_\d+)")


def _texts(output: dict) -> list[str]:
    texts = [output.get("text", ""), output.get("evalue", ""), *output.get("traceback", [])]
    texts += [str(v) for v in output.get("data", {}).values()]
    return [t if isinstance(t, str) else "".join(t) for t in texts]


def test_committed_outputs_hold_no_machine_paths() -> None:
    assert NOTEBOOKS
    found = []
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for number, cell in enumerate(nb.cells):
            for output in cell.get("outputs", []):
                for text in _texts(output):
                    for m in MACHINE_PATH.finditer(text):
                        around = text[max(0, m.start() - 40) : m.end() + 40]
                        found.append(f"{path.name} cell {number}: ...{around!r}")
    assert found == [], "\n".join(found)
