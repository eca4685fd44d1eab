"""The runtime reaches the tensor layer through one typed seam (runtime/meshes/tensor_seam.py)
that the tensor layer fills; ``import actormesh`` still does not import torch, and the seam
loads the tensor layer on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

from actormesh import MeshUsageError
from actormesh.runtime.meshes import tensor_seam

FIRST_USE = """
import sys
import actormesh
from actormesh.runtime.meshes import tensor_seam
assert "torch" not in sys.modules and "actormesh.tensor" not in sys.modules
layer = tensor_seam.tensor_layer("ProcMesh.activate")
assert "actormesh.tensor" in sys.modules
print(type(layer).__module__, type(layer).__qualname__)
"""


def test_the_tensor_layer_loads_on_first_use_and_fills_the_seam() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FIRST_USE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["actormesh.tensor.controller.seams", "_ForTheRuntime"]


def test_without_a_tensor_layer_the_caller_is_told_to_import_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tensor_seam, "_layer", None)
    monkeypatch.setattr(tensor_seam, "_load", None)
    with pytest.raises(MeshUsageError, match=r"endpoint\.rref needs the tensor layer"):
        tensor_seam.tensor_layer("endpoint.rref")
