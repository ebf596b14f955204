"""Messages seen on a bridge (the projection's ``bridge_messages``; hub channel messages are
``messages``): guarded writes, edits and deletes, and the reads for the API and MCP.

Natural key: (bridge, conversation, remote_message_id). The id is derived from it, so the
primary key is the natural key's uniqueness (see ``tidings.ingest.projection.derive_id``).

``Messages`` holds what a batch of frames reads and writes of one bridge's messages
(``store/batch_rows.py``, D115), with the write guards:

* ``upsert`` is the guarded natural-key upsert: an insert, or, for a stored message that
  is still ``active``, an update of sender, direction, body, reply and time when one of
  them differs: a re-delivered original never undoes an edit or a delete. It says
  ``"inserted"`` (a new message) apart from ``"updated"``;
* ``edit``: last writer wins by the edit's occurrence time (``mutated_at_ms``); the same
  edit twice writes nothing; a deleted message stays deleted;
* ``delete``: terminal; clears the body; a second delete writes nothing.

A flush writes new messages and content changes in one upsert, and messages whose only
change is an edit or a delete in one update of body, state and mutation time alone, so a
flush never writes a column its frames did not change (the outbox's echo report may turn
a stored message ``outgoing`` meanwhile, under the echo lock).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import search_index
from .batch_rows import Journal, Read, Table, Write, Writer
from .engine import Tx
from .sql import PerDialect, Stmt

FAR_FUTURE_MS = 2**62


class Message(NamedTuple):
    """A stored bridge message (the key, its id, is the ``Table``'s)."""

    conversation_id: str
    remote_message_id: str
    sender_identity_id: str | None
    direction: str
    body: str
    reply_to_remote_id: str | None
    state: str
    occurred_at_ms: int
    mutated_at_ms: int | None
    created_at_ms: int
    updated_at_ms: int

    def content(self) -> tuple[Any, ...]:
        """What the upsert's guard compares."""
        return (self.sender_identity_id, self.direction, self.body, self.reply_to_remote_id, self.occurred_at_ms)


class Change(NamedTuple):
    """What an edit or delete hit: the message's sender and direction."""

    sender_identity_id: str | None
    direction: str


_MESSAGE_COLUMNS = (
    "id, conversation_id, remote_message_id, sender_identity_id, direction, body, reply_to_remote_id, state, "
    "occurred_at_ms, mutated_at_ms, created_at_ms, updated_at_ms"
)
READ_BY_IDS = Read("bridge_messages.read_by_ids", "bridge_messages", _MESSAGE_COLUMNS, "id")
# Messages of the bridge by remote id, in whichever conversation (a Signal read receipt names
# the message, not always its conversation).
READ_BY_REMOTE_IDS = Read("bridge_messages.read_by_remote_ids", "bridge_messages", _MESSAGE_COLUMNS,
                          "remote_message_id", "bridge_id = :bridge_id")
WRITE_ROWS = Write(
    "bridge_messages.write_rows",
    "INSERT INTO bridge_messages (id, bridge_id, conversation_id, remote_message_id, sender_identity_id, "
    "direction, body, reply_to_remote_id, state, occurred_at_ms, mutated_at_ms, created_at_ms, updated_at_ms) "
    "SELECT r.id, :bridge_id, r.conversation_id, r.remote_message_id, r.sender_identity_id, r.direction, "
    "r.body, r.reply_to_remote_id, r.state, r.occurred_at_ms, r.mutated_at_ms, r.created_at_ms, "
    "r.updated_at_ms FROM {rows} WHERE true ON CONFLICT (id) DO UPDATE SET "
    "sender_identity_id = excluded.sender_identity_id, direction = excluded.direction, body = excluded.body, "
    "reply_to_remote_id = excluded.reply_to_remote_id, state = excluded.state, "
    "occurred_at_ms = excluded.occurred_at_ms, mutated_at_ms = excluded.mutated_at_ms, "
    "updated_at_ms = excluded.updated_at_ms "
    "WHERE (bridge_messages.sender_identity_id, bridge_messages.direction, bridge_messages.body, "
    "bridge_messages.reply_to_remote_id, bridge_messages.state, bridge_messages.occurred_at_ms, "
    "bridge_messages.mutated_at_ms) IS DISTINCT FROM (excluded.sender_identity_id, excluded.direction, "
    "excluded.body, excluded.reply_to_remote_id, excluded.state, excluded.occurred_at_ms, "
    "excluded.mutated_at_ms)",
    "id text, conversation_id text, remote_message_id text, sender_identity_id text, direction text, body text, "
    "reply_to_remote_id text, state text, occurred_at_ms bigint, mutated_at_ms bigint, created_at_ms bigint, "
    "updated_at_ms bigint",
)
WRITE_MUTATIONS = Write(
    "bridge_messages.write_mutations",
    "UPDATE bridge_messages SET body = r.body, state = r.state, mutated_at_ms = r.mutated_at_ms, "
    "updated_at_ms = r.updated_at_ms FROM {rows} WHERE bridge_messages.id = r.id "
    "AND (bridge_messages.body, bridge_messages.state, bridge_messages.mutated_at_ms) IS DISTINCT FROM "
    "(r.body, r.state, r.mutated_at_ms)",
    "id text, body text, state text, mutated_at_ms bigint, updated_at_ms bigint",
)


def _message(row: tuple[Any, ...]) -> Message:
    return Message(*row[1:])


class Messages:
    """The messages of one bridge that a batch reads and writes, by id."""

    __slots__ = ("tx", "journal", "bridge_id", "table", "remote", "new_by_remote")

    def __init__(self, tx: Tx, journal: Journal, bridge_id: str) -> None:
        self.tx = tx
        self.journal = journal
        self.bridge_id = bridge_id
        self.table = Table(journal)
        # remote message id -> frozenset of the ids of the bridge's stored messages with it
        self.remote = Table(journal)
        # remote message id -> ids of the messages with it that this batch inserted
        self.new_by_remote: dict[str, frozenset[str]] = {}

    def want(self, message_id: str) -> None:
        self.table.want(message_id)

    def want_remote(self, remote_message_id: str) -> None:
        self.remote.want(remote_message_id)

    def reads(self) -> list[Any]:
        out: list[Any] = []
        ids = self.table.take_wanted()
        if ids:
            def take(rows: list[tuple[Any, ...]]) -> None:
                self.table.load_found(ids, {r[0]: _message(r) for r in rows})

            out.append((*READ_BY_IDS.of(ids), take))
        remotes = self.remote.take_wanted()
        if remotes:
            def take_remote(rows: list[tuple[Any, ...]]) -> None:
                by_remote: dict[str, set[str]] = {key: set() for key in remotes}
                for r in rows:
                    by_remote[r[2]].add(r[0])
                    self.table.load(r[0], _message(r))
                for key in remotes:
                    self.remote.load(key, frozenset(by_remote[key]))

            out.append((*READ_BY_REMOTE_IDS.of(remotes, bridge_id=self.bridge_id), take_remote))
        return out

    def get(self, message_id: str) -> Message | None:
        """The message as the batch has it (read now if the batch has not read it)."""
        row: Message | None = self.table.fetch(message_id, self.tx, self.reads)
        return row

    def exists(self, message_id: str) -> bool:
        return self.get(message_id) is not None

    def occurred_at(self, message_id: str) -> int | None:
        row = self.get(message_id)
        return None if row is None else row.occurred_at_ms

    def locate_remote(self, remote_message_id: str) -> tuple[str, str, int] | None:
        """``(id, conversation_id, occurred_at_ms)`` of the one message of the bridge with
        that remote id, in whichever conversation; None when there is none, or more than one
        (an ambiguous id places nothing)."""
        ids = self.remote.fetch(remote_message_id, self.tx, self.reads) | self.new_by_remote.get(
            remote_message_id, frozenset())
        found = [(mid, row) for mid in ids if (row := self.table.rows.get(mid)) is not None]
        if len(found) != 1:
            return None
        mid, row = found[0]
        return mid, row.conversation_id, row.occurred_at_ms

    def forget(self, message_id: str) -> None:
        """Read ``message_id`` afresh when next used (a statement outside the batch wrote
        it in this transaction)."""
        self.table.forget(message_id)

    def upsert(self, *, id: str, conversation_id: str, remote_message_id: str, sender_identity_id: str | None,
               direction: str, body: str, reply_to_remote_id: str | None, occurred_at_ms: int,
               now: int) -> str | None:
        """The guarded natural-key upsert: ``"inserted"``, ``"updated"`` or None (no write)."""
        have = self.get(id)
        if have is None:
            self.table.put(id, Message(conversation_id, remote_message_id, sender_identity_id, direction, body,
                                       reply_to_remote_id, "active", occurred_at_ms, None, now, now))
            known = self.new_by_remote.get(remote_message_id, frozenset())
            self.journal.put(self.new_by_remote, remote_message_id, known | {id})
            return "inserted"
        if have.state != "active" or have.content() == (
            sender_identity_id, direction, body, reply_to_remote_id, occurred_at_ms
        ):
            return None
        self.table.put(id, have._replace(sender_identity_id=sender_identity_id, direction=direction, body=body,
                                         reply_to_remote_id=reply_to_remote_id, occurred_at_ms=occurred_at_ms,
                                         updated_at_ms=now))
        return "updated"

    def edit(self, *, id: str, body: str, at_ms: int, now: int) -> Change | None:
        """Apply an edit unless the message is missing or deleted, or a newer edit is
        stored (last writer wins by ``at_ms``; the same edit again writes nothing). The
        changed message's sender and direction, or None (no write)."""
        have = self.get(id)
        if have is None or have.state == "deleted":
            return None
        mutated = have.mutated_at_ms
        if not (mutated is None or mutated < at_ms or (mutated == at_ms and (have.body != body
                                                                             or have.state != "edited"))):
            return None
        self.table.put(id, have._replace(body=body, state="edited", mutated_at_ms=at_ms, updated_at_ms=now))
        return Change(have.sender_identity_id, have.direction)

    def delete(self, *, id: str, at_ms: int, now: int) -> Change | None:
        """Mark deleted and clear the body; None when missing or already deleted."""
        have = self.get(id)
        if have is None or have.state == "deleted":
            return None
        self.table.put(id, have._replace(body="", state="deleted", mutated_at_ms=at_ms, updated_at_ms=now))
        return Change(have.sender_identity_id, have.direction)

    def flush(self, send: Writer) -> None:
        """Write new messages and content changes (one upsert), then messages changed only
        in body, state and mutation time (one update of those columns alone)."""
        table = self.table
        full, mutated, written = [], [], []
        for key, was, row in table.changed():
            if was is not None and _fixed(was) == _fixed(row):
                if _mutable(was) == _mutable(row):
                    table.put(key, was)  # changed and changed back: nothing to write
                    continue
                mutated.append({"id": key, "body": row.body, "state": row.state, "mutated_at_ms": row.mutated_at_ms,
                                "updated_at_ms": row.updated_at_ms})
            else:
                full.append({"id": key, "conversation_id": row.conversation_id,
                             "remote_message_id": row.remote_message_id, "sender_identity_id": row.sender_identity_id,
                             "direction": row.direction, "body": row.body,
                             "reply_to_remote_id": row.reply_to_remote_id, "state": row.state,
                             "occurred_at_ms": row.occurred_at_ms, "mutated_at_ms": row.mutated_at_ms,
                             "created_at_ms": row.created_at_ms, "updated_at_ms": row.updated_at_ms})
            written.append(key)
        if full:
            send(WRITE_ROWS, full, bridge_id=self.bridge_id)
        if mutated:
            send(WRITE_MUTATIONS, mutated)
        if written:
            search_index.queued(self.tx)
            table.written(written)
        # What the batch inserted is stored now: the stored ids by remote id include it.
        for remote_id, ids in list(self.new_by_remote.items()):
            if self.remote.known(remote_id):
                self.remote.put(remote_id, self.remote.get(remote_id) | ids)
                self.remote.written([remote_id])
            self.journal.drop(self.new_by_remote, remote_id)


def _fixed(row: Message) -> tuple[Any, ...]:
    """The columns only the upsert changes (an edit or a delete never does)."""
    return (row.sender_identity_id, row.direction, row.reply_to_remote_id, row.occurred_at_ms)


def _mutable(row: Message) -> tuple[Any, ...]:
    """The columns an edit or a delete changes."""
    return (row.body, row.state, row.mutated_at_ms)


# -- reads -------------------------------------------------------------------------------
_READ_COLUMNS = (
    "m.id, m.bridge_id, m.conversation_id, m.remote_message_id, m.sender_identity_id, "
    "i.raw AS sender_raw, i.display_name AS sender_name, i.is_self AS sender_is_self, m.direction, m.body, "
    "m.reply_to_remote_id, m.state, m.occurred_at_ms, m.created_at_ms, m.updated_at_ms"
)
OF_CONVERSATION = Stmt(
    f"SELECT {_READ_COLUMNS} FROM bridge_messages m LEFT JOIN identities i ON i.id = m.sender_identity_id "
    "WHERE m.conversation_id = :conversation_id AND (m.occurred_at_ms, m.id) < (:before_ms, :before_id) "
    "ORDER BY m.occurred_at_ms DESC, m.id DESC LIMIT :limit",
    name="bridge_messages.of_conversation",
)
BY_ID = Stmt(
    f"SELECT {_READ_COLUMNS} FROM bridge_messages m LEFT JOIN identities i ON i.id = m.sender_identity_id "
    "WHERE m.id = :id",
    name="bridge_messages.by_id",
)
_SEARCH_WHERE = (
    "WHERE m.state <> 'deleted' AND m.body {op} :pattern ESCAPE '\\' "
    "AND (CAST(:bridge_id AS TEXT) IS NULL OR m.bridge_id = :bridge_id) "
    "AND (CAST(:owner_id AS TEXT) IS NULL OR m.bridge_id IN (SELECT b.id FROM bridges b WHERE b.owner_id = :owner_id)) "
    "ORDER BY m.occurred_at_ms DESC, m.id DESC LIMIT :limit"
)
_SEARCH = (
    f"SELECT {_READ_COLUMNS}, c.remote_conversation_id, c.title AS conversation_title "
    "FROM bridge_messages m JOIN conversations c ON c.id = m.conversation_id "
    "LEFT JOIN identities i ON i.id = m.sender_identity_id "
)
SEARCH = PerDialect(
    name="bridge_messages.search",
    # SQLite's LIKE is case-insensitive for ASCII; PostgreSQL needs ILIKE.
    sqlite=_SEARCH + _SEARCH_WHERE.format(op="LIKE"),
    postgresql=_SEARCH + _SEARCH_WHERE.format(op="ILIKE"),
)


# -- reads -------------------------------------------------------------------------------
def of_conversation(
    tx: Tx, conversation_id: str, *, limit: int = 100, before_ms: int | None = None, before_id: str = ""
) -> list[dict[str, Any]]:
    """A conversation's messages, newest first (``occurred_at_ms`` then id, descending).

    Keyset paging on ``(occurred_at_ms, id)``: ``before_ms`` alone keeps messages strictly
    older (``before_id`` ``""`` sorts below every id); with the last row's id as
    ``before_id``, the next page resumes right after that row, ties included.
    """
    return tx.mappings(
        OF_CONVERSATION,
        {
            "conversation_id": conversation_id,
            "limit": limit,
            "before_ms": FAR_FUTURE_MS if before_ms is None else before_ms,
            "before_id": before_id,
        },
    )


def by_id(tx: Tx, message_id: str) -> dict[str, Any] | None:
    return tx.mapping(BY_ID, {"id": message_id})


def like_pattern(query: str) -> str:
    """``%query%`` with LIKE's wildcards escaped (escape character ``\\``)."""
    escaped = query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def search(
    tx: Tx,
    query: str,
    *,
    limit: int = 20,
    bridge_id: str | None = None,
    owner_id: str | None = None,
) -> list[dict[str, Any]]:
    """Messages whose body contains ``query`` (case-insensitive), newest first.

    ``bridge_id`` restricts to one bridge; ``owner_id`` to the bridges that human owns
    (what an agent of that owner may read). Deleted messages are never found.
    """
    return tx.mappings(
        SEARCH,
        {"pattern": like_pattern(query), "limit": limit, "bridge_id": bridge_id, "owner_id": owner_id},
    )
