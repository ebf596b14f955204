"""The store engine: one SQLite file or one PostgreSQL database, behind the same ``Tx`` API.

SQLite: WAL, foreign keys on, a 5 s busy timeout, ``synchronous=NORMAL``. Every write
transaction starts with ``BEGIN IMMEDIATE`` under a process-wide writer lock, so there is
one writer and a deferred transaction never has to upgrade (an upgrade fails with BUSY
without honouring the busy timeout). Readers use their own pooled connections and never
block the writer. The WAL is checkpointed by a thread beside the writer, every
``checkpoints.EVERY_COMMITS`` commits, with SQLite's own checkpoint kept as a backstop at a
larger WAL (``checkpoints.py``, D128).

PostgreSQL: psycopg 3 through SQLAlchemy's connection pool, READ COMMITTED. Ordering that
must follow commit order (a channel's ``channel_seq``) is taken from a row lock inside the
transaction, never from a sequence.

Both: statements are ``Stmt`` objects compiled once per dialect (see ``sql.py``). SQLite
runs them on the raw DBAPI cursor; PostgreSQL sends them through ``pg_wire``: libpq
pipelines of statements the store prepares once per connection, with psycopg's own
parameter and row adaptation but not its per-cursor machinery (D101).

Round trips (PostgreSQL): a statement whose result nobody reads and whose effect ends with
the transaction (``BEGIN``, ``SAVEPOINT``, ``RELEASE SAVEPOINT``, a transaction-scoped
advisory lock: ``Tx.defer``) is not sent on its own. It waits in the ``Tx`` and goes out in
one pipeline with the next statement that is sent, in the order they were issued, so one
round trip carries them all. What still waits at ``COMMIT`` or ``ROLLBACK`` is dropped: the
transaction's end releases savepoints and locks anyway. Writes sent behind (``Tx.later``,
with ``Tx.write_behind`` on; D105) wait the same way but are never dropped: the ``COMMIT``
carries them, and one that fails outside the savepoint it was issued in loses the
transaction (``WriteBehindFailed``). A savepoint inside which no
statement was sent is rolled back or released for free. ``Store.meter`` counts statements
sent, round trips and commits (SQLite: every statement is one call into the library,
counted as one round trip). ``Tx.after_commit`` callbacks run only once the commit
succeeded; the post path uses that to publish on the bus strictly after the row is durable.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import psycopg
import sqlalchemy as sa
import structlog

from ..clock import SYSTEM_CLOCK, Clock
from ..faults import Faults
from .checkpoints import BACKSTOP_PAGES, Checkpointer
from .pg_wire import Entry, Result, Wire, wire_of
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


def is_database_error(exc: BaseException) -> bool:
    """True for any error the database driver raised (a statement failed)."""
    return isinstance(exc, sqlite3.Error | psycopg.Error | sa.exc.DBAPIError)


def is_integrity_error(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.IntegrityError):
        return True
    try:
        import psycopg
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, psycopg.IntegrityError)


class Meter:
    """Statements sent, round trips and commits of one store, cumulative (read the
    difference over a run). Incremented without a lock: exact for one thread at a time,
    approximate under concurrent writers (a diagnostic, not a guarantee)."""

    __slots__ = ("statements", "round_trips", "commits")

    def __init__(self) -> None:
        self.statements = 0
        self.round_trips = 0
        self.commits = 0

    def snapshot(self) -> dict[str, int]:
        return {"statements": self.statements, "round_trips": self.round_trips, "commits": self.commits}


_NO_METER = Meter()  # for a Tx built without a store (tests); never read

# psycopg's TransactionStatus.IDLE: no transaction open, so the next statement of a
# non-autocommit connection is preceded by an implicit BEGIN.
_PG_IDLE = 0
_PG_INTRANS = 2  # psycopg's TransactionStatus.INTRANS: a transaction is open and healthy
_BEGIN: Entry = ("BEGIN", None, None)
_COMMIT_ENTRY: Entry = ("COMMIT", None, None)
_SAVEPOINT_WORDS = ("SAVEPOINT ", "RELEASE SAVEPOINT ")
_COMMIT: list[Entry] = [_COMMIT_ENTRY]
_ROLLBACK: list[Entry] = [("ROLLBACK", None, None)]


class WriteBehindFailed(Exception):
    """A write sent behind (``Tx.later``) failed where no savepoint of its own could take it
    back: after the savepoint it was issued in had ended, or at ``COMMIT``. The transaction
    is lost (rolled back whole); ``__cause__`` is the database's error. Whoever enabled
    ``Tx.write_behind`` runs the work again without it (``Ingest.append``)."""


class _Later(Result):
    """The ``Result`` of a write sent behind; ``scope`` is the savepoint it was issued in
    (None: outside any)."""

    __slots__ = ("scope",)

    def __init__(self, scope: str | None) -> None:
        super().__init__()
        self.scope = scope


class Done:
    """The row count of a write that ran at once (``Tx.later`` on SQLite, or with
    ``write_behind`` off), read like a ``Result``'s."""

    __slots__ = ("rowcount",)

    def __init__(self, rowcount: int) -> None:
        self.rowcount = rowcount


