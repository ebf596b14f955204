"""Bridge conversations and their rosters: rows, guarded writes, and the read queries.

Write guards, each statement built once:

* ``upsert`` updates kind, title and remote_revision only when one of them differs
  (``CONVERSATION_GUARD``), so ``updated_at_ms`` is the time of the last content change;
* ``mint_or_bump`` creates a conversation first seen in a message, or moves
  ``last_message_at_ms`` forwards, and only when strictly newer (an equal or older message
  writes nothing). Recency never moves ``updated_at_ms``;
* ``sync_roster`` confirms an unchanged roster with one read and no write, writes only the
  difference otherwise, rejects a repeated identity, and then advances the conversation's
  ``updated_at_ms`` (monotonically: never backwards);
* ``ensure_participant`` adds an observed sender to a roster (insert-if-absent).

The read functions at the end (``list_of_bridge``, ``participants_of_listed``, ``by_id``)
serve the HTTP API and the MCP tools.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from .engine import NO_ROWS, Rows, Tx
from .sql import Stmt

FAR_FUTURE_MS = 2**62  # "no upper bound" for before_ms reads

# The one guard predicate of this table: every content column the upsert sets.
CONVERSATION_GUARD = (
    "conversations.kind IS DISTINCT FROM excluded.kind"
    " OR conversations.title IS DISTINCT FROM excluded.title"
    " OR conversations.remote_revision IS DISTINCT FROM excluded.remote_revision"
)

UPSERT = Stmt(
    "INSERT INTO conversations (id, bridge_id, remote_conversation_id, kind, title, remote_revision, "
    "last_message_at_ms, created_at_ms, updated_at_ms) VALUES (:id, :bridge_id, :remote_id, :kind, "
    ":title, :remote_revision, 0, :now, :now) "
    "ON CONFLICT (bridge_id, remote_conversation_id) DO UPDATE SET kind = excluded.kind, "
    "title = excluded.title, remote_revision = excluded.remote_revision, "
    "updated_at_ms = excluded.updated_at_ms "
    f"WHERE {CONVERSATION_GUARD}",
    name="conversations.upsert",
)
BY_KEY = Stmt(
    "SELECT id, kind, title, remote_revision FROM conversations "
    "WHERE bridge_id = :bridge_id AND remote_conversation_id = :remote_id",
    name="conversations.by_key",
)
MINT_OR_BUMP = Stmt(
    "INSERT INTO conversations (id, bridge_id, remote_conversation_id, kind, title, remote_revision, "
    "last_message_at_ms, created_at_ms, updated_at_ms) VALUES (:id, :bridge_id, :remote_id, :kind, "
    "'', NULL, :at, :now, :now) "
    "ON CONFLICT (bridge_id, remote_conversation_id) DO UPDATE "
    "SET last_message_at_ms = excluded.last_message_at_ms "
    "WHERE conversations.last_message_at_ms < excluded.last_message_at_ms",
    name="conversations.mint_or_bump",
)
BUMP_RECENCY = Stmt(
    "UPDATE conversations SET last_message_at_ms = :at WHERE id = :id AND last_message_at_ms < :at",
    name="conversations.bump_recency",
)
TOUCH = Stmt(
    "UPDATE conversations SET updated_at_ms = :now WHERE id = :id AND updated_at_ms < :now",
    name="conversations.touch",
)

# -- roster ------------------------------------------------------------------------------
# One statement gives both "does the conversation exist" and its whole roster.
ROSTER = Stmt(
    "SELECT c.id, p.identity_id, p.role, p.display_name, p.is_active FROM conversations c "
    "LEFT JOIN conversation_participants p ON p.conversation_id = c.id WHERE c.id = :conversation_id",
    name="conversations.roster",
)
PARTICIPANT_INSERT = Stmt(
    "INSERT INTO conversation_participants (conversation_id, identity_id, bridge_id, role, display_name, "
    "is_active) VALUES (:conversation_id, :identity_id, :bridge_id, :role, :display_name, :is_active)",
    name="participants.insert",
)
PARTICIPANT_UPDATE = Stmt(
    "UPDATE conversation_participants SET role = :role, display_name = :display_name, "
    "is_active = :is_active WHERE conversation_id = :conversation_id AND identity_id = :identity_id",
    name="participants.update",
)
PARTICIPANT_DELETE = Stmt(
    "DELETE FROM conversation_participants WHERE conversation_id = :conversation_id "
    "AND identity_id = :identity_id",
    name="participants.delete",
)
PARTICIPANT_ENSURE = Stmt(
    "INSERT INTO conversation_participants (conversation_id, identity_id, bridge_id, role, display_name, "
    "is_active) VALUES (:conversation_id, :identity_id, :bridge_id, 'member', :display_name, true) "
    "ON CONFLICT (conversation_id, identity_id) DO NOTHING",
    name="participants.ensure",
)
# PostgreSQL: ensure, and touch the conversation when the identity was added, in one
# statement; the rows it returns are the participants added (0 or 1).
PARTICIPANT_ENSURE_TOUCH = Stmt(
    "WITH added AS (INSERT INTO conversation_participants (conversation_id, identity_id, bridge_id, role, "
    "display_name, is_active) VALUES (:conversation_id, :identity_id, :bridge_id, 'member', :display_name, true) "
    "ON CONFLICT (conversation_id, identity_id) DO NOTHING RETURNING conversation_id), "
    "touched AS (UPDATE conversations SET updated_at_ms = :now WHERE id = :conversation_id "
    "AND updated_at_ms < :now AND EXISTS (SELECT 1 FROM added)) "
    "SELECT 1 FROM added",
    name="participants.ensure_touch",
)

# -- reads -------------------------------------------------------------------------------
CONVERSATION_COLUMNS = (
    "id, bridge_id, remote_conversation_id, kind, title, remote_revision, last_message_at_ms, "
    "created_at_ms, updated_at_ms"
)
BY_ID = Stmt(f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = :id", name="conversations.by_id")
_LISTED = (
    "SELECT id FROM conversations WHERE bridge_id = :bridge_id "
    "AND (last_message_at_ms, id) < (:before_ms, :before_id) "
    "ORDER BY last_message_at_ms DESC, id DESC LIMIT :limit"
)
LIST_OF_BRIDGE = Stmt(
    f"SELECT {CONVERSATION_COLUMNS} FROM conversations "
    "WHERE bridge_id = :bridge_id AND (last_message_at_ms, id) < (:before_ms, :before_id) "
    "ORDER BY last_message_at_ms DESC, id DESC LIMIT :limit",
    name="conversations.list_of_bridge",
)
PARTICIPANTS_OF_LISTED = Stmt(
    "SELECT p.conversation_id, p.identity_id, i.kind, i.canonical, i.raw, i.display_name AS identity_name, "
    "i.is_self, p.role, p.display_name, p.is_active FROM conversation_participants p "
    "JOIN identities i ON i.id = p.identity_id "
    f"WHERE p.conversation_id IN ({_LISTED}) "
    "ORDER BY p.conversation_id, i.kind, i.canonical",
    name="conversations.participants_of_listed",
)
PARTICIPANTS_OF = Stmt(
    "SELECT p.conversation_id, p.identity_id, i.kind, i.canonical, i.raw, i.display_name AS identity_name, "
    "i.is_self, p.role, p.display_name, p.is_active FROM conversation_participants p "
    "JOIN identities i ON i.id = p.identity_id WHERE p.conversation_id = :conversation_id "
    "ORDER BY i.kind, i.canonical",
    name="conversations.participants_of",
)
BRIDGE_OWNER = Stmt("SELECT owner_id FROM bridges WHERE id = :id", name="bridges.owner")
CONVERSATION_OWNER = Stmt(
    "SELECT c.bridge_id, b.owner_id FROM conversations c JOIN bridges b ON b.id = c.bridge_id WHERE c.id = :id",
    name="conversations.owner",
)


class RosterRow(NamedTuple):
    """One roster entry as the projection wants it stored."""

    identity_id: str
    role: str
    display_name: str
    is_active: bool


class RosterError(ValueError):
    """A roster that cannot be stored (a repeated identity, a missing conversation)."""


# -- conversation rows -------------------------------------------------------------------
def upsert(
    tx: Tx,
    *,
    id: str,
    bridge_id: str,
    remote_id: str,
    kind: str,
    title: str,
    remote_revision: str | None,
    now: int,
) -> Rows:
    """Insert, or update kind/title/revision when one differs; the rows written (a write
    that may go behind, ``Tx.later``).

    A new row starts with ``last_message_at_ms = 0``; the stored ``id``, ``created_at_ms``
    and ``last_message_at_ms`` survive a conflict.
    """
    return tx.later(
        UPSERT,
        {
            "id": id,
            "bridge_id": bridge_id,
            "remote_id": remote_id,
            "kind": kind,
            "title": title,
            "remote_revision": remote_revision,
            "now": now,
        },
    )


def by_key(tx: Tx, bridge_id: str, remote_id: str) -> tuple[Any, ...] | None:
    """``(id, kind, title, remote_revision)`` of the stored conversation, or None."""
    return tx.one(BY_KEY, {"bridge_id": bridge_id, "remote_id": remote_id})


def read_ahead_by_key(tx: Tx, bridge_id: str, remote_id: str) -> None:
    """Announce a ``by_key`` read (``Tx.read_ahead``)."""
    tx.read_ahead(BY_KEY, {"bridge_id": bridge_id, "remote_id": remote_id})


def read_ahead_roster(tx: Tx, conversation_id: str) -> None:
    """Announce ``sync_roster``'s read of the stored roster (``Tx.read_ahead``); withdraw it
    (``drop_roster_ahead``) once this conversation's row is written before that read."""
    tx.read_ahead(ROSTER, {"conversation_id": conversation_id})


