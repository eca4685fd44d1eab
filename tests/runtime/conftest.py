from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def shared_procs() -> Iterator[object]:
    """One 4-rank mesh reused by tests that only need live workers (stopped at session end)."""
    import actormesh as am

    procs = am.this_host().spawn_procs(per_host={"gpus": 4})
    yield procs
    procs.stop().get(timeout=20)