class Rows:
    """How many rows some writes wrote (``Tx.later``), read when needed.

    ``int(rows)``, ``bool(rows)`` and ``rows == n`` first send whatever waits in the
    transaction if one of the writes has not run yet (one round trip), so reading early
    costs time, never a wrong answer. ``known`` says whether reading costs nothing now;
    after the commit it always does. ``a + b`` counts both."""

    __slots__ = ("_tx", "_parts")

    def __init__(self, tx: Tx | None, parts: tuple[Result | Done, ...]) -> None:
        self._tx = tx
        self._parts = parts

    def known(self) -> bool:
        return all(part.rowcount >= 0 for part in self._parts)

    def __int__(self) -> int:
        if self._tx is not None and not self.known():
            self._tx.flush()
        return sum(max(part.rowcount, 0) for part in self._parts)

    __index__ = __int__

    def __bool__(self) -> bool:
        return int(self) > 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Rows | int):
            return int(self) == int(other)
        return NotImplemented

    def __lt__(self, other: Rows | int) -> bool:
        return int(self) < int(other)

    def __le__(self, other: Rows | int) -> bool:
        return int(self) <= int(other)

    def __gt__(self, other: Rows | int) -> bool:
        return int(self) > int(other)

    def __ge__(self, other: Rows | int) -> bool:
        return int(self) >= int(other)

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Rows | int) -> Rows:
        if isinstance(other, Rows):
            return Rows(self._tx or other._tx, self._parts + other._parts)
        if other == 0:
            return self
        return Rows(self._tx, (*self._parts, Done(int(other))))

    __radd__ = __add__

    def __repr__(self) -> str:
        return f"Rows({int(self) if self.known() else '?'})"


NO_ROWS = Rows(None, ())


