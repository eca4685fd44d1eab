"""``%mesh status`` on ranks that hold GPU memory (skips without a GPU)."""

from __future__ import annotations

import re

import pytest
from kernel_support import Kernel, spawn_code
from panel_support import Panel, ranks_of
from support import gpus_here

pytestmark = pytest.mark.skipif(
    not gpus_here(),
    reason="needs an NVIDIA GPU and a CUDA build of torch (this machine has none)",
)


def test_status_shows_each_ranks_gpu_memory(kernel: Kernel) -> None:
    kernel.ok(spawn_code(2))
    kernel.ok("%%mesh procs\nimport torch\nx = torch.ones(64 << 20, device='cuda') * (rank + 1)")
    table = kernel.ok("%mesh status procs").displays()[0]["text/plain"].splitlines()
    assert table[0].split()[-2:] == ["gpu", "memory"]
    for row in table[1:]:
        mib = [int(m) for m in re.findall(r"(\d+) MiB", row)]
        assert len(mib) == 2 and mib[1] >= 256, row  # memory, then GPU memory: x is 256 MiB
    assert kernel.ok("%%mesh procs\nfloat(x.sum())").value == (
        f"ValueMesh({{gpus=0: {float(64 << 20)}, gpus=1: {float(2 * (64 << 20))}}})"
    )


def test_the_sidebar_feed_carries_each_ranks_gpu_memory(kernel: Kernel) -> None:
    panel = Panel(kernel)
    try:
        panel.ok("subscribe", client=panel.client)
        kernel.ok(spawn_code(2))
        kernel.ok("%%mesh procs\nimport torch\nx = torch.ones(64 << 20, device='cuda')")
        snap = panel.snapshot(
            "the GPU memory of both ranks",
            lambda ranks: len(ranks) == 2 and all((r["gpu_mem"] or 0) >= 256 << 20 for r in ranks),
        )
        assert all(r["state"] == "idle" for r in ranks_of(snap))
    finally:
        panel.close()
