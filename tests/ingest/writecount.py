"""Row-write counting with triggers, on SQLite and PostgreSQL (spec §6.3's technique).

``WriteCounter(store, tables)`` installs one AFTER INSERT / UPDATE / DELETE row trigger per
table; each fired trigger appends a row to ``test_row_writes(tbl, op)``. An upsert that
takes its ``DO NOTHING`` path, or whose ``DO UPDATE ... WHERE`` guard is false, fires
nothing, so the counts are exactly the rows the database wrote. The counting table
itself is never counted.

Usage::

    with WriteCounter(store, ["identities", "conversations"]) as wc:
        ...                       # writes
        assert wc.total() == 0    # or wc.snapshot() / wc.of("identities")
        wc.reset()

Always leave through ``uninstall()`` (the context manager does it): on PostgreSQL the test
database outlives the test, and a trigger left behind would count into the next one.
"""

from __future__ import annotations

import re
from typing import Iterable

from tidings.store.engine import Store

COUNT_TABLE = "test_row_writes"
OPS = ("insert", "update", "delete")
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")

_PG_FUNCTION = (
    f"CREATE OR REPLACE FUNCTION {COUNT_TABLE}_fn() RETURNS trigger LANGUAGE plpgsql AS $$ "
    f"BEGIN INSERT INTO {COUNT_TABLE} (tbl, op) VALUES (TG_TABLE_NAME, lower(TG_OP)); RETURN NULL; END $$"
)


class WriteCounter:
    """Counts row writes per table and operation until ``uninstall()``."""

    def __init__(self, store: Store, tables: Iterable[str]) -> None:
        self.store = store
        self.tables = list(dict.fromkeys(tables))
        for table in self.tables:
            if not _IDENT.match(table) or table == COUNT_TABLE:
                raise ValueError(f"cannot count writes of table {table!r}")
        self.installed = False

    # -- lifecycle ---------------------------------------------------------------------
    def install(self) -> "WriteCounter":
        sqlite = self.store.dialect == "sqlite"
        with self.store.write() as tx:
            tx.raw(f"CREATE TABLE IF NOT EXISTS {COUNT_TABLE} (tbl TEXT NOT NULL, op TEXT NOT NULL)")
            if not sqlite:
                tx.raw(_PG_FUNCTION)
            for table in self.tables:
                for op in OPS:
                    name = _trigger(table, op)
                    if sqlite:
                        tx.raw(f"DROP TRIGGER IF EXISTS {name}")
                        tx.raw(
                            f"CREATE TRIGGER {name} AFTER {op.upper()} ON {table} FOR EACH ROW BEGIN "
                            f"INSERT INTO {COUNT_TABLE} (tbl, op) VALUES ('{table}', '{op}'); END"
                        )
                    else:
                        tx.raw(f"DROP TRIGGER IF EXISTS {name} ON {table}")
                        tx.raw(
                            f"CREATE TRIGGER {name} AFTER {op.upper()} ON {table} "
                            f"FOR EACH ROW EXECUTE FUNCTION {COUNT_TABLE}_fn()"
                        )
            tx.raw(f"DELETE FROM {COUNT_TABLE}")
        self.installed = True
        return self

    def uninstall(self) -> None:
        if not self.installed:
            return
        sqlite = self.store.dialect == "sqlite"
        with self.store.write() as tx:
            for table in self.tables:
                for op in OPS:
                    name = _trigger(table, op)
                    tx.raw(f"DROP TRIGGER IF EXISTS {name}" if sqlite else f"DROP TRIGGER IF EXISTS {name} ON {table}")
            tx.raw(f"DROP TABLE IF EXISTS {COUNT_TABLE}")
            if not sqlite:
                tx.raw(f"DROP FUNCTION IF EXISTS {COUNT_TABLE}_fn()")
        self.installed = False

    def __enter__(self) -> "WriteCounter":
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # -- reading -----------------------------------------------------------------------
    def snapshot(self) -> dict[str, dict[str, int]]:
        """``{table: {"insert": n, "update": n, "delete": n}}`` for every counted table."""
        out = {table: {op: 0 for op in OPS} for table in self.tables}
        with self.store.read() as tx:
            rows = tx.raw(f"SELECT tbl, op, count(*) FROM {COUNT_TABLE} GROUP BY tbl, op").fetchall()
        for table, op, n in rows:
            out.setdefault(table, {o: 0 for o in OPS})[op] = int(n)
        return out

    def of(self, table: str, op: str | None = None) -> int:
        """Writes to ``table`` (of one operation, or all three)."""
        counts = self.snapshot().get(table, {})
        return counts.get(op, 0) if op else sum(counts.values())

    def total(self) -> int:
        return sum(sum(ops.values()) for ops in self.snapshot().values())

    def nonzero(self) -> dict[str, dict[str, int]]:
        """The snapshot without zero entries (readable in assertion messages)."""
        return {
            table: {op: n for op, n in ops.items() if n}
            for table, ops in self.snapshot().items()
            if any(ops.values())
        }

    def reset(self) -> None:
        with self.store.write() as tx:
            tx.raw(f"DELETE FROM {COUNT_TABLE}")


def _trigger(table: str, op: str) -> str:
    return f"twc_{table}_{op}"