class Tx:
    """One open transaction (or autocommit reads) on a raw DBAPI connection.

    PostgreSQL: ``_pending`` holds what waits to be sent (deferred statements, read-ahead
    reads; see the module docstring) as ``pg_wire.Entry`` ``(sql, params, Result or
    None)``; ``_send`` puts it, and the implicit ``BEGIN`` of a fresh transaction, in one
    pipeline with the statement it sends. ``_ahead`` maps a read-ahead read's key to its
    ``Result``, used once (or withdrawn: ``drop_ahead``). ``_open`` names the savepoints
    open now, innermost last. ``write_behind`` (off unless the owner turns it on):
    ``later`` writes wait for the next statement or the ``COMMIT`` (see ``later``).
    """

    __slots__ = ("dbapi", "dialect", "_after", "_sp", "_pending", "_ahead", "meter", "_begun", "_wire",
                 "_open", "write_behind", "_lost")

    def __init__(self, dbapi: Any, dialect: str, meter: Meter | None = None) -> None:
        self.dbapi = dbapi
        self.dialect = dialect
        self._after: list[Callable[[], None]] = []
        self._sp = 0
        self._pending: list[tuple[str, Any, Any]] = []
        self._ahead: dict[tuple[Any, ...], Any] = {}
        self.meter = meter or _NO_METER
        self._begun = False  # PostgreSQL: this transaction's BEGIN has gone out
        self._wire: Wire | None = None
        self._open: list[str] = []
        self.write_behind = False
        self._lost = False  # a write sent behind failed outside its savepoint: nothing can be saved

    # -- execution ---------------------------------------------------------------------
    def execute(self, stmt: Stmt, params: dict[str, Any] | None = None) -> Any:
        if self._ahead:
            cur = self._ahead.pop(_ahead_key(stmt, params), None)
            if cur is not None:
                if any(entry[2] is cur for entry in self._pending):
                    self.flush()
                return cur
        # (``Stmt.compiled``'s cache read inline: every statement of every frame comes here)
        sql, defaults = stmt._compiled.get(self.dialect) or stmt.compiled(self.dialect)
        if defaults:
            params = {**defaults, **(params or {})}
        return self._send(sql, params or {})

    def _send(self, sql: str, params: Any) -> Any:
        """Send one statement (with whatever waits before it) and return its cursor
        (PostgreSQL: its ``pg_wire.Result``)."""
        meter = self.meter
        meter.round_trips += 1
        if self.dialect != "postgresql":
            cur = self.dbapi.cursor()
            meter.statements += 1
            cur.execute(sql, params)
            return cur
        result = Result()
        self._run_pending((sql, params, result))
        return result

    def flush(self) -> None:
        """Send whatever waits (PostgreSQL), in one round trip."""
        if not self._pending:
            return
        self.meter.round_trips += 1
        self._run_pending(None)

    def _run_pending(self, last: Entry | None) -> None:
        """PostgreSQL: the implicit ``BEGIN`` of a fresh transaction, what waits, then
        ``last``, in one pipeline (``pg_wire.Wire.run``); the caller counted the round trip."""
        dbapi = self.dbapi
        batch = self._pending
        self._pending = []
        if last is not None:
            batch.append(last)
        if not dbapi.autocommit and dbapi.pgconn.transaction_status == _PG_IDLE:
            batch.insert(0, _BEGIN)
            self._begun = True
        self.meter.statements += len(batch)
        wire = self._wire
        if wire is None:
            wire = self._wire = wire_of(dbapi)
        try:
            wire.run(batch)
        except Exception as exc:
            owner = getattr(exc, "tidings_result", None)
            if isinstance(owner, _Later) and (not self._open or owner.scope != self._open[-1]):
                # Not inside the savepoint it was issued in (or in none): none can take it back alone.
                self._lost = True
                self._pending = []
                self._ahead.clear()
                raise WriteBehindFailed(f"a write sent behind failed: {type(exc).__name__}: {exc}") from exc
            raise

    def later(self, stmt: Stmt, params: dict[str, Any] | None = None) -> Rows:
        """Run the write ``stmt``; its row count (``Rows``) is best read once the
        transaction has committed (an ``after_commit`` callback), or never.

        PostgreSQL with ``write_behind`` on: it waits and goes out in the round trip of the
        next statement sent, or with the ``COMMIT`` (never dropped), in the order issued, so
        every later statement sees its effect. If it fails inside the savepoint it was
        issued in, the error is raised there as usual; anywhere else (a later savepoint, the
        ``COMMIT``) ``WriteBehindFailed`` is raised and the transaction is lost.
        Otherwise (SQLite, or ``write_behind`` off): it runs now."""
        if self.write_behind and self.dialect == "postgresql" and (
            not self._ahead or _ahead_key(stmt, params) not in self._ahead
        ):  # (a write sent ahead already is taken as ``execute`` takes it)
            sql, defaults = stmt.compiled(self.dialect)
            if defaults:
                params = {**defaults, **(params or {})}
            result = _Later(self._open[-1] if self._open else None)
            self._pending.append((sql, params or {}, result))
            return Rows(self, (result,))
        cur = self.execute(stmt, params)
        if self.dialect == "postgresql":
            return Rows(self, (cast(Result, cur),))
        done = Done(cur.rowcount)
        cur.close()
        return Rows(self, (done,))

    def commit_behind(self) -> bool:
        """PostgreSQL, at commit: when writes sent behind still wait, send them, whatever
        else waits, and the ``COMMIT`` in one round trip, and return True (a failure
        raises, see ``later``). Otherwise drop what waits (``end``) and return False: the
        caller commits as usual."""
        pending = self._pending
        if not any(isinstance(entry[2], _Later) for entry in pending):
            self.end()
            return False
        self._ahead.clear()
        # A savepoint still waiting now protects nothing (any failure from here on loses the
        # transaction) and COMMIT releases them all: only the rest goes, in order.
        self._pending = [entry for entry in pending if not entry[0].startswith(_SAVEPOINT_WORDS)]
        self._pending.append(_COMMIT_ENTRY)
        self.meter.round_trips += 1
        self._run_pending(None)
        return True

    def defer(self, stmt: Stmt, params: dict[str, Any] | None = None) -> None:
        """Run ``stmt``, whose result nobody reads and whose effect lasts only until the
        transaction ends, no later than the next statement sent (PostgreSQL: in that
        statement's round trip; dropped if the transaction ends first). SQLite: now."""
        sql, defaults = stmt.compiled(self.dialect)
        if defaults:
            params = {**defaults, **(params or {})}
        if self.dialect == "postgresql":
            self._pending.append((sql, params or {}, None))
        else:
            self._send(sql, params or {}).close()

    def read_ahead(self, stmt: Stmt, params: dict[str, Any] | None = None) -> None:
        """Announce a read this transaction will run soon with exactly these ``params``:
        PostgreSQL sends it in the round trip of the next statement, and that later
        ``execute`` of the same statement and params takes its result instead of sending
        it again (once). Only for reads that nothing written in between may change (the
        caller's promise; under READ COMMITTED each statement sees what was committed when
        it started, so an earlier start is what a concurrent commit may change anyway).
        SQLite: nothing (a statement there costs no round trip)."""
        self._queue_ahead(stmt, params)

    def drop_ahead(self, stmt: Stmt, params: dict[str, Any] | None = None) -> None:
        """Withdraw a ``read_ahead`` the caller will not read after all: its answer is never
        handed to a later read of the same statement and params, which may come after
        writes the answer predates. (It may still be sent; its result is just unused.)"""
        if self._ahead:
            self._ahead.pop(_ahead_key(stmt, params), None)

    def send_ahead(self, stmt: Stmt, params: dict[str, Any] | None = None) -> None:
        """``read_ahead`` for a write the caller runs next for certain (unless an error
        ends the unit first, which takes the write back with it), whose parameters are
        known already and which no statement sent before it may change. PostgreSQL: sent
        in the round trip of the next statement, possibly before it."""
        self._queue_ahead(stmt, params)

    def _queue_ahead(self, stmt: Stmt, params: dict[str, Any] | None) -> None:
        if self.dialect != "postgresql":
            return
        key = _ahead_key(stmt, params)
        if key in self._ahead:
            return
        sql, defaults = stmt.compiled(self.dialect)
        if defaults:
            params = {**defaults, **(params or {})}
        result = Result()
        self._pending.append((sql, params or {}, result))
        self._ahead[key] = result

    def active(self) -> bool:
        """Whether this write transaction is still open and usable. False once something
        ended it under its owner (SQLite rolls a transaction back by itself on some errors,
        after which statements would autocommit one by one; a stray ``ROLLBACK``), or once
        a PostgreSQL error left it aborted outside any savepoint."""
        if self.dialect != "postgresql":
            return bool(self.dbapi.in_transaction)
        if self._lost:
            return False
        status = self.dbapi.info.transaction_status
        return status == _PG_INTRANS or (status == _PG_IDLE and not self._begun)

    def end(self) -> None:
        """The transaction is about to end: what was only deferred ends with it and is
        dropped (see ``defer``); an unread read-ahead is dropped too. (A commit sends the
        writes that wait behind first: ``commit_behind``.)"""
        self._pending.clear()
        self._ahead.clear()

    def execute_many(self, stmt: Stmt, rows: list[dict[str, Any]]) -> int:
        """SQLite: run ``stmt`` once per parameter dict of ``rows``, in one call into the
        library (``executemany``: compiled once, bound per row); the rows written."""
        if self.dialect != "sqlite":
            raise RuntimeError("execute_many is SQLite's; PostgreSQL sends rows as one statement")
        sql, defaults = stmt.compiled(self.dialect)
        if defaults:
            rows = [{**defaults, **row} for row in rows]
        meter = self.meter
        meter.statements += 1
        meter.round_trips += 1
        cur = self.dbapi.cursor()
        try:
            cur.executemany(sql, rows)
            return int(cur.rowcount)
        finally:
            cur.close()

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
        """Run dialect-specific SQL text as is (migrations, diagnostics, tests); never
        pipelined, since the text may hold several statements."""
        meter = self.meter
        if self._pending:
            self.flush()
        elif self.dialect == "postgresql" and not self.dbapi.autocommit and self.dbapi.info.transaction_status == _PG_IDLE:
            meter.statements += 1  # psycopg's implicit BEGIN, its own round trip here
            meter.round_trips += 1
            self._begun = True
        meter.statements += 1
        meter.round_trips += 1
        cur = self.dbapi.cursor()
        cur.execute(sql, params) if params is not None else cur.execute(sql)
        return cur

    # -- structure ---------------------------------------------------------------------
    def after_commit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once this transaction has committed; dropped on rollback."""
        self._after.append(fn)

    def callbacks(self) -> _Callbacks:
        """A unit of work that sends no statement of its own (its writes are kept in memory,
        ``ingest/batch.py``): on error, the ``after_commit`` callbacks registered inside are
        dropped, as a savepoint drops them. Cheaper than a savepoint, which SQLite runs."""
        return _Callbacks(self)

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[Tx]:
        """A nested unit: rolled back alone on error, the outer transaction goes on.

        ``after_commit`` callbacks registered inside a rolled-back savepoint are dropped.
        """
        self._sp += 1
        name = f"sp_{self._sp}"
        mark = len(self._after)
        if self.dialect != "postgresql":
            cur = self.dbapi.cursor()
            meter = self.meter
            meter.statements += 1
            meter.round_trips += 1
            cur.execute(f"SAVEPOINT {name}")
            try:
                yield self
            except BaseException:
                meter.statements += 2
                meter.round_trips += 2
                cur.execute(f"ROLLBACK TO SAVEPOINT {name}")
                cur.execute(f"RELEASE SAVEPOINT {name}")
                del self._after[mark:]
                raise
            else:
                meter.statements += 1
                meter.round_trips += 1
                cur.execute(f"RELEASE SAVEPOINT {name}")
            finally:
                cur.close()
            return
        # PostgreSQL: SAVEPOINT and RELEASE wait for the next statement (``defer``).
        entry = (f"SAVEPOINT {name}", None, None)
        self._pending.append(entry)
        self._open.append(name)
        announced = set(self._ahead)
        try:
            yield self
        except BaseException:
            del self._after[mark:]
            self._open.pop()
            if self._lost:
                raise  # a write sent behind broke the transaction: nothing to roll back to
            if not self._drop_unsent(entry):
                # Everything still waiting was issued after the SAVEPOINT went out, i.e.
                # inside it: it goes with the rollback, unsent (the transaction is
                # aborted until the ROLLBACK TO, so it could not run first anyway).
                self._pending = []
                self._ahead.clear()
                self._send(f"ROLLBACK TO SAVEPOINT {name}", None).close()
                self._pending.append((f"RELEASE SAVEPOINT {name}", None, None))
            raise
        else:
            self._open.pop()
            if self._ahead:
                # A read announced inside and never read is forgotten with the savepoint: it
                # must not answer a later read of the same row after writes it predates.
                for key in [k for k in self._ahead if k not in announced]:
                    del self._ahead[key]
            if not self._drop_unsent(entry, keep_writes=True):
                self._pending.append((f"RELEASE SAVEPOINT {name}", None, None))

    def _drop_unsent(self, entry: tuple[str, Any, Any], keep_writes: bool = False) -> bool:
        """If the SAVEPOINT ``entry`` was never sent, forget it and everything issued after
        it (nothing of that savepoint reached the server, read-aheads included); True when
        it did so. ``keep_writes`` (the savepoint succeeded): a write sent behind inside it
        must still run, so nothing is dropped and False is returned."""
        pending = self._pending
        for i in range(len(pending) - 1, -1, -1):
            if pending[i] is entry:
                if keep_writes and any(isinstance(e[2], _Later) for e in pending[i:]):
                    return False
                dropped = {id(e[2]) for e in pending[i:] if e[2] is not None}
                if dropped:
                    self._ahead = {k: c for k, c in self._ahead.items() if id(c) not in dropped}
                del pending[i:]
                return True
        return False


def _ahead_key(stmt: Stmt, params: dict[str, Any] | None) -> tuple[Any, ...]:
    return (id(stmt), tuple(sorted(params.items())) if params else ())


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
        pool_clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.url = url
        self.dialect, sa_url = normalize_url(url)
        self.clock = clock
        self.faults = faults or Faults()
        self._writer_lock = threading.RLock()
        self.meter = Meter()
        if self.dialect == "sqlite":
            self.engine = sa.create_engine(
                sa_url,
                connect_args={"isolation_level": None, "check_same_thread": False, "timeout": 5.0},
                pool_size=pool_size or 8,
                max_overflow=48,
                pool_pre_ping=False,
            )
            sa.event.listen(self.engine, "connect", _sqlite_on_connect)
            self.checkpointer: Checkpointer | None = Checkpointer(
                cast(str, self.engine.url.database), self.faults)
        else:
            self.checkpointer = None
            self.engine = sa.create_engine(
                sa_url,
                pool_size=pool_size or 5,
                max_overflow=20,
                pool_pre_ping=False,  # ``_ping_when_idle`` instead: no round trip per checkout
            )
            # Idleness is real time, whatever clock the hub's logic runs on (a replay pins
            # ``clock`` to each frame's receipt time, minutes apart): tests pass their own.
            _ping_when_idle(self.engine, pool_clock)
            sa.event.listen(self.engine, "connect", _pg_on_connect)
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
            with _WriteTx(self, conn.driver_connection) as tx:
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

    @property
    def commits(self) -> int:
        """Commits of write transactions so far (``meter.commits``)."""
        return self.meter.commits

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def dispose(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
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
        return _WriteTx(self.store, self.dbapi)

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
        return _WriteTx(self.store, self.dbapi)

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


class _Callbacks:
    """``Tx.callbacks``: a plain class, so that a frame's unit costs no generator."""

    __slots__ = ("tx", "mark")

    def __init__(self, tx: Tx) -> None:
        self.tx = tx
        self.mark = 0

    def __enter__(self) -> Tx:
        self.mark = len(self.tx._after)
        return self.tx

    def __exit__(self, kind: object, _exc: object, _tb: object) -> None:
        if kind is not None:
            del self.tx._after[self.mark:]


