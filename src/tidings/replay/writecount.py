"""Row-write counting with triggers, on SQLite and PostgreSQL.

Two counters share one idea: an AFTER INSERT / UPDATE / DELETE row trigger per table
records every row the database actually wrote. An upsert that takes its ``DO NOTHING``
path, or whose ``DO UPDATE ... WHERE`` guard is false, fires nothing, so the counts are
exactly the rows written, and a rolled-back write is rolled back out of the count too
(the counting rows live in the same transaction).

``WriteCounter(store, tables)`` (tests): a real table ``test_row_writes(tbl, op)`` in the
store, installed and removed around a test::

    with WriteCounter(store, ["identities", "conversations"]) as wc:
        ...                       # writes
        assert wc.total() == 0    # or wc.snapshot() / wc.of("identities")
        wc.reset()

Always leave through ``uninstall()`` (the context manager does it): on PostgreSQL the test
database outlives the test, and a trigger left behind would count into the next one.

``ReplayCounter(store)`` (the replay harness): every table, and for each UPDATE whether it
was *effective*, i.e. whether some column other than the bookkeeping timestamps
(``BOOKKEEPING``) changed value, OLD against NEW. That is the minimal-write oracle: an
INSERT or a DELETE always changes content, an UPDATE only when it is effective.

One bookkeeping-only update is a content change by design (decision D9): a conversation's
``updated_at_ms`` is the time of its last change *roster included*, and a roster change
touches it. The oracle counts that touch as effective exactly when the same frame wrote a
row of that conversation's roster before it (a roster mark, cleared by each inbox write,
i.e. at the start and the end of every frame); any other timestamp-only update of a
conversation is wasted, like everywhere else. Touches are reported on their own
(``touch``), so the strict reading (every touch wasted) stays visible.

It must not disturb what it measures:

* SQLite: TEMP triggers writing to a TEMP table in memory, on every connection of the
  store (installed at connect). Nothing reaches the database file or its WAL, and the
  counting rows follow their transaction (a rolled-back savepoint takes its counts along).
* PostgreSQL: one trigger function writing to an UNLOGGED table (no WAL). It is dropped
  by ``uninstall()``, so the replayed store is left as the replay made it.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from ..store.engine import Store
from ..store.roster import ROSTER_EPOCH_TABLE
from ..store.search import INDEX_COLUMNS, is_index_table

COUNT_TABLE = "test_row_writes"
OPS = ("insert", "update", "delete")
# Columns that record when a row was written, not what it says: an UPDATE that changes
# only these changes nothing a reader could use, so the oracle calls it wasted.
BOOKKEEPING = frozenset({"created_at_ms", "updated_at_ms"})
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
    def install(self) -> WriteCounter:
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

    def __enter__(self) -> WriteCounter:
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


# -- the replay counter ------------------------------------------------------------------------
REPLAY_TABLE = "replay_row_writes"
MARK_TABLE = "replay_roster_marks"
_REPLAY_FN = f"{REPLAY_TABLE}_fn"
TOUCHED_TABLE = "conversations"  # whose updated_at_ms a roster change moves (D9)
ROSTER_TABLE = "conversation_participants"
FRAME_TABLE = "inbox"  # written at the start and at the end of every frame
# eff values stored per counted write
WASTED, CONTENT, TOUCH = 0, 1, 2


def user_tables(store: Store) -> dict[str, list[str]]:
    """``{table: [column, ...]}`` of every user table of the store (schema order)."""
    with store.read() as tx:
        if store.dialect == "sqlite":
            names = [r[0] for r in tx.raw(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
            ).fetchall()]
            # FTS5 tables (virtual and shadow) are the search index: maintained by triggers in
            # the writing transaction, derived from text, never a row write of their own (D58).
            names = [n for n in names if not is_index_table(n) and n != ROSTER_EPOCH_TABLE]
            return {name: [r[1] for r in tx.raw(f'PRAGMA table_info("{name}")').fetchall()] for name in names}
        rows = tx.raw(
            "SELECT c.table_name, c.column_name FROM information_schema.columns c "
            "JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name "
            "WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE' "
            "ORDER BY c.table_name, c.ordinal_position"
        ).fetchall()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        if table == ROSTER_EPOCH_TABLE:  # a version of the rosters, moved by triggers (D108)
            continue
        if column not in INDEX_COLUMNS:  # the generated tsvector: derived, not content (D58)
            out.setdefault(table, []).append(column)
    return out


class ReplayCounter:
    """Committed row writes of every table, each write classed content, touch or wasted.

    Install it while no connection of the store is checked out: on SQLite the triggers are
    per connection, so ``install()`` empties the pool and adds them as connections open.
    ``snapshot()`` reads the counts so far; ``uninstall()`` removes everything it added.
    """

    def __init__(self, store: Store, tables: Iterable[str] | None = None) -> None:
        self.store = store
        schema = user_tables(store)
        own = (COUNT_TABLE, REPLAY_TABLE, MARK_TABLE)
        wanted = [t for t in schema if t not in own] if tables is None else list(dict.fromkeys(tables))
        for table in wanted:
            if not _IDENT.match(table) or table in own or table not in schema:
                raise ValueError(f"cannot count writes of table {table!r}")
        self.columns = {table: schema[table] for table in wanted}
        self.installed = False
        self._final: dict[tuple[str, str], tuple[int, int, int]] | None = None
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._harvested: dict[tuple[str, str], list[int]] = {}

    # -- lifecycle ---------------------------------------------------------------------
    def install(self) -> ReplayCounter:
        if self.store.dialect == "sqlite":
            self._sql = _sqlite_trigger_sql(self.columns)
            sa.event.listen(self.store.engine, "connect", self._on_connect)
            sa.event.listen(self.store.engine, "close", self._on_close)
            sa.event.listen(self.store.engine, "close_detached", self._on_close_detached)
            # Idle pooled connections opened before now have no triggers: close them, so
            # every connection used from here on is a new one (its listeners carry over).
            self.store.engine.dispose()
        else:
            with self.store.write() as tx:
                tx.raw(
                    f"CREATE UNLOGGED TABLE IF NOT EXISTS {REPLAY_TABLE} "
                    "(tbl TEXT NOT NULL, op TEXT NOT NULL, eff SMALLINT NOT NULL)"
                )
                tx.raw(f"CREATE UNLOGGED TABLE IF NOT EXISTS {MARK_TABLE} (conversation_id TEXT NOT NULL)")
                tx.raw(_pg_function(BOOKKEEPING))
                for table in self.columns:
                    tx.raw(f'DROP TRIGGER IF EXISTS {REPLAY_TABLE}_trg ON "{table}"')
                    tx.raw(
                        f'CREATE TRIGGER {REPLAY_TABLE}_trg AFTER INSERT OR UPDATE OR DELETE ON "{table}" '
                        f"FOR EACH ROW EXECUTE FUNCTION {_REPLAY_FN}()"
                    )
                tx.raw(f"DELETE FROM {REPLAY_TABLE}")
                tx.raw(f"DELETE FROM {MARK_TABLE}")
        self.installed = True
        return self

    def uninstall(self) -> None:
        """Stop counting and remove the triggers (the counts so far stay readable)."""
        if not self.installed:
            return
        self._final = self.counts()
        if self.store.dialect == "sqlite":
            for event, fn in (("connect", self._on_connect), ("close", self._on_close),
                              ("close_detached", self._on_close_detached)):
                sa.event.remove(self.store.engine, event, fn)
            with self._lock:
                conns, self._connections = self._connections, []
            for dbapi in conns:
                try:
                    for table in self.columns:
                        for op in OPS:
                            dbapi.execute(f"DROP TRIGGER IF EXISTS temp.{_replay_trigger(table, op)}")
                    dbapi.execute(f"DROP TABLE IF EXISTS temp.{REPLAY_TABLE}")
                    dbapi.execute(f"DROP TABLE IF EXISTS temp.{MARK_TABLE}")
                except sqlite3.Error:  # a closed connection took its temp objects along
                    pass
        else:
            with self.store.write() as tx:
                for table in self.columns:
                    tx.raw(f'DROP TRIGGER IF EXISTS {REPLAY_TABLE}_trg ON "{table}"')
                tx.raw(f"DROP FUNCTION IF EXISTS {_REPLAY_FN}()")
                tx.raw(f"DROP TABLE IF EXISTS {REPLAY_TABLE}")
                tx.raw(f"DROP TABLE IF EXISTS {MARK_TABLE}")
        self.installed = False

    # -- SQLite connections --------------------------------------------------------------
    def _on_connect(self, dbapi: sqlite3.Connection, _record: Any) -> None:
        dbapi.execute("PRAGMA temp_store=MEMORY")
        for statement in self._sql:
            dbapi.execute(statement)
        with self._lock:
            self._connections.append(dbapi)

    def _on_close(self, dbapi: sqlite3.Connection, _record: Any) -> None:
        self._harvest(dbapi)

    def _on_close_detached(self, dbapi: sqlite3.Connection) -> None:
        self._harvest(dbapi)

    def _harvest(self, dbapi: sqlite3.Connection) -> None:
        """Keep the counts of a connection that is closing (its TEMP table goes with it)."""
        with self._lock:
            if not any(c is dbapi for c in self._connections):
                return
            self._connections = [c for c in self._connections if c is not dbapi]
        try:
            rows = _sqlite_counts(dbapi)
        except sqlite3.Error:  # pragma: no cover - already closed: nothing to read
            return
        with self._lock:
            _add(self._harvested, rows)

    # -- reading -----------------------------------------------------------------------
    def counts(self) -> dict[tuple[str, str], tuple[int, int, int]]:
        """``{(table, op): (writes, content changes, roster touches)}`` committed so far."""
        if not self.installed:
            return dict(self._final or {})
        out: dict[tuple[str, str], list[int]] = {}
        if self.store.dialect == "sqlite":
            with self._lock:
                conns = list(self._connections)
                _add(out, {k: tuple(v) for k, v in self._harvested.items()})
            for dbapi in conns:
                _add(out, _sqlite_counts(dbapi))
        else:
            with self.store.read() as tx:
                rows = tx.raw(
                    f"SELECT tbl, op, count(*), count(*) FILTER (WHERE eff = {CONTENT}), "
                    f"count(*) FILTER (WHERE eff = {TOUCH}) FROM {REPLAY_TABLE} GROUP BY tbl, op"
                ).fetchall()
            _add(out, {(t, op): (int(n), int(c), int(tch)) for t, op, n, c, tch in rows})
        return {key: (v[0], v[1], v[2]) for key, v in out.items()}

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Per counted table: ``insert``, ``update``, ``delete`` (rows written), and
        ``effective`` (rows whose content changed: inserts, deletes, effective updates,
        justified touches included), ``touch`` (of which roster touches), ``wasted``."""
        out = {table: _empty_row() for table in self.columns}
        for (table, op), (n, content, touch) in self.counts().items():
            row = out.setdefault(table, _empty_row())
            row[op] += n
            row["effective"] += content + touch
            row["touch"] += touch
            row["wasted"] += n - content - touch
        return out


