"""Messages seen on a bridge (the projection's ``bridge_messages``; hub channel messages are
``messages``): guarded writes, edits and deletes, and the reads for the API and MCP.

Natural key: (bridge, conversation, remote_message_id). The id is derived from it, so the
primary key is the natural key's uniqueness (see ``tidings.ingest.projection.derive_id``).

Write guards:

* ``upsert`` is the guarded natural-key upsert: an insert (``ON CONFLICT DO NOTHING``),
  and only on a conflict an update of sender, direction, body, reply and time that
  writes only when one of them differs (``MESSAGE_GUARD``) and only while the message is
  still ``active``: a re-delivered original never undoes an edit or a delete. Two
  statements instead of one ``DO UPDATE`` because the caller needs to know "inserted"
  (a new message) apart from "updated", which SQLite's upsert cannot report;
* ``edit``: last writer wins by the edit's occurrence time (``mutated_at_ms``); the same
  edit twice writes nothing; a deleted message stays deleted;
* ``delete``: terminal; clears the body; a second delete writes nothing.
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

from . import search_index
from .engine import Rows, Tx
from .sql import PerDialect, Stmt

FAR_FUTURE_MS = 2**62

_INSERT = (
    "INSERT INTO bridge_messages (id, bridge_id, conversation_id, remote_message_id, sender_identity_id, "
    "direction, body, reply_to_remote_id, state, occurred_at_ms, created_at_ms, updated_at_ms) VALUES "
    "(:id, :bridge_id, :conversation_id, :remote_message_id, :sender, :direction, :body, :reply_to, "
    "'active', :occurred, :now, :now) ON CONFLICT DO NOTHING"
)
INSERT = Stmt(_INSERT, name="bridge_messages.insert")
# The one guard predicate of this table: every content column the upsert's update sets.
MESSAGE_GUARD = (
    "sender_identity_id IS DISTINCT FROM :sender"
    " OR direction IS DISTINCT FROM :direction"
    " OR body IS DISTINCT FROM :body"
    " OR reply_to_remote_id IS DISTINCT FROM :reply_to"
    " OR occurred_at_ms IS DISTINCT FROM :occurred"
)
_UPDATE_GUARDED = (
    "UPDATE bridge_messages SET sender_identity_id = :sender, direction = :direction, body = :body, "
    "reply_to_remote_id = :reply_to, occurred_at_ms = :occurred, updated_at_ms = :now "
    f"WHERE id = :id AND state = 'active' AND ({MESSAGE_GUARD})"
)
UPDATE_GUARDED = Stmt(_UPDATE_GUARDED, name="bridge_messages.update_guarded")
# PostgreSQL: the same two writes in one statement. Both see the snapshot from before it, so
# the update finds no row the insert made; one row comes back per row written.
UPSERT_ROWS = Stmt(
    f"WITH inserted AS ({_INSERT} RETURNING 1), updated AS ({_UPDATE_GUARDED} RETURNING 1) "
    "SELECT 1 FROM inserted UNION ALL SELECT 1 FROM updated",
    name="bridge_messages.upsert_rows",
)
EDIT = Stmt(
    "UPDATE bridge_messages SET body = :body, state = 'edited', mutated_at_ms = :at, updated_at_ms = :now "
    "WHERE id = :id AND state <> 'deleted' AND (mutated_at_ms IS NULL OR mutated_at_ms < :at "
    "OR (mutated_at_ms = :at AND (body <> :body OR state <> 'edited'))) "
    "RETURNING sender_identity_id, direction",
    name="bridge_messages.edit",
)
DELETE = Stmt(
    "UPDATE bridge_messages SET body = '', state = 'deleted', mutated_at_ms = :at, updated_at_ms = :now "
    "WHERE id = :id AND state <> 'deleted' RETURNING sender_identity_id, direction",
    name="bridge_messages.delete",
)
EXISTS = Stmt("SELECT 1 FROM bridge_messages WHERE id = :id", name="bridge_messages.exists")
OCCURRED = Stmt("SELECT occurred_at_ms FROM bridge_messages WHERE id = :id", name="bridge_messages.occurred")
BY_REMOTE = Stmt(
    "SELECT id, conversation_id, occurred_at_ms FROM bridge_messages "
    "WHERE bridge_id = :bridge_id AND remote_message_id = :remote_message_id LIMIT 2",
    name="bridge_messages.by_remote",
)

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


class Change(NamedTuple):
    """What an edit or delete hit: the message's sender and direction."""

    sender_identity_id: str | None
    direction: str


def insert(
    tx: Tx,
    *,
    id: str,
    bridge_id: str,
    conversation_id: str,
    remote_message_id: str,
    sender_identity_id: str | None,
    direction: str,
    body: str,
    reply_to_remote_id: str | None,
    occurred_at_ms: int,
    now: int,
) -> bool:
    """Insert a new message; False (and nothing written) when the natural key exists."""
    search_index.queued(tx)
    return tx.rowcount(INSERT, _params(locals())) > 0


