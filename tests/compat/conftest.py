"""The compatibility tier: Monarch's public actor API, written as a Monarch user writes it (the
import line names actormesh), one test per supported entry of docs/monarch.md."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def procs() -> Iterator[Any]:
    from actormesh import this_host

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    yield procs
    procs.stop().get(timeout=30)
