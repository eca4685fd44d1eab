"""A program written for PyTorch Monarch's tensor engine runs on actormesh with only its imports
changed (issue 19), on CPU with gloo, as a script in a fresh process.

The program uses what Monarch's distributed-tensors guide shows: a mesh of processes, torch
running locally until ``mesh.activate()``, per-rank tensors, ``mesh.rank(dim)``, ``inspect`` of
rank 0's or another rank's copy, ``t @ t.T`` on every rank, ``reduce`` over one and several mesh
dimensions, a remote function with ``propagate``, ``no_mesh``, and failing ops (one rank, then
every rank) that leave the workers alive for the next commands. ``BODY`` is the program without
its imports; ``MONARCH_IMPORTS`` is what it starts with under Monarch, ``ACTORMESH_IMPORTS``
here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300  # a fresh process, four ranks and their process group, on a loaded machine

MONARCH_IMPORTS = """\
import torch
from monarch.actor import this_host
import monarch
from monarch import no_mesh, remote
"""

ACTORMESH_IMPORTS = """\
import torch
from actormesh import this_host
import actormesh as monarch
from actormesh import no_mesh, remote
"""

BODY = """
def same(a, b):
    return torch.allclose(a, b, atol=1e-5)


@remote(propagate=lambda x: x)
def affine(x):
    return x * 3 + 1


@remote(propagate=lambda x: x)
def fails_on_last_rank(x):
    import torch.distributed as dist

    if dist.get_rank() == dist.get_world_size() - 1:
        raise RuntimeError("the last rank gives up")
    return x


def main():
    mesh = this_host().spawn_procs({"dp": 2, "tp": 2})

    # No active mesh: torch is local.
    assert type(torch.rand(3, 4)) is torch.Tensor

    # Active: every rank makes its own tensor.
    with mesh.activate():
        t = torch.rand(3, 4)
        gram = t @ t.T
    copies = {(d, p): monarch.inspect(t, dp=d, tp=p) for d in range(2) for p in range(2)}
    assert torch.equal(monarch.inspect(t), copies[0, 0])  # rank 0's copy by default
    assert len({float(c.sum()) for c in copies.values()}) == 4  # a draw per rank
    assert same(monarch.inspect(gram, dp=1, tp=1), copies[1, 1] @ copies[1, 1].T)

    # Collectives: reduce over one mesh dimension, then over both.
    with mesh.activate():
        over_tp = t.reduce("tp", "sum")
        over_all = t.reduce(("dp", "tp"), "avg")
        with no_mesh.activate():
            here = torch.zeros(2)
    assert type(here) is torch.Tensor
    for d in range(2):
        assert same(monarch.inspect(over_tp, dp=d, tp=1), copies[d, 0] + copies[d, 1])
    assert same(monarch.inspect(over_all, dp=1), sum(copies.values()) / 4)

    # Each rank's coordinate as a tensor.
    with mesh.activate():
        coord = mesh.rank("dp")
    assert [monarch.inspect(coord, dp=d, tp=1).item() for d in range(2)] == [0, 1]

    # A remote function: runs on each rank's tensor; propagate gives its shape.
    with mesh.activate():
        moved = affine(t)
    assert moved.shape == (3, 4)
    assert same(monarch.inspect(moved, dp=1, tp=0), copies[1, 0] * 3 + 1)

    # A command that fails on one rank, then a collective over its result: it raises at the
    # fetch, and the workers are still there.
    try:
        with mesh.activate():
            total = fails_on_last_rank(t).reduce(("dp", "tp"), "sum")
        monarch.inspect(total)
    except Exception as exc:
        print("failed as expected:", type(exc).__name__)
        assert "the last rank gives up" in str(exc)
    else:
        raise AssertionError("the failure was not reported")
    print("RECOVERED!")

    # A torch op that fails on every rank (an index past the end): the same.
    try:
        with mesh.activate():
            past_end = t[torch.tensor([5])]
        monarch.inspect(past_end)
    except Exception as exc:
        print("failed as expected:", type(exc).__name__)
        assert "out of bounds" in str(exc)
    else:
        raise AssertionError("the failure was not reported")

    with mesh.activate():
        ones = torch.ones(2, 2).reduce("dp", "sum")
    assert torch.equal(monarch.inspect(ones, tp=1), torch.full((2, 2), 2.0))
    mesh.stop().get()
    print("PROGRAM OK")


if __name__ == "__main__":
    main()
"""


def test_monarch_program_runs_with_only_its_imports_changed(tmp_path: Path) -> None:
    script = tmp_path / "monarch_program.py"
    script.write_text(ACTORMESH_IMPORTS + BODY)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "RECOVERED!" in done.stdout and "PROGRAM OK" in done.stdout, out