def drop_roster_ahead(tx: Tx, conversation_id: str) -> None:
    tx.drop_ahead(ROSTER, {"conversation_id": conversation_id})


def mint_or_bump(tx: Tx, *, id: str, bridge_id: str, remote_id: str, kind: str, at_ms: int, now: int) -> Rows:
    """Create the conversation with ``last_message_at_ms = at_ms``, or raise its recency to
    ``at_ms`` when strictly newer; the rows written (a write that may go behind)."""
    return tx.later(
        MINT_OR_BUMP,
        {"id": id, "bridge_id": bridge_id, "remote_id": remote_id, "kind": kind, "at": at_ms, "now": now},
    )


def bump_recency(tx: Tx, conversation_id: str, at_ms: int) -> bool:
    """Raise ``last_message_at_ms`` to ``at_ms`` only when strictly newer (same result as
    ``MAX``, but an equal or older time writes nothing). A missing conversation is a no-op."""
    return tx.rowcount(BUMP_RECENCY, {"id": conversation_id, "at": at_ms}) > 0


def touch(tx: Tx, conversation_id: str, now: int) -> Rows:
    """Advance ``updated_at_ms`` to ``now``; never moves it backwards (a write that may go
    behind)."""
    return tx.later(TOUCH, {"id": conversation_id, "now": now})


