"""Fixtures of the unit tier (one process, no workers)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

from actormesh.runtime.messaging.codec import new_key
from actormesh.runtime.messaging.node import Node
from actormesh.runtime.messaging.transport import Transport


@pytest.fixture
def node() -> Iterator[Node]:
    """A controller's node that is never started: tests call its handlers directly."""
    run_dir = tempfile.mkdtemp(prefix="am-unit-", dir="/tmp")
    made = Node(Transport(new_key(), run_dir, "ctl"), "controller")
    try:
        yield made
    finally:
        made.transport.close(linger=0)
        shutil.rmtree(run_dir, ignore_errors=True)
