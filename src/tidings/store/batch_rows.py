"""Rows a batch of frames reads and writes, held in memory for one transaction (D115).

The projection of a batch (one frame, a request of many, a drained frame) reads every row
its frames touch in one round trip of set-based reads, applies each frame's rules to those
rows in memory, and writes the rows that changed with one set-based statement per table.
The table families (``identities``, ``conversations``, ``bridge_messages``, ``reactions``,
``read_cursors``) keep their rows in ``Table``s built here; ``ingest/batch.py`` puts them
together. What these pieces guarantee:

* **Read once.** A key is read from the database at most once a batch (``Table.load``);
  from then on its row, or its absence, is the batch's, changed only by the batch. That is
  sound because every writer of a bridge's projection rows holds the bridge's lock
  (``inbox.lock_bridge_appends``) for its whole transaction, the batch included.
* **A frame is taken back whole.** Every change to a ``Table`` goes through the batch's
  ``Journal``; a frame that fails is rolled back to its mark, in memory, and the database
  never saw it.
* **Net writes.** ``Table.changed`` yields a key only when its row differs from what was
  read (an insert, a delete, an update); a family writes a row only when its content
  differs, so a row changed by ten frames of a batch is written once, and a row changed
  and changed back is not written at all. Each write statement also carries the guard
  ``IS DISTINCT FROM`` the stored row: the database writes no row whose content it
  already holds.

A family reads with a ``Read`` and writes with a ``Write`` through a ``Writer``: one key or
one row goes as plain parameters; several go as JSON text (PostgreSQL's JSON functions,
SQLite's ``json_each``) in one statement, except that SQLite, where a statement costs no
round trip, writes several rows with the one-row statement bound once per row
(``Tx.execute_many``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from .engine import Tx
from .sql import PerDialect, Stmt

#: The journal's mark of a key that was not in its dict.
_ABSENT = object()


class Journal:
    """The undo log of one batch: ``put`` and ``drop`` change a dict and remember what was
    there; ``rollback(mark)`` restores every dict changed since ``mark``, newest first."""

    __slots__ = ("_undo", "asked")

    def __init__(self) -> None:
        self._undo: list[tuple[dict[Any, Any], Any, Any]] = []
        self.asked = False  # some ``Table.want`` asked for a key since the batch last read

    def mark(self) -> int:
        return len(self._undo)

    def put(self, table: dict[Any, Any], key: Any, value: Any) -> None:
        self._undo.append((table, key, table.get(key, _ABSENT)))
        table[key] = value

    def drop(self, table: dict[Any, Any], key: Any) -> None:
        if key in table:
            self._undo.append((table, key, table[key]))
            del table[key]

    def rollback(self, mark: int) -> None:
        undo = self._undo
        while len(undo) > mark:
            table, key, old = undo.pop()
            if old is _ABSENT:
                table.pop(key, None)
            else:
                table[key] = old


class Table:
    """One table's rows for a batch, by key: ``read`` holds each row as the database had
    it when the batch read it (None: no row), ``rows`` as the batch has made it. A key in
    neither is unknown: the family reads it before using it (``want`` and ``load``)."""

    __slots__ = ("journal", "read", "rows", "wanted", "touched")

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.read: dict[Any, Any] = {}
        self.rows: dict[Any, Any] = {}
        self.wanted: set[Any] = set()
        self.touched: dict[Any, None] = {}  # keys put since the last flush, in order (the changed ones among them)

    def want(self, key: Any) -> None:
        """Ask for ``key`` to be read with the batch's next read (unless known already)."""
        if key not in self.rows:
            self.wanted.add(key)
            self.journal.asked = True

    def take_wanted(self) -> list[Any]:
        """The keys asked for and not known yet (sorted, so a statement's text and
        parameters do not depend on set order); forgets the asking."""
        wanted = self.wanted
        if not wanted:
            return []
        rows = self.rows
        if len(wanted) == 1:  # (a lone frame's usual case: no sort)
            (key,) = wanted
            wanted.clear()
            return [] if key in rows else [key]
        keys = sorted(k for k in wanted if k not in rows)
        wanted.clear()
        return keys

    def load(self, key: Any, row: Any) -> None:
        """``key`` as the database has it (``row``, or None for no row), unless the batch
        knows it already: then the batch's row stands (it holds the batch's own changes, and
        a read has nothing newer under the bridge's lock). Not journaled: a key is loaded
        only while unknown, so nothing the batch wrote is in its row, and a frame taken back
        leaves that fact as true as it was."""
        if key in self.rows:
            return
        self.read[key] = row
        self.rows[key] = row

    def load_found(self, keys: Iterable[Any], found: dict[Any, Any]) -> None:
        """Each of ``keys``, read, as ``found`` has it (a key ``found`` lacks: no row)."""
        for key in keys:
            self.load(key, found.get(key))

    def fetch(self, key: Any, tx: Tx, reads: Callable[[], list[Any]]) -> Any:
        """``key``'s row as the batch has it. An unknown key is read first, with every other
        key its family was asked for (``reads``: the family's ``reads``), in one round trip."""
        if key not in self.rows:
            self.want(key)
            read_all(tx, reads())
        return self.rows[key]

    def known(self, key: Any) -> bool:
        return key in self.rows

    def get(self, key: Any) -> Any:
        return self.rows[key]

    def put(self, key: Any, row: Any) -> None:
        self.journal.put(self.rows, key, row)
        self.touched[key] = None

    def forget(self, key: Any) -> None:
        """Make ``key`` unknown again (someone else's statement in this transaction
        changed its row): the next use reads it afresh."""
        self.journal.drop(self.read, key)
        self.journal.drop(self.rows, key)

    def changed(self) -> list[tuple[Any, Any, Any]]:
        """``(key, read, row)`` of every key whose row differs from what was read (in the
        order the keys were first put), and forgets which keys were put: the caller writes
        them (``written``) or puts them back."""
        touched = self.touched
        if not touched:
            return []
        read, rows = self.read, self.rows
        out = []
        for key in touched:
            row = rows.get(key, _ABSENT)
            if row is _ABSENT:
                continue  # forgotten since
            was = read.get(key)
            if row != was:
                out.append((key, was, row))
        self.touched = {}
        return out

    def written(self, keys: Iterable[Any]) -> None:
        """The database now holds these keys' rows as the batch has them."""
        journal, rows, read = self.journal, self.rows, self.read
        for key in keys:
            journal.put(read, key, rows[key])


