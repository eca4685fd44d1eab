"""Which backend a process group's members join with, given the GPUs they would use."""

from __future__ import annotations

import logging

import pytest

from actormesh import MeshUsageError
from actormesh.runtime.dataplane.rank_layout import SHARED_GPU_BACKEND, choose_backend, gpu_of
from actormesh.runtime.procs import osutil

NCCL = "cpu:gloo,cuda:nccl"


def test_each_rank_on_its_own_gpu_keeps_nccl() -> None:
    # A 'gpus' dimension: each process sees one GPU, as device 0.
    gpus = [gpu_of([str(i)], 0, "h") for i in range(4)]
    assert choose_backend(None, NCCL, gpus) == NCCL


def test_local_ranks_spread_over_the_visible_gpus() -> None:
    gpus = [gpu_of(["0", "1"], local, "h") for local in range(2)]
    assert gpus == [("h", "0"), ("h", "1")]
    assert choose_backend(None, NCCL, gpus) == NCCL


def test_the_same_gpu_name_on_two_hosts_is_two_gpus() -> None:
    assert choose_backend(None, NCCL, [("a", "0"), ("b", "0")]) == NCCL


def test_ranks_sharing_a_gpu_move_cuda_to_gloo_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpus = [gpu_of(["0"], local, "h") for local in range(4)]
    with caplog.at_level(logging.WARNING):
        assert choose_backend(None, NCCL, gpus) == SHARED_GPU_BACKEND
    assert "ranks 0 and 1 share GPU 0 of host h" in caplog.text


def test_nccl_named_for_ranks_sharing_a_gpu_is_refused() -> None:
    gpus = [gpu_of(["0"], local, "h") for local in range(2)]
    with pytest.raises(MeshUsageError, match="ranks 0 and 1 would share GPU 0 of host h"):
        choose_backend("nccl", "nccl", gpus)


def test_no_gpu_or_no_nccl_changes_nothing() -> None:
    assert choose_backend(None, "gloo", [None, None]) == "gloo"
    assert choose_backend("gloo", "gloo", [("h", "0"), ("h", "0")]) == "gloo"
    assert gpu_of([], 3, "h") is None


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(osutil.os, "listdir", lambda path: ["a", "b", "c"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert osutil.visible_gpus() == ["0", "1", "2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 0")
    assert osutil.visible_gpus() == ["2", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert osutil.visible_gpus() == []