# -- roster ------------------------------------------------------------------------------
def _stored_roster(tx: Tx, conversation_id: str) -> dict[str, tuple[str, str, bool]] | None:
    """{identity_id: (role, display_name, is_active)}, or None when the conversation is missing."""
    rows = tx.all(ROSTER, {"conversation_id": conversation_id})
    if not rows:
        return None
    return {r[1]: (r[2], r[3], bool(r[4])) for r in rows if r[1] is not None}


def roster_matches(tx: Tx, conversation_id: str, rows: Iterable[RosterRow]) -> bool:
    """True when the conversation exists and its stored roster equals ``rows`` exactly.

    One read, no lock, no write: callable from a read transaction while another
    connection holds the write lock. Each stored identity may be matched at most once, so
    a roster that repeats an identity never matches.
    """
    stored = _stored_roster(tx, conversation_id)
    if stored is None:
        return False
    return _matches(stored, list(rows))


def _matches(stored: dict[str, tuple[str, str, bool]], rows: list[RosterRow]) -> bool:
    if len(rows) != len(stored):
        return False
    seen: set[str] = set()
    for row in rows:
        if row.identity_id in seen:
            return False
        seen.add(row.identity_id)
        if stored.get(row.identity_id) != (row.role, row.display_name, bool(row.is_active)):
            return False
    return True


def sync_roster(
    tx: Tx, *, conversation_id: str, bridge_id: str, rows: list[RosterRow], touched_at_ms: int = 0
) -> Rows:
    """Make the stored roster equal ``rows``, writing only the difference.

    Returns the roster rows written (inserted + updated + deleted; writes that may go
    behind); 0 means the roster was unchanged and nothing was written. When something was
    written and ``touched_at_ms > 0`` the conversation's ``updated_at_ms`` advances to it
    (never back). Each write of the difference writes exactly one row, since the roster it
    is the difference from was read in this transaction, so "something was written" is
    known before the writes run. Raises :class:`RosterError` for a repeated identity or a
    missing conversation, before writing anything.
    """
    stored = _stored_roster(tx, conversation_id)
    if stored is None:
        raise RosterError(f"conversation {conversation_id!r} does not exist")
    if _matches(stored, rows):
        return NO_ROWS
    wanted: dict[str, RosterRow] = {}
    for row in rows:
        if row.identity_id in wanted:
            raise RosterError(f"identity {row.identity_id!r} appears twice in the roster")
        wanted[row.identity_id] = row
    written = NO_ROWS
    base = {"conversation_id": conversation_id}
    for identity_id in stored:
        if identity_id not in wanted:
            written += tx.later(PARTICIPANT_DELETE, {**base, "identity_id": identity_id})
    for identity_id, row in wanted.items():
        have = stored.get(identity_id)
        values = (row.role, row.display_name, bool(row.is_active))
        if have == values:
            continue
        params = {
            **base,
            "identity_id": identity_id,
            "bridge_id": bridge_id,
            "role": row.role,
            "display_name": row.display_name,
            "is_active": bool(row.is_active),
        }
        written += tx.later(PARTICIPANT_INSERT if have is None else PARTICIPANT_UPDATE, params)
    if written is not NO_ROWS and touched_at_ms > 0:  # a write was issued (see above)
        touch(tx, conversation_id, touched_at_ms)
    return written


