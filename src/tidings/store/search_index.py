"""The search index catches up with the messages in batches (SQLite; migration 0013).

Guarantees:

* **Nothing is lost.** A write of message text (hub ``messages.text``, bridge
  ``bridge_messages.body``: insert, change, delete) queues the change in
  ``<table>_fts_pending`` from a trigger, in the writing transaction: the queue is exactly
  as durable as the message, and a rolled-back write queues nothing.
* **A search sees every committed message.** ``searching`` opens the read a search runs
  in; when the queue is not empty it first indexes everything pending (``catch_up_all``),
  so every message committed before the search began is found by its current text, and a
  deleted or edited one never by text it no longer has. (A message written while the
  search runs may or may not be seen, as with any concurrent write.)
* **Batches.** ``catch_up`` moves up to ``batch`` queued changes into the FTS5 tables in
  the caller's write transaction, so FTS5 writes one index segment per batch instead of
  one per message transaction. Every queued change of a row it takes is consumed in the
  same batch, so a batch boundary never splits a row's changes.
* **Exact index.** For a row with queued changes, the index holds what it held before the
  first of them: the text recorded by that first change when it was a change of an
  indexed row (``old_text`` not NULL: removed with FTS5's ``delete``), nothing when it
  was an insert. After the batch the index holds the row's current text, or nothing when
  the row is gone. ``INSERT INTO <fts>(<fts>, rank) VALUES ('integrity-check', 1)`` checks
  it against the content (the tests do).

Who catches up: every search (``searching``), the hub's background pass
(``hub.search_indexer``, woken by ``SIGNAL`` after a commit that queued text), and
``catch_up_all`` for tools that load messages in bulk. PostgreSQL keeps its generated
``tsvector`` column, written by the row's own statement: nothing is ever pending there and
every function here is a no-op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from ..wakeups import WakeSignal
from .engine import Store, Tx
from .sql import Stmt

#: Queued changes a catch-up transaction takes at most (every change of the rows it
#: takes is consumed with them, so a transaction may move a few more).
BATCH = 2_000

#: Fault point: a catch-up fails after writing the index, before its commit.
FAULT_CATCH_UP = "search_index.catch_up"


@dataclass(frozen=True, slots=True)
class _Indexed:
    """One indexed table: its FTS5 table, the content table and column, the queue."""

    fts: str
    content: str
    rowid: str
    column: str

    @property
    def queue(self) -> str:
        return f"{self.fts}_pending"


INDEXED = (
    _Indexed("messages_fts", "messages", "seq", "text"),
    _Indexed("bridge_messages_fts", "bridge_messages", "rowid", "body"),
)


@dataclass(frozen=True, slots=True)
class _Statements:
    upto: Stmt
    remove_old: Stmt
    add_current: Stmt
    consume: Stmt
    count: Stmt


def _statements(t: _Indexed) -> _Statements:
    taken = f"SELECT rid FROM {t.queue} WHERE id <= :upto"
    return _Statements(
        upto=Stmt(f"SELECT max(id) FROM (SELECT id FROM {t.queue} ORDER BY id LIMIT :batch)",
                  name=f"search_index.{t.fts}.upto"),
        # What the index holds for each taken row: the text its FIRST queued change recorded.
        remove_old=Stmt(
            f"INSERT INTO {t.fts} ({t.fts}, rowid, {t.column}) "
            f"SELECT 'delete', rid, old_text FROM (SELECT rid, old_text, "
            f"row_number() OVER (PARTITION BY rid ORDER BY id) AS nth FROM {t.queue} WHERE rid IN ({taken})) "
            "WHERE nth = 1 AND old_text IS NOT NULL",
            name=f"search_index.{t.fts}.remove_old",
        ),
        add_current=Stmt(
            f"INSERT INTO {t.fts} (rowid, {t.column}) SELECT {t.rowid}, {t.column} FROM {t.content} "
            f"WHERE {t.rowid} IN ({taken})",
            name=f"search_index.{t.fts}.add_current",
        ),
        consume=Stmt(f"DELETE FROM {t.queue} WHERE rid IN ({taken})", name=f"search_index.{t.fts}.consume"),
        count=Stmt(f"SELECT count(*) FROM {t.queue}", name=f"search_index.{t.fts}.count"),
    )


_STATEMENTS = [(t, _statements(t)) for t in INDEXED]
_ANY_PENDING = Stmt(
    "SELECT " + " OR ".join(f"EXISTS (SELECT 1 FROM {t.queue})" for t in INDEXED), name="search_index.any_pending"
)


# Wakes this process's background pass after a commit that queued text (a hint: the
# pass also runs when it has not been woken for a while, and every search catches up).
SIGNAL = WakeSignal()


def queued(tx: Tx) -> None:
    """The caller's transaction wrote indexed text: wake the background pass once it has
    committed (SQLite; nothing on PostgreSQL, whose index needs no pass)."""
    if tx.dialect == "sqlite":
        tx.after_commit(SIGNAL.bump)


def pending_count(tx: Tx) -> int:
    """Queued changes not yet in the index (0 on PostgreSQL)."""
    if tx.dialect != "sqlite":
        return 0
    return sum(int(tx.scalar(s.count) or 0) for _, s in _STATEMENTS)


def any_pending(tx: Tx) -> bool:
    if tx.dialect != "sqlite":
        return False
    return bool(tx.scalar(_ANY_PENDING))


def catch_up(tx: Tx, batch: int = BATCH) -> int:
    """Index up to ``batch`` queued changes of each table (and every other queued change
    of the same rows) in the caller's write transaction; the number of changes taken from
    the head of each queue, summed (0: nothing was pending)."""
    if tx.dialect != "sqlite":
        return 0
    taken = 0
    for _, s in _STATEMENTS:
        upto = tx.scalar(s.upto, {"batch": batch})
        if upto is None:
            continue
        params = {"upto": upto}
        tx.execute(s.remove_old, params).close()
        tx.execute(s.add_current, params).close()
        taken += tx.rowcount(s.consume, params)
    return taken


def catch_up_all(store: Store, batch: int = BATCH) -> int:
    """Index everything pending, one write transaction (one FTS5 commit) per batch; the
    number of queued changes consumed. A failed batch rolls back whole: its changes stay
    queued for the next catch-up."""
    if store.dialect != "sqlite":
        return 0
    with store.read() as tx:  # nothing pending: no write transaction, the writer lock stays free
        if not any_pending(tx):
            return 0
    total = 0
    while True:
        with store.write() as tx:
            n = catch_up(tx, batch)
            if n and store.faults.fire(FAULT_CATCH_UP):
                raise RuntimeError(f"fault {FAULT_CATCH_UP}: catch-up fails before its commit")
        total += n
        if n < batch:
            return total


@contextlib.contextmanager
def searching(store: Store) -> Iterator[Tx]:
    """The read transaction a search runs in: its index covers every message committed
    before it began (SQLite: after indexing whatever was pending; see the module doc)."""
    if store.dialect == "sqlite":
        with store.read() as tx:
            if not any_pending(tx):
                yield tx
                return
        catch_up_all(store)
    with store.read() as tx:
        yield tx
