"""SQLite's WAL checkpoints run on the store's thread, not inside a commit (D128).

The tests wait on the thread's own condition (``Checkpointer.wait_for``), never sleep.
"""

from __future__ import annotations

import pytest
import structlog

from tidings.store.checkpoints import BACKSTOP_PAGES, FAULT_CHECKPOINT
from tidings.store.engine import Store

#: A row of this many bytes fills about 25 WAL pages of 4 KiB.
BLOB = 100_000


def _scratch_table(store: Store) -> None:
    with store.write() as tx:
        tx.raw("CREATE TABLE scratch (id INTEGER PRIMARY KEY, b BLOB NOT NULL)")


def _commit(store: Store, size: int = 10) -> None:
    with store.write() as tx:
        tx.raw("INSERT INTO scratch (b) VALUES (randomblob(?))", (size,))


def _wal_pages(store: Store) -> tuple[int, int]:
    """(pages in the WAL since it last started over, pages copied back); checkpoints."""
    with store.read() as tx:
        _busy, log, copied = tx.raw("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return log, copied


@pytest.mark.sqlite_only
def test_a_commit_past_sqlites_default_does_not_checkpoint_below_the_backstop(store):
    """With the thread off, the WAL grows past SQLite's default of 1,000 pages without a
    commit checkpointing it: every commit's checkpoint waits for the backstop."""
    checkpointer = store.checkpointer
    assert checkpointer is not None
    checkpointer.enabled = False
    _scratch_table(store)
    for _ in range(70):  # about 1,750 pages
        _commit(store, BLOB)
    log, _copied = _wal_pages(store)
    assert 1_500 <= log < BACKSTOP_PAGES
    assert checkpointer.requested == 0 and not checkpointer.running()


@pytest.mark.sqlite_only
def test_the_backstop_still_checkpoints_a_wal_the_thread_leaves(store):
    """Past ``BACKSTOP_PAGES`` a commit checkpoints, as SQLite does by default: the WAL
    starts over, so it never holds much more than the backstop."""
    checkpointer = store.checkpointer
    assert checkpointer is not None
    checkpointer.enabled = False
    _scratch_table(store)
    for _ in range(BACKSTOP_PAGES // 25 + 40):  # about 1,000 pages past the backstop
        _commit(store, BLOB)
    log, _copied = _wal_pages(store)
    assert log < BACKSTOP_PAGES


@pytest.mark.sqlite_only
def test_every_nth_commit_wakes_the_thread_which_copies_the_wal_back(store):
    checkpointer = store.checkpointer
    assert checkpointer is not None
    _scratch_table(store)  # one commit
    checkpointer.every = 5
    for _ in range(3):
        _commit(store)
    assert checkpointer.requested == 0 and not checkpointer.running()
    _commit(store)  # the fifth since the count started
    assert checkpointer.requested == 1
    assert checkpointer.wait_for(lambda c: c.runs >= 1, timeout=10)
    status = checkpointer.status()
    # It found the WAL's pages and copied every one back (nothing committed meanwhile).
    assert status["wal_pages"] > 0 and status["busy"] == 0 and status["failures"] == 0
    for _ in range(5):
        _commit(store)
    assert checkpointer.requested == 2
    assert checkpointer.wait_for(lambda c: c.runs >= 2, timeout=10)


@pytest.mark.sqlite_only
def test_the_thread_copies_what_it_can_and_never_waits_for_a_reader(store):
    """``PASSIVE``: a reader still on an older snapshot keeps the pages it needs in the WAL;
    the thread copies the rest and returns at once, counted as ``busy``. (A checkpoint that
    waited for readers, as ``FULL`` does, would hold up the thread, and every commit behind
    it, for the busy timeout.)"""
    checkpointer = store.checkpointer
    assert checkpointer is not None
    _scratch_table(store)
    _commit(store)
    with store.read() as reader:  # a snapshot taken now, held while more commits come
        reader.raw("SELECT count(*) FROM scratch").fetchone()
        checkpointer.every = 1
        _commit(store)
        assert checkpointer.wait_for(lambda c: c.runs >= 1, timeout=3)
        status = checkpointer.status()
    assert status["busy"] == 1 and status["failures"] == 0


@pytest.mark.sqlite_only
def test_a_failed_checkpoint_is_counted_and_logged_and_the_next_wake_tries_again(store, faults):
    checkpointer = store.checkpointer
    assert checkpointer is not None
    _scratch_table(store)
    checkpointer.every = 1
    faults.arm(FAULT_CHECKPOINT, 1)
    with structlog.testing.capture_logs() as logs:
        _commit(store)
        assert checkpointer.wait_for(lambda c: c.runs >= 1, timeout=10)
    assert checkpointer.status()["failures"] == 1
    assert any(e["event"].startswith("WAL checkpoint failed") and e["log_level"] == "warning" for e in logs)
    _commit(store)  # the commit went through, and so does this one; the thread lives on
    assert checkpointer.wait_for(lambda c: c.runs >= 2, timeout=10)
    status = checkpointer.status()
    assert status["failures"] == 1 and status["wal_pages"] > 0
    assert checkpointer.running()


@pytest.mark.sqlite_only
def test_dispose_stops_the_thread(backend_url, clock, faults):
    store = Store(backend_url, clock=clock, faults=faults)
    checkpointer = store.checkpointer
    assert checkpointer is not None
    try:
        _scratch_table(store)
        checkpointer.every = 1
        _commit(store)
        assert checkpointer.wait_for(lambda c: c.runs >= 1, timeout=10)
        assert checkpointer.running()
    finally:
        store.dispose()
    assert not checkpointer.running()


@pytest.mark.postgres_only
def test_postgresql_has_no_checkpoint_thread(store):
    assert store.checkpointer is None


def test_the_thread_s_counters_are_in_the_status_and_the_metrics_on_sqlite_only(runtime):
    from tidings.metrics import exposition

    status = runtime.status()
    text = exposition(runtime).decode()
    if runtime.store.dialect == "sqlite":
        assert status["checkpoints"] == {"runs": 0, "busy": 0, "failures": 0, "wal_pages": 0}
        for name in ("runs", "busy", "failures"):
            assert f"tidings_sqlite_checkpoint_{name}_total 0.0" in text
        assert "tidings_sqlite_wal_pages 0.0" in text
    else:
        assert "checkpoints" not in status
        assert "tidings_sqlite_checkpoint" not in text