def recordset(columns: str, param: str = "rows") -> dict[str, str]:
    """The ``FROM`` item ``r`` of the JSON rows in ``:param``, per dialect: ``columns`` is
    ``"name type, ..."`` with PostgreSQL types (SQLite takes the values as JSON gives them:
    text, integers, and 1/0 for booleans)."""
    names = [part.split()[0] for part in columns.split(",")]
    picks = ", ".join(f"value ->> '$.{name}' AS {name}" for name in names)
    return {
        "postgresql": f"json_to_recordset(CAST(:{param} AS json)) AS r({columns})",
        "sqlite": f"(SELECT {picks} FROM json_each(:{param})) AS r",
    }


class Write:
    """A table family's write of the rows it changed, as one statement: ``template`` (SQL
    text whose ``{rows}`` is the ``FROM`` item ``r`` of the rows; ``columns`` is ``"name
    type, ..."`` with PostgreSQL types). ``one``: the rows are one row of named parameters
    (SQLite runs it once per row); ``many`` (PostgreSQL): the JSON rows in ``:rows``. A
    ``Writer`` picks."""

    __slots__ = ("one", "many")

    def __init__(self, name: str, template: str, columns: str) -> None:
        spec = [part.split() for part in columns.split(",")]
        one_pg = "(SELECT " + ", ".join(f"CAST(:{n} AS {t}) AS {n}" for n, t in spec) + ") AS r"
        one_sqlite = "(SELECT " + ", ".join(f":{n} AS {n}" for n, _t in spec) + ") AS r"
        many_pg = recordset(columns)["postgresql"]
        self.one = PerDialect(name=name, postgresql=template.format(rows=one_pg),
                              sqlite=template.format(rows=one_sqlite))
        self.many = PerDialect(name=name, postgresql=template.format(rows=many_pg),
                               sqlite=template.format(rows=one_sqlite))


class Writer:
    """How a batch's flush writes rows: ``writer(write, rows, **params)``. PostgreSQL: one
    statement (``Write.one`` for one row, ``Write.many`` over JSON for more), through
    ``Tx.later`` (behind, with the ``COMMIT``, when the transaction writes behind; else at
    once); SQLite: ``Write.one``, once per row, now. Returns what was written (``Rows`` on
    PostgreSQL: read it after the commit, or pay a round trip)."""

    __slots__ = ("tx",)

    def __init__(self, tx: Tx) -> None:
        self.tx = tx

    def __call__(self, write: Write, rows: list[dict[str, Any]], **params: Any) -> Any:
        tx = self.tx
        if len(rows) == 1:
            one = {**params, **rows[0]} if params else rows[0]
            return tx.later(write.one, one) if tx.dialect == "postgresql" else tx.rowcount(write.one, one)
        if tx.dialect == "postgresql":
            return tx.later(write.many, {**params, "rows": rows_json(rows)})
        return tx.execute_many(write.one, [{**params, **row} for row in rows] if params else rows)