def _empty_row() -> dict[str, int]:
    return {"insert": 0, "update": 0, "delete": 0, "effective": 0, "touch": 0, "wasted": 0}


def _add(acc: dict[tuple[str, str], list[int]], rows: dict[tuple[str, str], tuple]) -> None:
    for key, values in rows.items():
        slot = acc.setdefault(key, [0, 0, 0])
        for i, value in enumerate(values):
            slot[i] += value


def _replay_trigger(table: str, op: str) -> str:
    return f"rrw_{table}_{op}"


def _sqlite_trigger_sql(columns: dict[str, list[str]]) -> list[str]:
    """Statements creating the TEMP tables and the TEMP triggers on one connection."""
    out = [
        f"CREATE TEMP TABLE IF NOT EXISTS {REPLAY_TABLE} (tbl TEXT NOT NULL, op TEXT NOT NULL, eff INTEGER NOT NULL)",
        f"CREATE TEMP TABLE IF NOT EXISTS {MARK_TABLE} (conversation_id TEXT NOT NULL)",
    ]
    for table, cols in columns.items():
        content = [c for c in cols if c not in BOOKKEEPING]
        changed = " OR ".join(f'OLD."{c}" IS NOT NEW."{c}"' for c in content) or "0"
        for op in OPS:
            if op != "update":
                eff = str(CONTENT)
            elif table == TOUCHED_TABLE and "updated_at_ms" in cols:
                eff = (
                    f"CASE WHEN {changed} THEN {CONTENT} WHEN OLD.updated_at_ms IS NOT NEW.updated_at_ms AND "
                    f"EXISTS (SELECT 1 FROM {MARK_TABLE} WHERE conversation_id = NEW.id) THEN {TOUCH} ELSE {WASTED} END"
                )
            else:
                eff = f"CASE WHEN {changed} THEN {CONTENT} ELSE {WASTED} END"
            body = f"INSERT INTO {REPLAY_TABLE} (tbl, op, eff) VALUES ('{table}', '{op}', {eff});"
            if table == ROSTER_TABLE:
                row = "OLD" if op == "delete" else "NEW"
                body += f" INSERT INTO {MARK_TABLE} (conversation_id) VALUES ({row}.conversation_id);"
            elif table == FRAME_TABLE and op != "delete":
                body += f" DELETE FROM {MARK_TABLE};"
            out.append(
                f'CREATE TEMP TRIGGER IF NOT EXISTS {_replay_trigger(table, op)} AFTER {op.upper()} ON main."{table}" '
                f"FOR EACH ROW BEGIN {body} END"
            )
    return out


