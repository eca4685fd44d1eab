"""Private names stay private: ruff's ``SLF001`` reports any ``obj._name`` reached from outside
its class, and its allow-list (``extend-ignore-names`` in pyproject.toml) holds only CPython's
documented underscore functions. The runtime's own hooks have public names (``new_value_mesh``,
``future.set_result``, ``mesh_shape.with_shape``...); a private reach that remains carries a
``# noqa: SLF001`` saying why. Growing the list is a deliberate act: change it here too."""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]

# name -> why it may be reached from anywhere
ALLOWED = {
    "_current_frames": "sys._current_frames: CPython's documented way to every thread's stack",
    "_getframe": "sys._getframe: CPython's documented way to a caller's frame",
}


def test_the_allow_list_of_private_names_is_cpythons_only() -> None:
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11's; the project runs on 3.10)
    section = text.split("[tool.ruff.lint.flake8-self]", 1)[1]
    listed = re.search(r"^extend-ignore-names = (\[.*?\])", section, re.M | re.S)
    assert listed is not None, "pyproject.toml has no extend-ignore-names for flake8-self"
    assert sorted(ast.literal_eval(listed.group(1))) == sorted(ALLOWED)
