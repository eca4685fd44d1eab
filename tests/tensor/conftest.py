"""One 4-rank mesh {dp: 2, tp: 2} for the whole package: forming a process group and spawning the
engine takes seconds, and the tests leave the mesh usable (that is part of what they check)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="package")
def mesh() -> Iterator[Any]:
    import actormesh as am

    procs = am.this_host().spawn_procs(per_host={"dp": 2, "tp": 2})
    try:
        yield procs
    finally:
        procs.stop().get(timeout=30)
