"""Values as the notebook shows them (rounded floats), and the debugger widget's HTML."""

from __future__ import annotations

import html
import re

import pytest

from actormesh.debugger.widget_html import (
    STATE_COLOURS,
    MeshRows,
    RankRow,
    locals_table,
    rank_table,
    stack_table,
)
from actormesh.runtime.meshes.display import round_floats, value_cell
from actormesh.runtime.meshes.value_mesh import new_value_mesh
from actormesh.runtime.shape import Shape


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("0.30000000000000004", "0.3"),
        ("-0.30000000000000004", "-0.3"),
        ("[0.1, 0.30000000000000004]", "[0.1, 0.3]"),
        ("{'loss': 1.3333333333333333}", "{'loss': 1.33333}"),
        ("np.float64(0.30000000000000004)", "np.float64(0.3)"),
        ("2.0000000001", "2.0"),  # still a float
        ("3.3333333333333334e-08", "3.33333e-08"),
        ("1.5", "1.5"),
        ("tensor([0.1000, 0.3000])", "tensor([0.1000, 0.3000])"),  # as torch wrote it
        ("12345678901234567890", "12345678901234567890"),  # an int
        ("'0.30000000000000004'", "'0.30000000000000004'"),  # a string's text
        ('"it\'s 0.30000000000000004" 0.30000000000000004', '"it\'s 0.30000000000000004" 0.3'),
        ("v1.2.3 at 127.0.0.1", "v1.2.3 at 127.0.0.1"),
        ("x1.23456789", "x1.23456789"),
        ("nan inf", "nan inf"),
    ],
)
def test_floats_are_rounded_for_display_only(text: str, shown: str) -> None:
    assert round_floats(text) == shown


def test_a_rounded_or_cut_cell_keeps_the_exact_text_on_hover() -> None:
    assert value_cell("0.30000000000000004") == "<td title='0.30000000000000004'>0.3</td>"
    assert value_cell("<b>") == "<td>&lt;b&gt;</td>"  # nothing to round: no tooltip
    assert value_cell("x" * 10, 6, " class='v'") == "<td class='v' title='xxxxxxxxxx'>xxx...</td>"


def test_value_mesh_html_rounds_and_its_repr_stays_exact() -> None:
    vm = new_value_mesh(Shape.from_extent({"gpus": 2}), [0.1, 0.1 + 0.2])
    assert "<td>gpus=1</td><td title='0.30000000000000004'>0.3</td>" in vm._repr_html_()
    assert repr(vm) == "ValueMesh({gpus=0: 0.1, gpus=1: 0.30000000000000004})"
    assert vm.values() == [0.1, 0.1 + 0.2]


def _rows(table: str) -> dict[int, list[str]]:
    """rank -> the text of its cells (the state as its badge's class)."""
    out = {}
    for rank, state, body in re.findall(r"<tr data-rank='(\d+)' data-state='(\w+)'.*?>(.*?)</tr>",
                                        table):  # fmt: skip
        cells = re.findall(r"<td[^>]*>(.*?)</td>", body)
        badge = re.search(r"class='badge state-(\w+)'>(\w+)<", body)
        assert badge is not None and badge.groups() == (state, state)
        out[int(rank)] = [state, *cells[:2], *cells[3:]]
    return out


def test_rank_table_is_a_row_per_rank_with_the_sidebars_badges_and_locations() -> None:
    rows = [
        RankRow(0, "gpus=0", "running", title="rank 0 {gpus=0} running"),
        RankRow(1, "gpus=1", "paused", "In [2]:3", "<module>", selected=True),
        RankRow(2, "gpus=2", "dead"),
    ]
    table = rank_table([MeshRows("procs {gpus: 3}", rows)])
    assert _rows(table) == {
        0: ["running", "0", "gpus=0", "", ""],
        1: ["paused", "1", "gpus=1", "In [2]:3", "&lt;module&gt;"],
        2: ["dead", "2", "gpus=2", "", ""],
    }
    assert "class=selected" in table.split("data-rank='1'")[1].split(">")[0]
    assert "title='rank 0 {gpus=0} running'" in table
    assert "procs {gpus: 3}" not in table  # one mesh: no mesh heading
    assert "<th>note</th>" not in table  # no rank has a note: no column for them
    for state in ("running", "paused", "dead"):  # the sidebar's colours
        assert f".jp-actormesh-dbg .state-{state}{{background:{STATE_COLOURS[state]}}}" in table
    assert STATE_COLOURS["paused"] == "#b0701a" and STATE_COLOURS["dead"] == "#c23b3b"
    assert "1 running" in table and "1 paused" in table and "1 dead" in table


def test_rank_table_names_each_mesh_when_there_are_several_and_shows_notes() -> None:
    pg = RankRow(0, "gpus=0", "paused", "train.py:12", "step", "process group timeout in 9 s")
    table = rank_table(
        [
            MeshRows("procs {gpus: 1}", [pg]),
            MeshRows("pair {gpus: 1}", [RankRow(0, "gpus=0", "running")]),
        ]
    )
    assert "<tr class='mesh'><th colspan='6'>procs {gpus: 1}</th></tr>" in table
    assert "<tr class='mesh'><th colspan='6'>pair {gpus: 1}</th></tr>" in table
    assert "<td class='note'>process group timeout in 9 s</td>" in table
    assert "no live proc mesh" in rank_table([])


def test_stack_and_locals_tables() -> None:
    stack = stack_table([("In [2]:3", "<module>"), ("train.py:40", "step")])
    assert "<td class='code'>In [2]:3</td><td class='code'>&lt;module&gt;</td>" in stack
    assert "<td class='num code'>1</td><td class='code'>train.py:40</td>" in stack
    variables = [("lr", "float", "0.30000000000000004"), ("s", "str", "'x" + "y" * 200 + "'")]
    local = locals_table(variables)
    assert "<td class='code value' title='0.30000000000000004'>0.3</td>" in local
    long = re.search(r"<td class='code value' title='([^']*)'>([^<]*)</td></tr></tbody>", local)
    assert (
        long is not None
        and long.group(1).startswith("&#x27;x")
        and len(html.unescape(long.group(2))) == 120
    )
    assert "none" in locals_table([])