def probe(table: str, columns: str, keys: str, where: str = "true", order: str = "") -> dict[str, str]:
    """``SELECT columns FROM table`` for each key in ``:keys``, with ``where`` on top, per
    dialect. ``keys`` names one key column (``:keys`` a JSON array of values) or two, comma
    separated (``:keys`` a JSON array of objects). Each key is one index probe, whatever
    the planner's estimates: on PostgreSQL a lateral lookup a key behind an ``OFFSET 0``
    fence (a prepared statement's generic plan takes an array of keys for 100 rows, and
    would scan a small table whole for one key); on SQLite an ``IN`` list.
    ``order``: an ``ORDER BY`` of ``columns``."""
    names = [k.strip() for k in keys.split(",")]
    picked = ", ".join(f"t.{c.strip()}" for c in columns.split(","))
    if len(names) == 1:
        (k,) = names
        source_pg = f"json_array_elements_text(CAST(:keys AS json)) AS r({k})"
        member_sqlite = f"{k} IN (SELECT value FROM json_each(:keys))"
    else:
        source_pg = recordset(", ".join(f"{k} text" for k in names), "keys")["postgresql"]
        inner = recordset(", ".join(f"{k} text" for k in names), "keys")["sqlite"]
        member_sqlite = f"({', '.join(names)}) IN (SELECT {', '.join(f'r.{k}' for k in names)} FROM {inner})"
    match = " AND ".join(f"{k} = r.{k}" for k in names)
    return {
        "postgresql": f"SELECT {picked} FROM {source_pg} CROSS JOIN LATERAL (SELECT {columns} FROM {table} "
                      f"WHERE {match} AND {where} OFFSET 0) t" + (f" ORDER BY t.{order}" if order else ""),
        "sqlite": f"SELECT {columns} FROM {table} WHERE {where} AND {member_sqlite}"
                  + (f" ORDER BY {order}" if order else ""),
    }


class Read:
    """A table family's read of the rows of some keys, as one statement: ``SELECT columns
    FROM table`` for each key, with ``where`` on top. ``keys`` names the key column (a key
    is its value) or two, comma separated (a key is a pair). For one key, a plain lookup
    (``one``); for several (``many``), the JSON array of them in ``:keys``, each key one
    index probe whatever the planner's estimates (``probe``). ``order``: an ``ORDER BY`` of
    ``columns``. ``of(keys, **params)`` gives the statement and its parameters."""

    __slots__ = ("names", "one", "many")

    def __init__(self, name: str, table: str, columns: str, keys: str, where: str = "true", order: str = "") -> None:
        names = [k.strip() for k in keys.split(",")]
        self.names = names
        match = " AND ".join(f"{k} = :{k}" for k in names)
        one = f"SELECT {columns} FROM {table} WHERE {match} AND {where}" + (f" ORDER BY {order}" if order else "")
        self.one = PerDialect(name=name, postgresql=one, sqlite=one)
        self.many = PerDialect(name=name, **probe(table, columns, keys, where, order))

    def of(self, keys: list[Any], **params: Any) -> tuple[Stmt, dict[str, Any]]:
        names = self.names
        if len(keys) == 1:  # (``params`` is this call's own dict: filled in place)
            if len(names) == 1:
                params[names[0]] = keys[0]
            else:
                params.update(zip(names, keys[0], strict=True))
            return self.one, params
        if len(names) == 1:
            return self.many, {**params, "keys": rows_json(keys)}
        return self.many, {**params, "keys": rows_json([dict(zip(names, key, strict=True)) for key in keys])}


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def rows_json(rows: list[Any]) -> str:
    """JSON text of rows for ``recordset``, or of keys for ``probe`` (ASCII, so any text
    survives both decoders)."""
    return _ENCODE(rows)


def read_all(tx: Tx, reads: list[tuple[Stmt, dict[str, Any], Callable[[list[tuple[Any, ...]]], None]]]) -> None:
    """Run ``reads`` and hand each its rows: on PostgreSQL every read is announced first
    (``Tx.read_ahead``), so they all go out in one round trip, with whatever waits."""
    if not reads:
        return
    for stmt, params, _ in reads:
        tx.read_ahead(stmt, params)
    for stmt, params, take in reads:
        take(tx.all(stmt, params))
