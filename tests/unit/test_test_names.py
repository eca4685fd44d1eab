"""The suite's test modules have distinct file names: pytest imports them by basename (the test
folders are not packages), so a second ``test_lifecycle.py`` stops the whole run at collection
("import file mismatch"), although each folder passes on its own."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_file_name() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, count in names.items() if count > 1] == []