def update_guarded(
    tx: Tx,
    *,
    id: str,
    sender_identity_id: str | None,
    direction: str,
    body: str,
    reply_to_remote_id: str | None,
    occurred_at_ms: int,
    now: int,
) -> bool:
    """Update an ``active`` message's content when a column differs. True when written."""
    search_index.queued(tx)
    return tx.rowcount(UPDATE_GUARDED, _params(locals())) > 0


def upsert(
    tx: Tx,
    *,
    id: str,
    bridge_id: str,
    conversation_id: str,
    remote_message_id: str,
    sender_identity_id: str | None,
    direction: str,
    body: str,
    reply_to_remote_id: str | None,
    occurred_at_ms: int,
    now: int,
) -> str | None:
    """The guarded natural-key upsert: ``"inserted"``, ``"updated"`` or None (no write)."""
    params = {
        "id": id,
        "bridge_id": bridge_id,
        "conversation_id": conversation_id,
        "remote_message_id": remote_message_id,
        "sender": sender_identity_id,
        "direction": direction,
        "body": body,
        "reply_to": reply_to_remote_id,
        "occurred": occurred_at_ms,
        "now": now,
    }  # the projection's hot path: what ``_params(locals())`` gives, built directly
    search_index.queued(tx)
    if tx.rowcount(INSERT, params) > 0:
        return "inserted"
    if tx.rowcount(UPDATE_GUARDED, params) > 0:
        return "updated"
    return None


def upsert_behind(
    tx: Tx,
    *,
    id: str,
    bridge_id: str,
    conversation_id: str,
    remote_message_id: str,
    sender_identity_id: str | None,
    direction: str,
    body: str,
    reply_to_remote_id: str | None,
    occurred_at_ms: int,
    now: int,
) -> Rows:
    """``upsert`` when the caller need not know at once which of its two writes wrote: the
    rows written, 1 for an insert or an update, 0 for neither (a write that may go behind,
    ``Tx.later``). Same rows as ``upsert``. PostgreSQL: one statement (``UPSERT_ROWS``);
    SQLite, which has no writes in ``WITH``: the insert, then the guarded update, whose
    guard finds every column equal after an insert that inserted."""
    params = _params(locals())
    search_index.queued(tx)
    if tx.dialect == "postgresql":
        return tx.later(UPSERT_ROWS, params)
    return tx.later(INSERT, params) + tx.later(UPDATE_GUARDED, params)


def _params(values: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": values["id"],
        "bridge_id": values.get("bridge_id"),
        "conversation_id": values.get("conversation_id"),
        "remote_message_id": values.get("remote_message_id"),
        "sender": values["sender_identity_id"],
        "direction": values["direction"],
        "body": values["body"],
        "reply_to": values["reply_to_remote_id"],
        "occurred": values["occurred_at_ms"],
        "now": values["now"],
    }


def edit(tx: Tx, *, id: str, body: str, at_ms: int, now: int) -> Change | None:
    """Apply an edit unless the message is deleted or a newer edit is stored (last writer
    wins by ``at_ms``). The changed message's sender and direction, or None (no write)."""
    search_index.queued(tx)
    rows = tx.all(EDIT, {"id": id, "body": body, "at": at_ms, "now": now})
    return Change(rows[0][0], rows[0][1]) if rows else None


def delete(tx: Tx, *, id: str, at_ms: int, now: int) -> Change | None:
    """Mark deleted and clear the body; None when missing or already deleted."""
    search_index.queued(tx)
    rows = tx.all(DELETE, {"id": id, "at": at_ms, "now": now})
    return Change(rows[0][0], rows[0][1]) if rows else None


def edit_behind(tx: Tx, *, id: str, body: str, at_ms: int, now: int) -> Rows:
    """``edit`` when the caller needs only the rows written (a write that may go behind)."""
    return tx.later(EDIT, {"id": id, "body": body, "at": at_ms, "now": now})


def delete_behind(tx: Tx, *, id: str, at_ms: int, now: int) -> Rows:
    """``delete`` when the caller needs only the rows written (a write that may go behind)."""
    return tx.later(DELETE, {"id": id, "at": at_ms, "now": now})


def read_ahead_exists(tx: Tx, message_id: str) -> None:
    """Announce an ``exists`` read (``Tx.read_ahead``)."""
    tx.read_ahead(EXISTS, {"id": message_id})


def read_ahead_occurred_at(tx: Tx, message_id: str) -> None:
    """Announce an ``occurred_at`` read (``Tx.read_ahead``)."""
    tx.read_ahead(OCCURRED, {"id": message_id})


def exists(tx: Tx, message_id: str) -> bool:
    return tx.one(EXISTS, {"id": message_id}) is not None


def occurred_at(tx: Tx, message_id: str) -> int | None:
    return cast("int | None", tx.scalar(OCCURRED, {"id": message_id}))


def locate_remote(tx: Tx, bridge_id: str, remote_message_id: str) -> tuple[str, str, int] | None:
    """``(id, conversation_id, occurred_at_ms)`` of the one message of ``bridge_id`` with
    that remote id, in whichever conversation; None when there is none, or more than one
    (an ambiguous id places nothing)."""
    rows = tx.all(BY_REMOTE, {"bridge_id": bridge_id, "remote_message_id": remote_message_id})
    return tuple(rows[0]) if len(rows) == 1 else None


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
