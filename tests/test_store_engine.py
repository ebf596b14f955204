"""The store engine on both backends: migrations, transactions, savepoints, after-commit."""

from __future__ import annotations

import sqlite3
import threading

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


def test_a_callbacks_unit_that_fails_drops_only_its_own_after_commit_callbacks(store):
    """``Tx.callbacks``: a unit with no statement of its own (a batched frame's) drops the
    ``after_commit`` callbacks registered inside it when it fails, as a savepoint does, and
    keeps them when it succeeds; the transaction goes on either way."""
    seen: list[str] = []
    with store.write() as tx:
        tx.after_commit(lambda: seen.append("before"))
        with pytest.raises(RuntimeError), tx.callbacks() as unit:
            assert unit is tx
            tx.after_commit(lambda: seen.append("failed unit"))
            raise RuntimeError("the unit fails")
        with tx.callbacks():
            tx.after_commit(lambda: seen.append("good unit"))
        tx.after_commit(lambda: seen.append("after"))
    assert seen == ["before", "good unit", "after"]


class _FailsOn:
    """A SQLite connection whose ``sql`` fails as a busy database does."""

    def __init__(self, real: sqlite3.Connection, sql: str) -> None:
        self.real, self.sql = real, sql

    def execute(self, sql: str, *args: object) -> object:
        if sql == self.sql:
            raise sqlite3.OperationalError("database is locked")
        return self.real.execute(sql, *args)


def _free_elsewhere(lock: object) -> bool:
    """Whether another thread can take ``lock`` now (without waiting)."""
    got: list[bool] = []

    def take() -> None:
        ok = lock.acquire(blocking=False)  # type: ignore[attr-defined]
        got.append(ok)
        if ok:
            lock.release()  # type: ignore[attr-defined]

    thread = threading.Thread(target=take)
    thread.start()
    thread.join()
    return got == [True]


@pytest.mark.sqlite_only
@pytest.mark.parametrize("failing", ["BEGIN IMMEDIATE", "COMMIT"])
def test_a_write_whose_begin_or_commit_fails_releases_the_writer_lock(store, failing):
    """SQLite's writer lock is held from ``BEGIN IMMEDIATE`` to the end of the transaction,
    however it ends: a write that cannot begin, or cannot commit, leaves it free for the
    next writer (another thread would wait on it forever), and runs no callback."""
    conn = store.dedicated()
    real = conn.dbapi
    conn.dbapi = _FailsOn(real, failing)
    seen: list[str] = []
    with pytest.raises(sqlite3.OperationalError, match="database is locked"), conn.write() as tx:
        tx.after_commit(lambda: seen.append("committed"))
    assert seen == []
    assert _free_elsewhere(store._writer_lock)
    if real.in_transaction:
        real.execute("ROLLBACK")
    conn.dbapi = real
    conn.close()


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


# -- the pool's liveness check (PostgreSQL) ------------------------------------------------
def _count_pings(store, monkeypatch) -> list[int]:
    """Count the pool's liveness pings (``dialect.do_ping``, the ``SELECT 1`` a checkout
    may send) of ``store``."""
    pings: list[int] = []
    original = store.engine.dialect.do_ping

    def do_ping(dbapi_connection):
        pings.append(1)
        return original(dbapi_connection)

    monkeypatch.setattr(store.engine.dialect, "do_ping", do_ping)
    return pings


def _backend_pid(store) -> int:
    with store.write() as tx:
        return int(tx.raw("SELECT pg_backend_pid()").fetchone()[0])


def _terminate_other_backends(store) -> None:
    """The server drops every connection of the store's database but this admin one."""
    import psycopg

    from tidings.store.engine import normalize_url

    url = normalize_url(store.url)[1].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture
def pooled(backend_url, clock, faults):
    """A store whose pool measures idleness on the test's clock (``pool_clock``)."""
    s = Store(backend_url, clock=clock, faults=faults, pool_clock=clock)
    yield s
    s.dispose()


@pytest.mark.postgres_only
def test_a_connection_used_within_the_idle_limit_is_checked_out_without_a_ping(pooled, clock, monkeypatch):
    store = pooled
    pings = _count_pings(store, monkeypatch)
    _backend_pid(store)
    clock.advance(500)
    for _ in range(3):
        with store.write() as tx:
            tx.execute(INSERT_ACCOUNT, {"id": f"a{_}", "handle": f"h{_}"})
        with store.read() as tx:
            tx.scalar(COUNT_ACCOUNTS)
    assert pings == []
    clock.advance(1_001)  # idle in the pool longer than a second: pinged once
    with store.read() as tx:
        assert tx.scalar(COUNT_ACCOUNTS) == 3
    assert pings == [1]


@pytest.mark.postgres_only
def test_a_connection_killed_while_idle_in_the_pool_is_replaced_not_surfaced(pooled, clock, monkeypatch):
    store = pooled
    pings = _count_pings(store, monkeypatch)
    pid = _backend_pid(store)
    _terminate_other_backends(store)
    clock.advance(1_001)
    with store.write() as tx:  # no error: the ping found it dead and the pool replaced it
        tx.execute(INSERT_ACCOUNT, {"id": "a1", "handle": "alice"})
        assert int(tx.raw("SELECT pg_backend_pid()").fetchone()[0]) != pid
    assert pings, "the idle connection was pinged"
    with store.read() as tx:
        assert tx.scalar(COUNT_ACCOUNTS) == 1


@pytest.mark.postgres_only
def test_the_pool_measures_idleness_in_real_time_not_on_the_hubs_clock(store, clock, monkeypatch):
    """A replay or the bench pins the hub's clock to each frame's receipt time, minutes
    apart: that must not make every checkout look idle (a ping a transaction)."""
    pings = _count_pings(store, monkeypatch)
    _backend_pid(store)
    for i in range(3):
        clock.advance(60_000)
        with store.write() as tx:
            tx.execute(INSERT_ACCOUNT, {"id": f"r{i}", "handle": f"r{i}"})
    assert pings == []


@pytest.mark.postgres_only
def test_a_connection_a_statement_found_broken_is_replaced_at_the_next_checkout_for_free(store, monkeypatch):
    from tidings.store.engine import is_transient

    pings = _count_pings(store, monkeypatch)
    _backend_pid(store)
    _terminate_other_backends(store)
    with pytest.raises(Exception) as lost:  # used at once: the statement meets the lost link
        with store.write() as tx:
            tx.execute(INSERT_ACCOUNT, {"id": "a1", "handle": "alice"})
    assert is_transient(lost.value)
    with store.write() as tx:  # the broken connection is not handed out again
        tx.execute(INSERT_ACCOUNT, {"id": "a2", "handle": "bob"})
    assert pings == []
