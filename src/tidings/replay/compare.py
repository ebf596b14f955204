"""``tidings replay compare A B``: a table-by-table diff of two stores.

Every table, every column, rows keyed by primary key (a table without one is keyed by all
its compared columns). Reported per table: rows only in A, rows only in B, rows present in
both whose cells differ (with a count per column and a few examples). The stores are
opened read-only (SQLite ``mode=ro``; PostgreSQL read-only transactions) and may be of
different backends: booleans compare as 0/1, so a SQLite replay can be diffed against a
PostgreSQL one.

``--ignore table.column`` (repeatable; ``table`` or ``table.*`` for a whole table) takes a
column out of the verdict but still reports it, like the reference's report: for each
ignored column, over rows present in both stores, how many are ``equal``, ``b_older``
(B's value is the smaller number), ``b_newer`` (larger) or ``other`` (differ, not both
numbers). That is how "``updated_at_ms`` is always older on the branch, never newer" is
shown.

The stores are identical (exit 0) when they have the same tables and columns and every
table has the same rows, modulo the ignored columns; otherwise the exit code is 1.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..store.roster import ROSTER_EPOCH_TABLE
from ..store.search import INDEX_COLUMNS, is_index_table
from .harness import is_postgres, sqlite_path

EXAMPLES = 3


class CompareError(Exception):
    """A store that cannot be opened or read."""


@dataclass
class Ignore:
    tables: set[str] = field(default_factory=set)
    columns: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def parse(cls, items: Iterable[str]) -> Ignore:
        out = cls()
        for item in items:
            for part in item.split(","):
                part = part.strip()
                if not part:
                    continue
                table, dot, column = part.partition(".")
                if not table or (dot and not column):
                    raise ValueError(f"--ignore wants table.column (or a table), got {part!r}")
                if not dot or column == "*":
                    out.tables.add(table)
                else:
                    out.columns.add((table, column))
        return out

    def as_list(self) -> list[str]:
        return sorted(self.tables) + sorted(f"{t}.{c}" for t, c in self.columns)


class _Source:
    """One store, read-only, through its plain DB-API driver (never migrated or written)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.postgres = is_postgres(where)
        try:
            if self.postgres:
                import psycopg

                self.conn: Any = psycopg.connect(where, connect_timeout=10)
                self.conn.read_only = True
            else:
                path = sqlite_path(where)
                if not path.exists():
                    raise CompareError(f"no store at {path}")
                self.conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        except CompareError:
            raise
        except Exception as exc:  # noqa: BLE001 - one line for the user
            raise CompareError(f"cannot open {where}: {str(exc).strip()}") from None

    def close(self) -> None:
        self.conn.close()

    def tables(self) -> list[str]:
        if self.postgres:
            rows = self.conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename"
            ).fetchall()
        else:
            rows = self.conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
            ).fetchall()
        # the search index is derived from message text, not content (D58); the roster
        # epoch is a version number the triggers move (D108)
        return [r[0] for r in rows if not is_index_table(r[0]) and r[0] != ROSTER_EPOCH_TABLE]

    def columns(self, table: str) -> tuple[list[str], list[str]]:
        """(columns in schema order, primary-key columns in key order)."""
        if self.postgres:
            cols = [r[0] for r in self.conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name = %s ORDER BY ordinal_position", (table,)
            ).fetchall() if r[0] not in INDEX_COLUMNS]
            pk = [r[0] for r in self.conn.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
                "ORDER BY array_position(i.indkey::int2[], a.attnum)", (_quoted(table),)
            ).fetchall()]
            return cols, pk
        info = self.conn.execute(f"PRAGMA table_info({_quoted(table)})").fetchall()
        cols = [r[1] for r in info if r[1] not in INDEX_COLUMNS]
        pk = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
        return cols, pk

    def rows(self, table: str, columns: list[str]) -> Iterable[tuple]:
        select = ", ".join(_quoted(c) for c in columns)
        cur = self.conn.cursor()
        cur.execute(f"SELECT {select} FROM {_quoted(table)}")
        while True:
            batch = cur.fetchmany(2000)
            if not batch:
                break
            for row in batch:
                yield tuple(_norm(v) for v in row)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _norm(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short(value: Any, limit: int = 80) -> Any:
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return value[: limit - 1] + ("…" if isinstance(value, str) else b"...")
    return value


def compare_stores(a: str, b: str, ignore: Ignore | None = None) -> dict[str, Any]:
    """Compare two stores; the report is JSON-ready (see the module docstring)."""
    ignore = ignore or Ignore()
    src_a = _Source(a)
    try:
        src_b = _Source(b)
    except Exception:
        src_a.close()
        raise
    try:
        return _compare(src_a, src_b, ignore)
    finally:
        src_a.close()
        src_b.close()


def _compare(src_a: _Source, src_b: _Source, ignore: Ignore) -> dict[str, Any]:
    tables_a, tables_b = set(src_a.tables()), set(src_b.tables())
    report: dict[str, Any] = {
        "a": src_a.where,
        "b": src_b.where,
        "ignored": ignore.as_list(),
        "tables_only_a": sorted(tables_a - tables_b - ignore.tables),
        "tables_only_b": sorted(tables_b - tables_a - ignore.tables),
        "tables": {},
    }
    for table in sorted(tables_a & tables_b):
        if table in ignore.tables:
            continue
        report["tables"][table] = _compare_table(src_a, src_b, table, ignore)
    report["differences"] = (
        len(report["tables_only_a"]) + len(report["tables_only_b"])
        + sum(t["differences"] for t in report["tables"].values())
    )
    report["identical"] = report["differences"] == 0
    return report


def _compare_table(src_a: _Source, src_b: _Source, table: str, ignore: Ignore) -> dict[str, Any]:
    cols_a, pk_a = src_a.columns(table)
    cols_b, _pk_b = src_b.columns(table)
    set_b = set(cols_b)
    common = [c for c in cols_a if c in set_b]
    ignored = [c for c in common if (table, c) in ignore.columns]
    compared = [c for c in common if (table, c) not in ignore.columns]
    key_cols = [c for c in pk_a if c in compared] if pk_a and all(c in compared for c in pk_a) else compared
    key_idx = [common.index(c) for c in key_cols]
    cmp_idx = [(c, common.index(c)) for c in compared if c not in key_cols]
    ign_idx = [(c, common.index(c)) for c in ignored]

    out: dict[str, Any] = {
        "key": key_cols,
        "columns_only_a": [c for c in cols_a if c not in set_b and (table, c) not in ignore.columns],
        "columns_only_b": [c for c in cols_b if c not in set(cols_a) and (table, c) not in ignore.columns],
        "rows_a": 0,
        "rows_b": 0,
        "only_a": 0,
        "only_b": 0,
        "differing_rows": 0,
        "differing_cells": {},
        "examples": [],
    }
    tallies = {c: {"equal": 0, "b_older": 0, "b_newer": 0, "other": 0} for c in ignored}

    def key_of(row: tuple) -> tuple:
        return tuple(row[i] for i in key_idx)

    rows_a: dict[tuple, tuple] = {}
    duplicates = 0
    for row in src_a.rows(table, common):
        out["rows_a"] += 1
        key = key_of(row)
        if key in rows_a:
            duplicates += 1  # only possible without a primary key: count as a difference
        rows_a[key] = row
    for row in src_b.rows(table, common):
        out["rows_b"] += 1
        key = key_of(row)
        mine = rows_a.pop(key, None)
        if mine is None:
            out["only_b"] += 1
            if len(out["examples"]) < EXAMPLES:
                out["examples"].append({"only_b": [_short(v) for v in key]})
            continue
        diff = {}
        for column, i in cmp_idx:
            if mine[i] != row[i]:
                out["differing_cells"][column] = out["differing_cells"].get(column, 0) + 1
                diff[column] = [_short(mine[i]), _short(row[i])]
        if diff:
            out["differing_rows"] += 1
            if len(out["examples"]) < EXAMPLES:
                out["examples"].append({"key": [_short(v) for v in key], "a_b": diff})
        for column, i in ign_idx:
            va, vb = mine[i], row[i]
            tally = tallies[column]
            if va == vb:
                tally["equal"] += 1
            elif _is_number(va) and _is_number(vb):
                tally["b_older" if vb < va else "b_newer"] += 1
            else:
                tally["other"] += 1
    out["only_a"] = len(rows_a) + duplicates
    for key in list(rows_a)[: max(0, EXAMPLES - len(out["examples"]))]:
        out["examples"].append({"only_a": [_short(v) for v in key]})
    if tallies:
        out["ignored"] = tallies
    out["differences"] = (
        out["only_a"] + out["only_b"] + out["differing_rows"]
        + len(out["columns_only_a"]) + len(out["columns_only_b"])
    )
    return out


def render(report: dict[str, Any], console: Any) -> None:
    """Print the report as a Rich table (and the examples of what differs)."""
    from rich.table import Table

    table = Table(title=f"A = {report['a']}\nB = {report['b']}", title_justify="left")
    for name, justify in (("table", "left"), ("rows A", "right"), ("rows B", "right"), ("only A", "right"),
                          ("only B", "right"), ("differ", "right"), ("ignored: equal/b_older/b_newer/other", "left")):
        table.add_column(name, justify=justify, overflow="fold", no_wrap=(name == "table"))  # type: ignore[arg-type]
    for name, t in report["tables"].items():
        ignored = "; ".join(
            f"{c}: {v['equal']}/{v['b_older']}/{v['b_newer']}/{v['other']}" for c, v in t.get("ignored", {}).items()
        )
        style = None if t["differences"] == 0 else "bold red"
        table.add_row(name, str(t["rows_a"]), str(t["rows_b"]), str(t["only_a"]), str(t["only_b"]),
                      str(t["differing_rows"]), ignored, style=style)
    console.print(table)
    for name in report["tables_only_a"]:
        console.print(f"table only in A: {name}", markup=False)
    for name in report["tables_only_b"]:
        console.print(f"table only in B: {name}", markup=False)
    for name, t in report["tables"].items():
        if t["columns_only_a"] or t["columns_only_b"]:
            console.print(f"{name}: columns only in A {t['columns_only_a']}, only in B {t['columns_only_b']}", markup=False)
        if t["differing_cells"]:
            console.print(f"{name}: differing cells per column {t['differing_cells']}", markup=False)
        for example in t["examples"]:
            console.print(f"  {name}: {example}", markup=False, highlight=False)
    verdict = "identical" if report["identical"] else f"{report['differences']} differences"
    if report["ignored"]:
        verdict += f" (ignoring {', '.join(report['ignored'])})"
    console.print(verdict, markup=False)


def write_report(report: dict[str, Any], path: Path) -> None:
    import json

    path.write_text(json.dumps(report, indent=2, ensure_ascii=False, default=repr) + "\n", encoding="utf-8")
