"""The store engine on both backends: migrations, transactions, savepoints, after-commit."""

from __future__ import annotations

import pytest

from tidings.store.engine import Store, is_transient
from tidings.store.migrate import available, migrate
from tidings.store.sql import Stmt

COUNT_ACCOUNTS = Stmt("SELECT COUNT(*) FROM accounts")
INSERT_ACCOUNT = Stmt(
    "INSERT INTO accounts (id, kind, handle, display_name, created_at_ms) "
    "VALUES (:id, 'human', :handle, '', 1)"
)


def test_migrations_apply_once_and_are_safe_to_rerun(store):
    assert migrate(store) == []  # already applied by the constructor
    with store.read() as tx:
        versions = [r[0] for r in tx.raw("SELECT version FROM schema_migrations ORDER BY version").fetchall()]
    assert versions == [m.version for m in available(store.dialect)]
    again = Store(store.url, clock=store.clock)
    again.dispose()


def test_write_commits_and_runs_after_commit_only_on_success(store):
    seen = []
    with store.write() as tx:
        tx.execute(INSERT_ACCOUNT, {"id": "a1", "handle": "alice"})
        tx.after_commit(lambda: seen.append("committed"))
    assert seen == ["committed"]
    with pytest.raises(RuntimeError):
        with store.write() as tx:
            tx.execute(INSERT_ACCOUNT, {"id": "a2", "handle": "bob"})
            tx.after_commit(lambda: seen.append("never"))
            raise RuntimeError("boom")
    assert seen == ["committed"]
    with store.read() as tx:
        assert tx.scalar(COUNT_ACCOUNTS) == 1


def test_savepoint_rolls_back_alone(store):
    with store.write() as tx:
        tx.execute(INSERT_ACCOUNT, {"id": "a1", "handle": "alice"})
        with pytest.raises(Exception):
            with tx.savepoint():
                tx.execute(INSERT_ACCOUNT, {"id": "a2", "handle": "bob"})
                tx.execute(INSERT_ACCOUNT, {"id": "a3", "handle": "alice"})  # unique violation
        tx.execute(INSERT_ACCOUNT, {"id": "a4", "handle": "carol"})
    with store.read() as tx:
        handles = sorted(r[0] for r in tx.raw("SELECT handle FROM accounts").fetchall())
    assert handles == ["alice", "carol"]


def test_dedicated_connection_reuses_one_connection(store):
    ded = store.dedicated()
    try:
        for i in range(3):
            with ded.write() as tx:
                tx.execute(INSERT_ACCOUNT, {"id": f"a{i}", "handle": f"h{i}"})
        with ded.read() as tx:
            assert tx.scalar(COUNT_ACCOUNTS) == 3
    finally:
        ded.close()


def test_transient_classification():
    import sqlite3

    busy = sqlite3.OperationalError("database is locked")
    busy.sqlite_errorcode = 5
    assert is_transient(busy)
    assert not is_transient(sqlite3.IntegrityError("UNIQUE constraint failed"))
    assert not is_transient(ValueError("x"))
