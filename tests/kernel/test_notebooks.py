"""Every notebook in notebooks/ runs top to bottom in the actormesh kernel (nbclient).

A cell may fail only when it is tagged ``raises-exception`` (the error demos)."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    assert [p.name for p in NOTEBOOKS][:2] == [
        "01_getting_started.ipynb",
        "02_mesh_magics.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "actormesh"
    client = nbclient.NotebookClient(
        nb,
        timeout=60,  # per cell
        startup_timeout=60,
        kernel_name="actormesh",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError on an untagged failing cell
    errors = [
        (i, o["ename"])
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for o in cell.outputs
        if o.output_type == "error"
    ]
    tagged = [
        i for i, cell in enumerate(nb.cells) if "raises-exception" in cell.metadata.get("tags", [])
    ]
    assert [i for i, _ in errors] == tagged
