"""Pure parts of the magics: TARGET parsing, ``--ranks``, rank ranges, output grouping."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from actormesh.errors import rank_ranges
from actormesh.kernel.display import OutputGrouper, output_prefix, prefix, render_strip
from actormesh.kernel.magic_args import CellArgs
from actormesh.kernel.selection import (
    SelectionError,
    resolve_target,
    select,
    values_of,
)
from actormesh.runtime.shape import Shape

SHAPE = Shape.from_extent({"hosts": 2, "gpus": 4})


class FakeMesh:
    def __init__(self, shape: Shape = SHAPE) -> None:
        self.shape = shape
        self.meshes = {"train": self}

    def slice(self, **sel: Any) -> FakeMesh:
        return FakeMesh(self.shape.slice(**sel))


def test_target_allows_names_attributes_slices_and_literal_subscripts() -> None:
    procs = FakeMesh()
    ns = {"procs": procs, "d": {"a": procs}, "lst": [procs]}
    assert resolve_target("procs", ns) is procs
    assert resolve_target(" d['a'] ", ns) is procs
    assert resolve_target("lst[-1]", ns) is procs
    assert resolve_target("procs.meshes['train']", ns) is procs
    got = resolve_target("procs.slice(gpus=slice(0, 2), hosts=1)", ns)
    assert got.shape == SHAPE.slice(gpus=slice(0, 2), hosts=1)
    assert resolve_target("procs.slice(gpus=-1)", ns).shape == SHAPE.slice(gpus=3)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "give a TARGET"),
        ("nope", "'nope' is not defined"),
        ("procs.", "not a Python expression"),
        ("__import__('os')", "may only call .slice"),
        ("procs.stop()", "may only call .slice"),
        ("procs.slice(gpus=x)", "literals"),
        ("procs.slice(**{'gpus': 1})", "**kwargs"),
        ("procs.__class__", "private attribute"),
        ("procs.slice(gpus=9)", "TARGET 'procs.slice(gpus=9)'"),
        ("procs + procs", "must be a name"),
        ("lambda: 1", "must be a name"),
        ("d[k]", "literals"),
    ],
)
def test_target_rejects_everything_else(text: str, words: str) -> None:
    with pytest.raises(SelectionError, match=re.escape(words)):
        resolve_target(text, {"procs": FakeMesh(), "d": {}})


def test_ranks_by_position() -> None:
    assert select(SHAPE, None).ranks == tuple(range(8))
    assert select(SHAPE, "3").ranks == (3,)
    assert select(SHAPE, "-1").ranks == (7,)
    assert select(SHAPE, "0,2").ranks == (0, 2)
    assert select(SHAPE, "1:4").ranks == (1, 2, 3)
    assert select(SHAPE, "::2").ranks == (0, 2, 4, 6)
    assert select(SHAPE, "::2").shape == SHAPE.flatten("ranks").slice(ranks=slice(0, 8, 2))
    sel = select(SHAPE, "0,1,5")
    assert sel.ranks == (0, 1, 5) and sel.shape is None  # not evenly spaced
    one_dim = Shape.from_extent({"hosts": 1, "gpus": 4})
    assert select(one_dim, "1:3").shape == one_dim.slice(gpus=slice(1, 3))  # keeps "gpus"


def test_ranks_by_coordinates() -> None:
    assert select(SHAPE, "gpus=1").ranks == (1, 5)
    assert select(SHAPE, "hosts=1,gpus=0:2").ranks == (4, 5)
    assert select(SHAPE, "hosts=1, gpus=::3").shape == SHAPE.slice(hosts=1, gpus=slice(0, 4, 3))


@pytest.mark.parametrize(
    ("sel", "words"),
    [
        ("8", "out of range"),
        ("1:x", "bad rank"),
        ("::0", "positive"),
        ("5:2", "selects no rank"),
        ("0,,1", "empty item"),
        ("gpus=1,2", "mix of positions and coordinates"),
        ("gpus=1,gpus=2", "given twice"),
        ("cpus=1", "cpus"),
        ("gpus=7", "out of range"),
    ],
)
def test_bad_ranks(sel: str, words: str) -> None:
    with pytest.raises(SelectionError, match=words):
        select(SHAPE, sel)


def test_cell_arguments() -> None:
    a = CellArgs("procs.slice(gpus = 1) --ranks 0:2 --noblock --timeout 2.5 --no-dedup -o res")
    assert a.target == "procs.slice(gpus = 1)" and a.ranks == "0:2" and a.noblock
    assert a.timeout == 2.5 and not a.dedup and a.output == "res"
    assert CellArgs("procs --ranks=gpus=1").ranks == "gpus=1"
    from IPython.core.error import UsageError

    for bad in ["", "--ranks 1", "procs --ranks", "procs --timeout x", "procs --timeout 0",
                "procs -o 1a", "procs --what", "procs 'unclosed"]:  # fmt: skip
        with pytest.raises(UsageError):
            CellArgs(bad)


def test_rank_ranges_and_prefixes() -> None:
    assert rank_ranges([3, 0, 1, 2]) == "0-3"
    assert rank_ranges([0, 2]) == "0,2"
    assert rank_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert prefix([2]) == "[rank 2]"
    assert prefix([0, 1, 2, 3]) == "[ranks 0-3]"
    assert prefix([1, "gpus=0"]) == "[rank 1, gpus=0]"


def test_output_is_prefixed_with_coordinates_as_endpoint_output_is() -> None:
    names = {r: f"gpus={r}" for r in range(4)}
    assert output_prefix([2], names) == "[gpus=2]"
    assert output_prefix([3, 0, 1, 2], names) == "[gpus=0-3]"
    assert output_prefix([0, 2, 3], names) == "[gpus=0,2-3]"
    assert output_prefix([1, "gpus=0"], names) == "[gpus=1, gpus=0]"  # another mesh's, as is
    grid = {r: f"hosts={r // 2},gpus={r % 2}" for r in range(4)}
    assert output_prefix([0, 1, 2, 3], grid) == "[hosts=0-1,gpus=0-1]"


def test_values_of_a_selection_are_labelled_with_the_ranks_own_coordinates() -> None:
    one_dim = Shape.from_extent({"gpus": 4})
    values = values_of(one_dim, select(one_dim, "0,3"), [10, 13])
    assert repr(values) == "ValueMesh({gpus=0: 10, gpus=3: 13})"
    assert values.values() == [10, 13] and values.item(gpus=1) == 13  # by position, as before
    assert repr(values.slice(gpus=1)) == "ValueMesh({gpus=3: 13})"
    assert repr(values_of(one_dim, select(one_dim, "2"), [12])) == "ValueMesh({gpus=2: 12})"
    irregular = values_of(one_dim, select(one_dim, "0,1,3"), [0, 1, 3])
    assert repr(irregular) == "ValueMesh({gpus=0: 0, gpus=1: 1, gpus=3: 3})"
    assert "<td>gpus=3</td>" in irregular._repr_html_()
    assert repr(values_of(SHAPE, select(SHAPE, "gpus=1"), [1, 5])) == (
        "ValueMesh({(hosts=0, gpus=1): 1, (hosts=1, gpus=1): 5})"
    )
    everything = values_of(one_dim, select(one_dim, None), [0, 1, 2, 3])
    assert type(everything).__name__ == "ValueMesh"


class Sink:
    def __init__(self, ranks: range, window: float = 0.05, max_hold: float = 0.5) -> None:
        self.out: list[tuple[str, str]] = []
        self.shown: list[dict[str, Any]] = []
        self.g = OutputGrouper(
            {f"gpus={r}": r for r in ranks},
            lambda stream, text: self.out.append((stream, text)),
            lambda data, md: self.shown.append(data),
            window=window,
            max_hold=max_hold,
            ranks=ranks,
        )

    def lines(self) -> list[str]:
        return "".join(t for _, t in self.out).splitlines()


def test_identical_lines_are_grouped_and_rank_order_is_kept() -> None:
    s = Sink(range(4))
    for r in range(4):
        s.g.writer(f"gpus={r}", "stdout", f"epoch 1\nrank {r} loss\nepoch 2\n")
        s.g.finished(r)
    s.g.flush(final=True)
    assert s.lines() == [
        "[gpus=0-3] epoch 1",
        "[gpus=0] rank 0 loss",
        "[gpus=1] rank 1 loss",
        "[gpus=2] rank 2 loss",
        "[gpus=3] rank 3 loss",
        "[gpus=0-3] epoch 2",
    ]


def test_no_dedup_and_streams() -> None:
    s = Sink(range(2))
    s.g.dedup = False
    s.g.writer("gpus=0", "stderr", "oops\n")
    s.g.writer("gpus=1", "stderr", "oops\n")
    s.g.writer("gpus=1", "stdout", "partial line")
    s.g.writer("other-mesh", "stdout", "x\n")
    s.g.flush(final=True)
    assert s.out == [
        ("stderr", "[gpus=0] oops\n[gpus=1] oops\n"),
        ("stdout", "[other-mesh] x\n[gpus=1] partial line\n"),  # by position, then arrival
    ]


def test_a_line_waits_for_slow_peers_but_not_forever() -> None:
    s = Sink(range(3), window=0.01, max_hold=0.3)
    s.g.writer("gpus=0", "stdout", "hello\n")
    time.sleep(0.05)  # older than the window, but ranks 1 and 2 may still say the same
    s.g.flush()
    assert s.out == []
    s.g.writer("gpus=1", "stdout", "hello\n")
    s.g.finished(1)
    s.g.writer("gpus=2", "stdout", "hello\n")
    time.sleep(0.05)
    s.g.flush()
    assert s.lines() == ["[gpus=0-2] hello"]
    # Rank 0 alone: held at most max_hold, then its silent peers stop being waited for.
    s.g.writer("gpus=0", "stdout", "only rank 0\n")
    s.g.flush()
    assert len(s.lines()) == 1
    deadline = time.monotonic() + 5
    while len(s.lines()) == 1 and time.monotonic() < deadline:
        time.sleep(0.02)
        s.g.flush()
    assert s.lines()[-1] == "[gpus=0] only rank 0"
    s.g.writer("gpus=0", "stdout", "again\n")
    time.sleep(0.05)
    s.g.flush()
    assert s.lines()[-1] == "[gpus=0] again"  # no long wait this time


def test_displays_keep_their_place_and_group() -> None:
    s = Sink(range(2))
    for r in range(2):
        s.g.writer(f"gpus={r}", "stdout", "before\n")
        s.g.display(r, {"text/html": "<b>x</b>", "text/plain": "x"}, {})
        s.g.writer(f"gpus={r}", "stdout", "after\n")
        s.g.finished(r)
    s.g.flush(final=True)
    assert s.lines() == ["[gpus=0-1] before", "[gpus=0-1]", "[gpus=0-1] after"]
    assert s.shown == [{"text/html": "<b>x</b>", "text/plain": "x"}]


def test_status_strip_html() -> None:
    html = render_strip({0: "done", 1: "running", 2: "error"}, 3.25, "%%mesh procs")
    assert "data-rank='1' data-state='running'" in html
    assert "1 done, 1 error, 1 running" in html and "3.2 s" in html
