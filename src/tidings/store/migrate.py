"""Versioned plain-SQL migrations, one folder per dialect, applied at start.

Files are ``migrations/<dialect>/NNNN_name.sql``. Each is applied once, inside its own
transaction together with its ``schema_migrations`` row, so a crash mid-migration leaves
nothing half-applied. Running the runner twice (or from two processes at once) is safe:
SQLite serialises on ``BEGIN IMMEDIATE``, PostgreSQL on a transaction-scoped advisory lock,
and each file is re-checked for "already applied" after the lock is held. An applied file
whose text has changed since is refused (checksum drift), never silently re-run.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from .engine import Store

log = structlog.get_logger("tidings.migrate")

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_PG_LOCK_KEY = 7_466_133_001  # arbitrary constant: "tidings migrations"


class MigrationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def available(dialect: str) -> list[Migration]:
    folder = resources.files("tidings.store") / "migrations" / dialect
    out = []
    for entry in folder.iterdir():
        m = _NAME.match(entry.name)
        if m:
            out.append(Migration(int(m.group(1)), m.group(2), entry.read_text()))
    out.sort(key=lambda m: m.version)
    versions = [m.version for m in out]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions in {dialect}: {versions}")
    return out


_CREATE_SQLITE = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " version INTEGER PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL,"
    " applied_at_ms INTEGER NOT NULL)"
)
_CREATE_PG = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " version INTEGER PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL,"
    " applied_at_ms BIGINT NOT NULL)"
)


def migrate(store: Store) -> list[int]:
    """Apply every pending migration; return the versions applied by this call."""
    applied_now: list[int] = []
    for mig in available(store.dialect):
        if _apply_one(store, mig):
            applied_now.append(mig.version)
    if applied_now:
        log.info("migrations applied", versions=applied_now, dialect=store.dialect)
    return applied_now


def _apply_one(store: Store, mig: Migration) -> bool:
    conn = store.engine.raw_connection()
    try:
        dbapi = conn.driver_connection
        now = store.clock.now_ms()
        if store.dialect == "sqlite":
            return _apply_sqlite(dbapi, mig, now)  # type: ignore[arg-type]
        return _apply_pg(dbapi, mig, now)
    finally:
        conn.close()


def _apply_sqlite(dbapi: sqlite3.Connection, mig: Migration, now: int) -> bool:
    dbapi.execute("BEGIN IMMEDIATE")
    try:
        dbapi.execute(_CREATE_SQLITE)
        row = dbapi.execute(
            "SELECT checksum FROM schema_migrations WHERE version = ?", (mig.version,)
        ).fetchone()
        if row is not None:
            dbapi.execute("COMMIT")
            _check_drift(mig, row[0])
            return False
        # executescript would COMMIT first; run the statements one by one instead.
        for statement in _split_sql(mig.sql):
            dbapi.execute(statement)
        dbapi.execute(
            "INSERT INTO schema_migrations (version, name, checksum, applied_at_ms) VALUES (?,?,?,?)",
            (mig.version, mig.name, mig.checksum, now),
        )
        dbapi.execute("COMMIT")
        return True
    except BaseException:
        if dbapi.in_transaction:
            dbapi.execute("ROLLBACK")
        raise


def _apply_pg(dbapi: Any, mig: Migration, now: int) -> bool:
    try:
        with dbapi.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_LOCK_KEY,))
            cur.execute(_CREATE_PG)
            cur.execute("SELECT checksum FROM schema_migrations WHERE version = %s", (mig.version,))
            row = cur.fetchone()
            if row is not None:
                dbapi.commit()
                _check_drift(mig, row[0])
                return False
            cur.execute(mig.sql)
            cur.execute(
                "INSERT INTO schema_migrations (version, name, checksum, applied_at_ms) VALUES (%s,%s,%s,%s)",
                (mig.version, mig.name, mig.checksum, now),
            )
        dbapi.commit()
        return True
    except BaseException:
        dbapi.rollback()
        raise


def _check_drift(mig: Migration, stored: str) -> None:
    if stored != mig.checksum:
        raise MigrationError(
            f"migration {mig.version:04d}_{mig.name} was applied with different text "
            "(checksum drift); add a new migration instead of editing an applied one"
        )


def _split_sql(script: str) -> list[str]:
    """Split a SQLite script on ``;`` at statement ends, honouring quotes and triggers."""
    statements: list[str] = []
    buf: list[str] = []
    for line in script.splitlines():
        stripped = line.strip()
        if stripped.startswith("--") and not buf:
            continue
        buf.append(line)
        candidate = "\n".join(buf).strip()
        if candidate.endswith(";") and sqlite3.complete_statement(candidate):
            statements.append(candidate)
            buf = []
    rest = "\n".join(buf).strip()
    if rest and not all(line.strip().startswith("--") or not line.strip() for line in buf):
        statements.append(rest)
    return statements
