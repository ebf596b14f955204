"""The store engine: one SQLite file or one PostgreSQL database, behind the same ``Tx`` API.

SQLite: WAL, foreign keys on, a 5 s busy timeout, ``synchronous=NORMAL``. Every write
transaction starts with ``BEGIN IMMEDIATE`` under a process-wide writer lock, so there is
one writer and a deferred transaction never has to upgrade (an upgrade fails with BUSY
without honouring the busy timeout). Readers use their own pooled connections and never
block the writer.

PostgreSQL: psycopg 3 through SQLAlchemy's connection pool, READ COMMITTED. Ordering that
must follow commit order (a channel's ``channel_seq``) is taken from a row lock inside the
transaction, never from a sequence.

Both: statements are ``Stmt`` objects compiled once per dialect and run on the raw DBAPI
cursor (see ``sql.py``). ``Tx.after_commit`` callbacks run only once the commit succeeded;
the post path uses that to publish on the bus strictly after the row is durable.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import structlog

from ..clock import SYSTEM_CLOCK, Clock
from ..faults import Faults
from .sql import Stmt

log = structlog.get_logger("tidings.store")


def normalize_url(url: str) -> tuple[str, str]:
    """Map a user's ``--db`` value to (dialect, SQLAlchemy URL).

    A ``postgresql://`` or ``postgres://`` URL selects psycopg 3; anything else is a SQLite
    file path (``sqlite:///path`` is accepted too).
    """
    if url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        rest = url.split("://", 1)[1]
        return "postgresql", f"postgresql+psycopg://{rest}"
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
    elif url.startswith("sqlite://"):
        raise ValueError("an in-memory SQLite database cannot be shared by the engines; give a file path")
    else:
        path = url
    if not path:
        raise ValueError("empty database path")
    return "sqlite", f"sqlite+pysqlite:///{Path(path).expanduser()}"


def is_transient(exc: BaseException) -> bool:
    """True for errors that a retry of the same work may cure.

    SQLite: BUSY or LOCKED (primary result code 5 or 6). PostgreSQL: serialization failure,
    deadlock, or a lost connection. Never a constraint or data error.
    """
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            return (code & 0xFF) in (5, 6)
        text = str(exc)
        return "database is locked" in text or "database table is locked" in text
    try:
        import psycopg
        from psycopg import errors as pgerr
    except ImportError:  # pragma: no cover
        return False
    if isinstance(exc, (pgerr.SerializationFailure, pgerr.DeadlockDetected, pgerr.LockNotAvailable)):
        return True
    if isinstance(exc, psycopg.OperationalError):
        sqlstate = getattr(exc, "sqlstate", None)
        return sqlstate is None or sqlstate.startswith(("08", "57P"))
    if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None:
        return is_transient(exc.orig)
    return False


def is_integrity_error(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.IntegrityError):
        return True
    try:
        import psycopg
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, psycopg.IntegrityError)


class Tx:
    """One open transaction (or autocommit reads) on a raw DBAPI connection."""

    __slots__ = ("dbapi", "dialect", "_after", "_sp")

    def __init__(self, dbapi: Any, dialect: str) -> None:
        self.dbapi = dbapi
        self.dialect = dialect
        self._after: list[Callable[[], None]] = []
        self._sp = 0

    # -- execution ---------------------------------------------------------------------
    def execute(self, stmt: Stmt, params: dict[str, Any] | None = None) -> Any:
        sql, defaults = stmt.compiled(self.dialect)
        if defaults:
            params = {**defaults, **(params or {})}
        cur = self.dbapi.cursor()
        cur.execute(sql, params or {})
        return cur

    def all(self, stmt: Stmt, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        cur = self.execute(stmt, params)
        rows: list[tuple[Any, ...]] = cur.fetchall()
        cur.close()
        return rows

    def one(self, stmt: Stmt, params: dict[str, Any] | None = None) -> tuple[Any, ...] | None:
        cur = self.execute(stmt, params)
        row: tuple[Any, ...] | None = cur.fetchone()
        cur.close()
        return row

    def scalar(self, stmt: Stmt, params: dict[str, Any] | None = None) -> Any:
        row = self.one(stmt, params)
        return None if row is None else row[0]

    def rowcount(self, stmt: Stmt, params: dict[str, Any] | None = None) -> int:
        cur = self.execute(stmt, params)
        n: int = cur.rowcount
        cur.close()
        return n

    def mappings(self, stmt: Stmt, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        cur = self.execute(stmt, params)
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=False)) for r in cur.fetchall()]
        cur.close()
        return rows

    def mapping(self, stmt: Stmt, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        cur = self.execute(stmt, params)
        row = cur.fetchone()
        out = None if row is None else dict(zip([d[0] for d in cur.description], row, strict=False))
        cur.close()
        return out

    def raw(self, sql: str, params: Any = None) -> Any:
        """Run dialect-specific SQL text as is (migrations, diagnostics, tests)."""
        cur = self.dbapi.cursor()
        cur.execute(sql, params) if params is not None else cur.execute(sql)
        return cur

    # -- structure ---------------------------------------------------------------------
    def after_commit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once this transaction has committed; dropped on rollback."""
        self._after.append(fn)

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[Tx]:
        """A nested unit: rolled back alone on error, the outer transaction goes on.

        ``after_commit`` callbacks registered inside a rolled-back savepoint are dropped.
        """
        self._sp += 1
        name = f"sp_{self._sp}"
        mark = len(self._after)
        cur = self.dbapi.cursor()
        cur.execute(f"SAVEPOINT {name}")
        try:
            yield self
        except BaseException:
            cur.execute(f"ROLLBACK TO SAVEPOINT {name}")
            cur.execute(f"RELEASE SAVEPOINT {name}")
            del self._after[mark:]
            raise
        else:
            cur.execute(f"RELEASE SAVEPOINT {name}")
        finally:
            cur.close()


class Store:
    """A database and its migrations, with ``write()`` and ``read()`` transactions.

    ``write()`` commits on success, rolls back on any exception, then runs the
    ``after_commit`` callbacks. ``read()`` gives a consistent snapshot for several reads.
    """

    def __init__(
        self,
        url: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        faults: Faults | None = None,
        migrate: bool = True,
        pool_size: int | None = None,
    ) -> None:
        self.url = url
        self.dialect, sa_url = normalize_url(url)
        self.clock = clock
        self.faults = faults or Faults()
        self._writer_lock = threading.RLock()
        self.commits = 0
        if self.dialect == "sqlite":
            self.engine = sa.create_engine(
                sa_url,
                connect_args={"isolation_level": None, "check_same_thread": False, "timeout": 5.0},
                pool_size=pool_size or 8,
                max_overflow=48,
                pool_pre_ping=False,
            )
            sa.event.listen(self.engine, "connect", _sqlite_on_connect)
        else:
            self.engine = sa.create_engine(
                sa_url,
                pool_size=pool_size or 5,
                max_overflow=20,
                pool_pre_ping=True,
            )
        if migrate:
            from .migrate import migrate as run_migrations  # cycle: migrate.py needs Store (engine.py)

            run_migrations(self)

    # -- connections -------------------------------------------------------------------
    def raw_connection(self) -> Any:
        return self.engine.raw_connection()

    @contextlib.contextmanager
    def write(self) -> Iterator[Tx]:
        conn = self.engine.raw_connection()
        try:
            with _write_tx(self, conn.driver_connection) as tx:
                yield tx
        finally:
            conn.close()

    @contextlib.contextmanager
    def read(self) -> Iterator[Tx]:
        conn = self.engine.raw_connection()
        try:
            with _read_tx(self, conn.driver_connection) as tx:
                yield tx
        finally:
            conn.close()

    def dedicated(self, *, pg_settings: dict[str, str] | None = None) -> Dedicated:
        """A connection kept by one thread (a worker) for many transactions."""
        return Dedicated(self, pg_settings=pg_settings)

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def dispose(self) -> None:
        self.engine.dispose()

    close = dispose


class Dedicated:
    """One pooled connection held by a single thread; same ``write``/``read`` as ``Store``.

    Saves the pool checkout on hot loops (the ingest worker, the delivery consumer). Not
    shareable across threads.

    ``pg_settings`` (PostgreSQL only, ignored on SQLite): run-time parameters set for the
    whole session of this connection, applied again after ``reconnect``. A connection that
    carries them is never handed back to the pool: ``close`` discards it, so no other user
    of the pool ever inherits them.

    ``autocommit_read``/``autocommit_write`` skip the transaction brackets where they buy
    nothing (see each).
    """

    def __init__(self, store: Store, *, pg_settings: dict[str, str] | None = None) -> None:
        self.store = store
        self.pg_settings = dict(pg_settings or {}) if store.dialect == "postgresql" else {}
        self.conn = self._checkout()
        self.dbapi = self.conn.driver_connection

    def _checkout(self) -> Any:
        conn = self.store.engine.raw_connection()
        if self.pg_settings:
            try:
                dbapi: Any = conn.driver_connection
                cur = dbapi.cursor()
                for name, value in self.pg_settings.items():
                    cur.execute("SELECT set_config(%s, %s, false)", (name, value))
                cur.close()
                dbapi.commit()
            except BaseException:
                conn.invalidate()
                raise
        return conn

    def write(self) -> contextlib.AbstractContextManager[Tx]:
        return _write_tx(self.store, self.dbapi)

    def read(self) -> contextlib.AbstractContextManager[Tx]:
        return _read_tx(self.store, self.dbapi)

    def autocommit_read(self) -> contextlib.AbstractContextManager[Tx]:
        """Reads that need no snapshot shared between statements.

        PostgreSQL: autocommit, so no BEGIN and no ROLLBACK round trip. Each statement sees
        the data committed when it starts, which is exactly what a statement sees inside a
        READ COMMITTED ``read()``; but nothing transaction-scoped (``SET LOCAL``) works here.
        SQLite: the same snapshot as ``read()`` (its brackets cost no round trip).
        """
        if self.store.dialect == "postgresql":
            return _autocommit_tx(self.store, self.dbapi, limit=None)
        return _read_tx(self.store, self.dbapi)

    def autocommit_write(self) -> contextlib.AbstractContextManager[Tx]:
        """A write that is ONE statement on PostgreSQL (atomic on its own): autocommit, so no
        BEGIN and no COMMIT round trip; a second statement raises before it runs.
        SQLite: a ``write()`` transaction (BEGIN IMMEDIATE under the writer lock).
        ``after_commit`` callbacks run once the block has completed without an error.
        """
        if self.store.dialect == "postgresql":
            return _autocommit_tx(self.store, self.dbapi, limit=1)
        return _write_tx(self.store, self.dbapi)

    def reconnect(self) -> None:
        """Drop a broken connection and take a fresh one (after a lost PostgreSQL link)."""
        try:
            self.conn.invalidate()
        except Exception:  # noqa: BLE001 - best effort  # pragma: no cover
            pass
        self.conn = self._checkout()
        self.dbapi = self.conn.driver_connection

    def close(self) -> None:
        try:
            if self.pg_settings:
                self.conn.invalidate()  # never back to the pool with session settings
            else:
                self.conn.close()
        except Exception:  # noqa: BLE001 - closing a dead connection  # pragma: no cover
            pass


@contextlib.contextmanager
def _write_tx(store: Store, dbapi: Any) -> Iterator[Tx]:
    """One write transaction on ``dbapi``: commit on success, roll back on any exception,
    then run the ``after_commit`` callbacks (only after a successful commit)."""
    tx = Tx(dbapi, store.dialect)
    if store.dialect == "sqlite":
        with store._writer_lock:
            dbapi.execute("BEGIN IMMEDIATE")
            try:
                yield tx
                dbapi.execute("COMMIT")
            except BaseException:
                _rollback_quietly(dbapi)
                raise
    else:
        try:
            yield tx
            dbapi.commit()
        except BaseException:
            _rollback_quietly(dbapi)
            raise
    store.commits += 1
    for fn in tx._after:
        fn()


@contextlib.contextmanager
def _read_tx(store: Store, dbapi: Any) -> Iterator[Tx]:
    """A read-only snapshot on ``dbapi``, always rolled back."""
    tx = Tx(dbapi, store.dialect)
    if store.dialect == "sqlite":
        dbapi.execute("BEGIN")
    try:
        yield tx
    finally:
        _rollback_quietly(dbapi)


class _AutocommitTx(Tx):
    """A ``Tx`` on a PostgreSQL connection in autocommit mode: every statement commits on
    its own, so ``limit`` (when set) caps how many may run in one block."""

    __slots__ = ("_left",)

    def __init__(self, dbapi: Any, dialect: str, limit: int | None) -> None:
        super().__init__(dbapi, dialect)
        self._left = limit

    def _count(self) -> None:
        if self._left is not None:
            if self._left <= 0:
                raise RuntimeError("an autocommit write runs one statement; use write() for more")
            self._left -= 1

    def execute(self, stmt: Stmt, params: dict[str, Any] | None = None) -> Any:
        self._count()
        return super().execute(stmt, params)

    def raw(self, sql: str, params: Any = None) -> Any:
        self._count()
        return super().raw(sql, params)

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[Tx]:
        raise RuntimeError("no savepoint outside a transaction")
        yield self  # pragma: no cover


@contextlib.contextmanager
def _autocommit_tx(store: Store, dbapi: Any, *, limit: int | None) -> Iterator[Tx]:
    """PostgreSQL statements outside any transaction block (see ``Dedicated``)."""
    tx = _AutocommitTx(dbapi, store.dialect, limit)
    dbapi.autocommit = True
    try:
        yield tx
    finally:
        try:
            dbapi.autocommit = False
        except Exception:  # noqa: BLE001 - a broken connection: its owner replaces it
            pass
    if limit is not None:
        store.commits += 1
        for fn in tx._after:
            fn()


def _rollback_quietly(dbapi: Any) -> None:
    try:
        if isinstance(dbapi, sqlite3.Connection):
            if dbapi.in_transaction:
                dbapi.execute("ROLLBACK")
        else:
            dbapi.rollback()
    except Exception:  # noqa: BLE001 - the connection is gone; the pool will discard it
        pass


def _sqlite_on_connect(dbapi: sqlite3.Connection, _record: Any) -> None:
    dbapi.isolation_level = None
    cur = dbapi.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()