def _sqlite_counts(dbapi: sqlite3.Connection) -> dict[tuple[str, str], tuple[int, int, int]]:
    rows = dbapi.execute(
        f"SELECT tbl, op, count(*), sum(eff = {CONTENT}), sum(eff = {TOUCH}) FROM temp.{REPLAY_TABLE} GROUP BY tbl, op"
    ).fetchall()
    return {(t, op): (int(n), int(c or 0), int(tch or 0)) for t, op, n, c, tch in rows}


def _pg_function(bookkeeping: Iterable[str]) -> str:
    minus = "".join(f" - '{c}'" for c in sorted(bookkeeping))
    return f"""
CREATE OR REPLACE FUNCTION {_REPLAY_FN}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  eff SMALLINT := {CONTENT};
BEGIN
  IF TG_OP = 'UPDATE' THEN
    IF (to_jsonb(OLD){minus}) IS DISTINCT FROM (to_jsonb(NEW){minus}) THEN
      eff := {CONTENT};
    ELSIF TG_TABLE_NAME = '{TOUCHED_TABLE}'
        AND (to_jsonb(OLD) -> 'updated_at_ms') IS DISTINCT FROM (to_jsonb(NEW) -> 'updated_at_ms')
        AND EXISTS (SELECT 1 FROM {MARK_TABLE} WHERE conversation_id = to_jsonb(NEW) ->> 'id') THEN
      eff := {TOUCH};
    ELSE
      eff := {WASTED};
    END IF;
  END IF;
  INSERT INTO {REPLAY_TABLE} (tbl, op, eff) VALUES (TG_TABLE_NAME, lower(TG_OP), eff);
  IF TG_TABLE_NAME = '{ROSTER_TABLE}' THEN
    IF TG_OP = 'DELETE' THEN
      INSERT INTO {MARK_TABLE} (conversation_id) VALUES (to_jsonb(OLD) ->> 'conversation_id');
    ELSE
      INSERT INTO {MARK_TABLE} (conversation_id) VALUES (to_jsonb(NEW) ->> 'conversation_id');
    END IF;
  ELSIF TG_TABLE_NAME = '{FRAME_TABLE}' AND TG_OP <> 'DELETE' THEN
    DELETE FROM {MARK_TABLE};
  END IF;
  RETURN NULL;
END $$"""
