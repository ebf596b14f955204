"""Statements built once, compiled once per dialect, executed on the raw DBAPI connection.

SQLAlchemy Core builds each statement (so upserts, ``IS DISTINCT FROM`` and partial
indexes come out right on both dialects), but compiling a Core statement per call costs
about six times the database work itself. ``Stmt`` compiles on first use for a dialect and
caches the SQL text; every later call is a plain ``cursor.execute(sql, params)``.

Parameters are always named (``:name`` on SQLite, ``%(name)s`` on PostgreSQL), so callers
pass one dict for both backends. Constants written into a Core expression become default
parameters, merged under the caller's.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

DIALECTS = {
    "sqlite": sqlite_dialect.dialect(paramstyle="named"),
    "postgresql": pg_dialect.psycopg.dialect(),
}


class Stmt:
    """One SQL statement, compiled lazily per dialect and cached for the process lifetime."""

    __slots__ = ("clause", "_compiled", "name")

    def __init__(self, clause: Any, name: str = "") -> None:
        if isinstance(clause, str):
            clause = sa.text(clause)
        self.clause = clause
        self.name = name
        self._compiled: dict[str, tuple[str, dict[str, Any] | None]] = {}

    def compiled(self, dialect: str) -> tuple[str, dict[str, Any] | None]:
        hit = self._compiled.get(dialect)
        if hit is None:
            comp = self.clause.compile(dialect=DIALECTS[dialect])
            defaults = {k: v for k, v in comp.params.items() if v is not None} or None
            hit = (str(comp), defaults)
            self._compiled[dialect] = hit
        return hit

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Stmt({self.name or str(self.clause)[:60]!r})"


class PerDialect(Stmt):
    """A statement whose SQL text differs per dialect, written by hand (``:name`` params)."""

    __slots__ = ("texts",)

    def __init__(self, name: str = "", **texts: str) -> None:
        super().__init__(sa.text("SELECT 1"), name)
        self.texts = texts

    def compiled(self, dialect: str) -> tuple[str, dict[str, Any] | None]:
        hit = self._compiled.get(dialect)
        if hit is None:
            comp = sa.text(self.texts[dialect]).compile(dialect=DIALECTS[dialect])
            hit = (str(comp), None)
            self._compiled[dialect] = hit
        return hit
