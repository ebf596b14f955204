"""Statements built once, compiled once per dialect, executed on the raw DBAPI connection.

Every statement of the store is SQL text with ``:name`` parameters: a module-level
``Stmt("...", name=...)`` (the same text on both backends) or ``PerDialect(name=...,
sqlite=..., postgresql=...)`` (text that differs). ``Stmt`` compiles the text through
SQLAlchemy once per dialect (which turns ``:name`` into ``%(name)s`` for psycopg) and
caches it; every later call is a plain ``cursor.execute(sql, params)``. ``Stmt`` also
accepts a Core expression, but none of the store's statements is one today.

Parameters are always named, so callers pass one dict for both backends.

"Column in this list" is written once: ``in_list`` gives the fragment per dialect (a JSON
array walked by ``json_each`` on SQLite, ``= ANY`` of a typed array on PostgreSQL) and
``list_param`` the matching parameter value.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

DIALECTS = {
    "sqlite": sqlite_dialect.dialect(paramstyle="named"),
    "postgresql": pg_dialect.psycopg.dialect(),  # type: ignore[no-untyped-call]
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


def in_list(param: str, sql_type: str) -> dict[str, str]:
    """The fragment ``<column> IN :param`` per dialect (put it after the column); bind the
    value with ``list_param``. ``sql_type`` is the PostgreSQL element type (text, bigint)."""
    return {
        "sqlite": f"IN (SELECT value FROM json_each(:{param}))",
        "postgresql": f"= ANY(CAST(:{param} AS {sql_type}[]))",
    }


class _HasDialect(Protocol):
    @property
    def dialect(self) -> str: ...


def list_param(tx: _HasDialect, values: Iterable[Any]) -> Any:
    """The value of an ``in_list`` parameter: a list on PostgreSQL, JSON text on SQLite."""
    return list(values) if tx.dialect == "postgresql" else json.dumps(list(values))