def ensure_participant(
    tx: Tx, *, conversation_id: str, identity_id: str, bridge_id: str, display_name: str
) -> bool:
    """Add ``identity_id`` to the roster as an active member unless it is there already."""
    params = _ensure_params(conversation_id, identity_id, bridge_id, display_name)
    return tx.rowcount(PARTICIPANT_ENSURE, params) > 0


def ensure_participant_ahead(
    tx: Tx, *, conversation_id: str, identity_id: str, bridge_id: str, display_name: str, now: int
) -> None:
    """Announce the next ``ensure_and_touch`` call with these arguments (``Tx.send_ahead``;
    PostgreSQL)."""
    tx.send_ahead(PARTICIPANT_ENSURE_TOUCH, {**_ensure_params(conversation_id, identity_id, bridge_id, display_name),
                                             "now": now})


def ensure_and_touch(
    tx: Tx, *, conversation_id: str, identity_id: str, bridge_id: str, display_name: str, now: int
) -> Rows:
    """``ensure_participant``, then, when it added the identity, ``touch`` at ``now``; the
    roster rows written (0 or 1). PostgreSQL: one statement (``PARTICIPANT_ENSURE_TOUCH``),
    a write that may go behind; SQLite, which has no writes in ``WITH``: the two calls."""
    params = _ensure_params(conversation_id, identity_id, bridge_id, display_name)
    if tx.dialect == "postgresql":
        return tx.later(PARTICIPANT_ENSURE_TOUCH, {**params, "now": now})
    added = tx.later(PARTICIPANT_ENSURE, params)
    if added:
        touch(tx, conversation_id, now)
    return added


def _ensure_params(conversation_id: str, identity_id: str, bridge_id: str, display_name: str) -> dict[str, str]:
    return {
        "conversation_id": conversation_id,
        "identity_id": identity_id,
        "bridge_id": bridge_id,
        "display_name": display_name,
    }


# -- reads -------------------------------------------------------------------------------
def bridge_owner(tx: Tx, bridge_id: str) -> tuple[bool, str | None]:
    """(the bridge exists, its owner's account id or None)."""
    row = tx.one(BRIDGE_OWNER, {"id": bridge_id})
    return (False, None) if row is None else (True, row[0])


def conversation_owner(tx: Tx, conversation_id: str) -> tuple[str, str | None] | None:
    """(bridge id, the bridge owner's account id or None) of a conversation, or None."""
    row = tx.one(CONVERSATION_OWNER, {"id": conversation_id})
    return None if row is None else (row[0], row[1])


def by_id(tx: Tx, conversation_id: str) -> dict[str, Any] | None:
    return tx.mapping(BY_ID, {"id": conversation_id})


def list_of_bridge(
    tx: Tx, bridge_id: str, *, limit: int = 100, before_ms: int | None = None, before_id: str = ""
) -> list[dict[str, Any]]:
    """Conversations of a bridge, most recent message first (then id), each with
    ``participants``.

    Keyset paging on ``(last_message_at_ms, id)``: ``before_ms`` alone keeps conversations
    whose last message is strictly older (``before_id`` ``""`` sorts below every id);
    with the last row's ``before_id`` too, the next page resumes right after that row, so
    conversations sharing a millisecond across a page boundary are neither skipped nor
    repeated.
    """
    params = {
        "bridge_id": bridge_id,
        "limit": limit,
        "before_ms": FAR_FUTURE_MS if before_ms is None else before_ms,
        "before_id": before_id,
    }
    rows = tx.mappings(LIST_OF_BRIDGE, params)
    if not rows:
        return rows
    by_conv: dict[str, list[dict[str, Any]]] = {r["id"]: [] for r in rows}
    for p in tx.mappings(PARTICIPANTS_OF_LISTED, params):
        bucket = by_conv.get(p["conversation_id"])
        if bucket is not None:
            bucket.append(_participant(p))
    for r in rows:
        r["participants"] = by_conv[r["id"]]
    return rows


def participants_of(tx: Tx, conversation_id: str) -> list[dict[str, Any]]:
    return [_participant(p) for p in tx.mappings(PARTICIPANTS_OF, {"conversation_id": conversation_id})]


def _participant(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "identity_id": p["identity_id"],
        "kind": p["kind"],
        "canonical": p["canonical"],
        "raw": p["raw"],
        "name": p["display_name"] or p["identity_name"],
        "is_self": bool(p["is_self"]),
        "role": p["role"],
        "is_active": bool(p["is_active"]),
    }
