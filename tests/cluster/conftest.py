from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cluster_harness import Cluster, WakeRecorder, create_database, drop_database  # noqa: E402


@pytest.fixture
def cluster(tmp_path) -> Iterator[Cluster]:
    """Real nodes on a fresh PostgreSQL database (the test starts them)."""
    url = create_database()
    c = Cluster(url, tmp_path)
    try:
        yield c
    finally:
        c.stop()
        drop_database(url)
        # Each node's last lines, printed here so that pytest shows them with a failing
        # test ("Captured stdout teardown") and drops them with a passing one.
        for node in c.nodes:
            print(f"--- {node.name} ({node.log_path.name}), its last lines ---\n{node.log()}")


@pytest.fixture
def wake_recorder() -> Iterator[WakeRecorder]:
    rec = WakeRecorder()
    try:
        yield rec
    finally:
        rec.close()
