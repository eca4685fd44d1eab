"""Errors as a notebook shows them (issue 45), through one real kernel: a remote traceback and a
tensor op's issue site name a cell as IPython does (``Cell In[8], line 10``), never the file
IPython compiled it into; the headers name the endpoint or op that raised (not the tensor
engine); the message has no leading blank line; and the first tensor step says that the
engine is starting."""

from __future__ import annotations

import re

import pytest
from kernel_support import Kernel

pytest.importorskip("torch")

WAIT = 120  # forming the process group and the engines on a loaded 2-core machine
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def cell_number(result: object) -> int:
    return int(result.reply["content"]["execution_count"])  # type: ignore[attr-defined]


def test_errors_name_cells_as_ipython_does(kernel: Kernel) -> None:
    kernel.ok(
        "import torch, actormesh as am\nprocs = am.this_host().spawn_procs(per_host={'gpus': 2})",
        timeout=WAIT,
    )
    started = kernel.ok(
        "t = am.distribute(torch.ones(4, 4), procs, sharding_spec=['gpus', None])", timeout=WAIT
    )
    assert "starting the tensor engine of 'procs' {gpus: 2}" in started.stream("stderr")
    assert "ready in" in started.stream("stderr")

    defined = kernel.ok(
        "class A(am.Actor):\n    @am.endpoint\n    def f(self):\n        return 1 / 0"
    )
    failed = kernel.execute("a = procs.spawn('a', A)\na.f.call().get(timeout=60)", timeout=WAIT)
    assert failed.ename == "ActorError"
    assert failed.error is not None and not failed.error["evalue"].startswith("\n")
    text = ANSI.sub("", failed.traceback)
    assert "a.f raised ZeroDivisionError" in text, text
    assert f"Cell In[{cell_number(defined)}], line 4, in f" in text, text
    assert "ipykernel_" not in text and "ipykernel_" not in failed.error["evalue"]

    defined = kernel.ok(
        "@am.remote(propagate=lambda t: t)\ndef fragile(t):\n    raise ValueError('boom')"
    )
    issued = kernel.execute("y = fragile(t)\nam.inspect(y)", timeout=WAIT)
    assert issued.ename == "RemoteTensorError"
    evalue = issued.error["evalue"] if issued.error else ""
    text = ANSI.sub("", issued.traceback)
    for shown in (text, evalue):
        assert "remote function fragile raised ValueError: boom" in shown, shown
        assert "tensor engine" not in shown and "ipykernel_" not in shown, shown
        assert f"Cell In[{cell_number(defined)}], line 3, in fragile" in shown, shown
        assert f"issued at Cell In[{cell_number(issued)}], line 1" in shown, shown
        assert "actormesh/tensor/worker" not in shown, shown  # the engine's own frames
    kernel.ok("procs.stop().get(timeout=60)")