class _WriteTx:
    """One write transaction on ``dbapi``: commit on success, roll back on any exception,
    then run the ``after_commit`` callbacks (only after a successful commit). On SQLite the
    store's writer lock is held from ``BEGIN IMMEDIATE`` to the ``COMMIT`` or the rollback.
    A plain class rather than a generator: every append runs one."""

    __slots__ = ("store", "dbapi", "tx")

    def __init__(self, store: Store, dbapi: Any) -> None:
        self.store = store
        self.dbapi = dbapi
        self.tx: Tx | None = None

    def __enter__(self) -> Tx:
        store, dbapi = self.store, self.dbapi
        meter = store.meter
        tx = self.tx = Tx(dbapi, store.dialect, meter)
        if store.dialect == "sqlite":
            lock = store._writer_lock
            lock.acquire()
            try:
                meter.statements += 1
                meter.round_trips += 1
                dbapi.execute("BEGIN IMMEDIATE")
            except BaseException:
                lock.release()
                raise
        return tx

    def __exit__(self, kind: object, _exc: object, _tb: object) -> None:
        dbapi, meter, tx = self.dbapi, self.store.meter, cast(Tx, self.tx)
        if self.store.dialect == "sqlite":
            try:
                if kind is not None:
                    _rollback_quietly(dbapi, meter)
                    return
                try:
                    meter.statements += 1
                    meter.round_trips += 1
                    dbapi.execute("COMMIT")
                except BaseException:
                    _rollback_quietly(dbapi, meter)
                    raise
                checkpointer = self.store.checkpointer
                if checkpointer is not None:
                    checkpointer.committed()  # (under the writer lock: the count needs no lock)
            finally:
                self.store._writer_lock.release()
        else:
            if kind is not None:
                tx.end()
                _rollback_quietly(dbapi, meter)
                return
            try:
                if not tx.commit_behind() and dbapi.info.transaction_status != _PG_IDLE:
                    meter.statements += 1
                    meter.round_trips += 1
                    wire_of(dbapi).run(_COMMIT)
            except BaseException:
                tx.end()
                _rollback_quietly(dbapi, meter)
                raise
        meter.commits += 1
        for fn in tx._after:
            fn()


@contextlib.contextmanager
def _read_tx(store: Store, dbapi: Any) -> Iterator[Tx]:
    """A read-only snapshot on ``dbapi``, always rolled back."""
    meter = store.meter
    tx = Tx(dbapi, store.dialect, meter)
    if store.dialect == "sqlite":
        meter.statements += 1
        meter.round_trips += 1
        dbapi.execute("BEGIN")
    try:
        yield tx
    finally:
        tx.end()
        _rollback_quietly(dbapi, meter)


class _AutocommitTx(Tx):
    """A ``Tx`` on a PostgreSQL connection in autocommit mode: every statement commits on
    its own, so ``limit`` (when set) caps how many may run in one block."""

    __slots__ = ("_left",)

    def __init__(self, dbapi: Any, dialect: str, limit: int | None, meter: Meter | None = None) -> None:
        super().__init__(dbapi, dialect, meter)
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
    tx = _AutocommitTx(dbapi, store.dialect, limit, store.meter)
    dbapi.autocommit = True
    try:
        yield tx
    finally:
        try:
            dbapi.autocommit = False
        except Exception:  # noqa: BLE001 - a broken connection: its owner replaces it
            pass
    if limit is not None:
        store.meter.commits += 1
        for fn in tx._after:
            fn()


def _rollback_quietly(dbapi: Any, meter: Meter = _NO_METER) -> None:
    try:
        if isinstance(dbapi, sqlite3.Connection):
            if dbapi.in_transaction:
                meter.statements += 1
                meter.round_trips += 1
                dbapi.execute("ROLLBACK")
        else:
            if dbapi.info.transaction_status != _PG_IDLE:
                meter.statements += 1
                meter.round_trips += 1
                wire_of(dbapi).run(_ROLLBACK)
    except Exception:  # noqa: BLE001 - the connection is gone; the pool will discard it
        pass


#: A pooled PostgreSQL connection idle longer than this (store clock) is pinged at checkout.
PING_IDLE_MS = 1_000


def _ping_when_idle(engine: sa.engine.Engine, clock: Clock) -> None:
    """The pool's liveness check without a round trip per checkout.

    ``pool_pre_ping`` sends ``SELECT 1`` at every checkout, i.e. one more round trip for
    every ``Store.write()``/``read()``. Instead, a connection that sat in the pool longer
    than ``PING_IDLE_MS`` is pinged first; a failed ping raises ``InvalidatePoolError``:
    the pool discards this connection and every one pooled before it (a lost link usually
    means the server restarted) and connects afresh, the recovery pre-ping gives. (A
    connection a statement found broken never comes back: its reset at checkin fails, and
    the pool discards it then.) A connection used within the last second is handed out as is:
    if the server dropped it in that second, its next statement fails with a transient
    error (``is_transient``), as any statement can when the link drops mid-use.
    """

    @sa.event.listens_for(engine, "checkin")
    def _checked_in(_dbapi: Any, record: Any) -> None:
        if record is not None:
            record.info["idle_since_ms"] = clock.now_ms()

    @sa.event.listens_for(engine, "checkout")
    def _checked_out(dbapi: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("idle_since_ms")
        if since is None or clock.now_ms() - since <= PING_IDLE_MS:
            return
        try:
            alive = engine.dialect.do_ping(dbapi)
        except Exception as exc:  # noqa: BLE001 - any failure means: not usable
            raise sa.exc.InvalidatePoolError(f"ping failed: {exc!r}") from exc
        if not alive:  # pragma: no cover - do_ping raises rather than returning False
            raise sa.exc.InvalidatePoolError("ping failed")


def _pg_on_connect(dbapi: Any, _record: Any) -> None:
    """The store prepares its statements itself (``pg_wire``); psycopg prepares none, since
    psycopg deallocates every prepared statement of the session after a ROLLBACK it sees."""
    dbapi.prepare_threshold = None


def _sqlite_on_connect(dbapi: sqlite3.Connection, _record: Any) -> None:
    dbapi.isolation_level = None
    cur = dbapi.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")  # the backstop (D128)
    cur.close()
