"""Reactions on bridge messages: one row per (message, reactor), removals as tombstones.

Two modes:

* **delta** (Signal, WhatsApp) — ``apply_delta``: last writer wins by occurrence time. A
  strictly newer event always writes; an equal time writes only when the content differs
  (state, the emoji of an active reaction, the reactor's identity or self flag); an older
  one never. A removal that arrives before any add inserts a tombstone, which fences the
  stale add that may follow.
* **snapshot** (Google) — ``apply_snapshot``: the frame carries the complete set of a
  message's reactions. A per-message fence holds the receipt time (``source_seq_ms``) of
  the newest snapshot applied. A strictly older snapshot is rejected whole; an equal or
  newer one writes only the reactions that changed, tombstones every absent reactor, and
  advances the fence, **even when the snapshot is empty** (the fence is what keeps a
  retried older snapshot from bringing a reaction back). A fence write at the fence's own
  sequence is skipped.
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

from .engine import NO_ROWS, Rows, Tx
from .sql import Stmt

SELF_REACTOR = "self"

# Delta mode: last writer wins by occurrence time (see the module docstring).
APPLY_DELTA = Stmt(
    "INSERT INTO reactions (message_id, reactor_key, bridge_id, conversation_id, reactor_identity_id, "
    "reactor_is_self, emoji, state, occurred_at_ms, source_seq_ms, created_at_ms, updated_at_ms) VALUES "
    "(:message_id, :reactor_key, :bridge_id, :conversation_id, :identity_id, :is_self, :emoji, :state, "
    ":occurred, :seq, :now, :now) "
    "ON CONFLICT (message_id, reactor_key) DO UPDATE SET reactor_identity_id = excluded.reactor_identity_id, "
    "reactor_is_self = excluded.reactor_is_self, "
    "emoji = CASE WHEN excluded.state = 'removed' THEN reactions.emoji ELSE excluded.emoji END, "
    "state = excluded.state, occurred_at_ms = excluded.occurred_at_ms, "
    "source_seq_ms = excluded.source_seq_ms, updated_at_ms = excluded.updated_at_ms "
    "WHERE excluded.occurred_at_ms > reactions.occurred_at_ms "
    "OR (excluded.occurred_at_ms = reactions.occurred_at_ms AND ("
    "reactions.state IS DISTINCT FROM excluded.state "
    "OR (excluded.state = 'active' AND reactions.emoji IS DISTINCT FROM excluded.emoji) "
    "OR reactions.reactor_identity_id IS DISTINCT FROM excluded.reactor_identity_id "
    "OR reactions.reactor_is_self IS DISTINCT FROM excluded.reactor_is_self))",
    name="reactions.apply_delta",
)

# Snapshot mode.
FENCE = Stmt("SELECT source_seq_ms FROM reaction_fences WHERE message_id = :message_id", name="fences.get")
OF_MESSAGE = Stmt(
    "SELECT reactor_key, reactor_identity_id, reactor_is_self, emoji, state FROM reactions "
    "WHERE message_id = :message_id",
    name="reactions.of_message",
)
# The guard of a snapshot entry: its content differs from the stored row.
SNAPSHOT_GUARD = (
    "reactions.state IS DISTINCT FROM excluded.state"
    " OR reactions.emoji IS DISTINCT FROM excluded.emoji"
    " OR reactions.reactor_identity_id IS DISTINCT FROM excluded.reactor_identity_id"
    " OR reactions.reactor_is_self IS DISTINCT FROM excluded.reactor_is_self"
)
UPSERT_ACTIVE = Stmt(
    "INSERT INTO reactions (message_id, reactor_key, bridge_id, conversation_id, reactor_identity_id, "
    "reactor_is_self, emoji, state, occurred_at_ms, source_seq_ms, created_at_ms, updated_at_ms) VALUES "
    "(:message_id, :reactor_key, :bridge_id, :conversation_id, :identity_id, :is_self, :emoji, 'active', "
    ":occurred, :seq, :now, :now) "
    "ON CONFLICT (message_id, reactor_key) DO UPDATE SET reactor_identity_id = excluded.reactor_identity_id, "
    "reactor_is_self = excluded.reactor_is_self, emoji = excluded.emoji, state = excluded.state, "
    "occurred_at_ms = excluded.occurred_at_ms, source_seq_ms = excluded.source_seq_ms, "
    f"updated_at_ms = excluded.updated_at_ms WHERE {SNAPSHOT_GUARD}",
    name="reactions.upsert_active",
)
TOMBSTONE = Stmt(
    "UPDATE reactions SET state = 'removed', occurred_at_ms = :now, source_seq_ms = :seq, updated_at_ms = :now "
    "WHERE message_id = :message_id AND reactor_key = :reactor_key AND state = 'active'",
    name="reactions.tombstone",
)
FENCE_ADVANCE = Stmt(
    "INSERT INTO reaction_fences (message_id, bridge_id, source_seq_ms, updated_at_ms) "
    "VALUES (:message_id, :bridge_id, :seq, :now) "
    "ON CONFLICT (message_id) DO UPDATE SET source_seq_ms = excluded.source_seq_ms, "
    "updated_at_ms = excluded.updated_at_ms WHERE excluded.source_seq_ms > reaction_fences.source_seq_ms",
    name="fences.advance",
)

# Reads.
ACTIVE_OF_LISTED = Stmt(
    "SELECT r.message_id, r.emoji, r.reactor_key, r.reactor_identity_id, r.reactor_is_self, i.raw, "
    "i.display_name FROM reactions r LEFT JOIN identities i ON i.id = r.reactor_identity_id "
    "WHERE r.state = 'active' AND r.message_id IN ("
    "SELECT id FROM bridge_messages WHERE conversation_id = :conversation_id "
    "AND (occurred_at_ms, id) < (:before_ms, :before_id) "
    "ORDER BY occurred_at_ms DESC, id DESC LIMIT :limit) "
    "ORDER BY r.message_id, r.occurred_at_ms, r.reactor_key",
    name="reactions.active_of_listed",
)
ACTIVE_OF_MESSAGE = Stmt(
    "SELECT r.message_id, r.emoji, r.reactor_key, r.reactor_identity_id, r.reactor_is_self, i.raw, "
    "i.display_name FROM reactions r LEFT JOIN identities i ON i.id = r.reactor_identity_id "
    "WHERE r.state = 'active' AND r.message_id = :message_id ORDER BY r.occurred_at_ms, r.reactor_key",
    name="reactions.active_of_message",
)


class SnapshotEntry(NamedTuple):
    """One reactor's reaction in a snapshot."""

    identity_id: str | None
    is_self: bool
    emoji: str
    occurred_at_ms: int


class SnapshotResult(NamedTuple):
    accepted: bool  # False: strictly older than the fence, rejected whole (nothing written)
    applied: Rows  # reaction rows written as active (writes that may go behind, ``Tx.later``)
    removed: Rows  # reaction rows tombstoned
    fence_written: Rows


def apply_delta(
    tx: Tx,
    *,
    message_id: str,
    reactor_key: str,
    bridge_id: str,
    conversation_id: str,
    identity_id: str | None,
    is_self: bool,
    emoji: str,
    removed: bool,
    occurred_at_ms: int,
    source_seq_ms: int,
    now: int,
) -> Rows:
    """Apply one add/switch (``removed=False``) or remove; the rows written (a write that
    may go behind).

    A remove inserts ``emoji=''`` when there is no row yet, and keeps the stored emoji
    otherwise. The message must exist (the caller checks; the foreign key enforces it).
    """
    return tx.later(
            APPLY_DELTA,
            {
                "message_id": message_id,
                "reactor_key": reactor_key,
                "bridge_id": bridge_id,
                "conversation_id": conversation_id,
                "identity_id": identity_id,
                "is_self": is_self,
                "emoji": "" if removed else emoji,
                "state": "removed" if removed else "active",
                "occurred": occurred_at_ms,
                "seq": source_seq_ms,
                "now": now,
            },
    )


def fence(tx: Tx, message_id: str) -> int | None:
    return cast("int | None", tx.scalar(FENCE, {"message_id": message_id}))


def apply_snapshot(
    tx: Tx,
    *,
    message_id: str,
    bridge_id: str,
    conversation_id: str,
    entries: dict[str, SnapshotEntry],
    source_seq_ms: int,
    now: int,
    new_message: bool = False,
) -> SnapshotResult:
    """Make the message's active reactions equal ``entries`` ({reactor_key: entry}).

    ``new_message=True`` says the message row was inserted in this transaction, so it
    has neither a fence nor reactions yet, and the two reads are skipped.
    """
    if new_message:
        current_fence = None
        current: dict[str, tuple[Any, ...]] = {}
    else:
        # The reactions' read rides with the fence's (PostgreSQL); nothing is written
        # between the two. A stale snapshot withdraws it: a later frame of the same
        # transaction may write this message's reactions before reading them again.
        tx.read_ahead(OF_MESSAGE, {"message_id": message_id})
        current_fence = tx.scalar(FENCE, {"message_id": message_id})
        if current_fence is not None and source_seq_ms < current_fence:
            tx.drop_ahead(OF_MESSAGE, {"message_id": message_id})
            return SnapshotResult(False, NO_ROWS, NO_ROWS, NO_ROWS)
        current = {r[0]: r for r in tx.all(OF_MESSAGE, {"message_id": message_id})}
    applied = removed = NO_ROWS
    for reactor_key, entry in entries.items():
        have = current.get(reactor_key)
        if (
            have is not None
            and have[4] == "active"
            and have[3] == entry.emoji
            and have[1] == entry.identity_id
            and bool(have[2]) == entry.is_self
        ):
            continue
        applied += tx.later(
            UPSERT_ACTIVE,
            {
                "message_id": message_id,
                "reactor_key": reactor_key,
                "bridge_id": bridge_id,
                "conversation_id": conversation_id,
                "identity_id": entry.identity_id,
                "is_self": entry.is_self,
                "emoji": entry.emoji,
                "occurred": entry.occurred_at_ms,
                "seq": source_seq_ms,
                "now": now,
            },
        )
    for reactor_key, have in current.items():
        if have[4] == "active" and reactor_key not in entries:
            removed += tx.later(
                TOMBSTONE, {"message_id": message_id, "reactor_key": reactor_key, "seq": source_seq_ms, "now": now}
            )
    fence_written = NO_ROWS
    if current_fence is None or source_seq_ms > current_fence:
        fence_written = advance_fence(tx, message_id, bridge_id, source_seq_ms, now)
    return SnapshotResult(True, applied, removed, fence_written)


def read_ahead_snapshot(tx: Tx, message_id: str) -> None:
    """Announce ``apply_snapshot``'s two reads of ``message_id`` (``Tx.read_ahead``)."""
    params = {"message_id": message_id}
    tx.read_ahead(FENCE, params)
    tx.read_ahead(OF_MESSAGE, params)


def advance_fence(tx: Tx, message_id: str, bridge_id: str, source_seq_ms: int, now: int) -> Rows:
    """Create the fence, or move it to ``source_seq_ms`` when strictly newer; the rows
    written (a write that may go behind)."""
    return tx.later(FENCE_ADVANCE, {"message_id": message_id, "bridge_id": bridge_id, "seq": source_seq_ms, "now": now})


# -- reads -------------------------------------------------------------------------------
def active_of_listed(
    tx: Tx, conversation_id: str, *, limit: int, before_ms: int, before_id: str = ""
) -> dict[str, list[dict[str, Any]]]:
    """Active reactions of the messages ``bridge_messages.of_conversation`` lists with the
    same arguments, grouped by message id."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in tx.all(
        ACTIVE_OF_LISTED,
        {"conversation_id": conversation_id, "limit": limit, "before_ms": before_ms, "before_id": before_id},
    ):
        out.setdefault(row[0], []).append(_reaction(row))
    return out


def active_of_message(tx: Tx, message_id: str) -> list[dict[str, Any]]:
    return [_reaction(r) for r in tx.all(ACTIVE_OF_MESSAGE, {"message_id": message_id})]


def _reaction(row: tuple[Any, ...]) -> dict[str, Any]:
    _, emoji, reactor_key, identity_id, is_self, raw, name = row
    return {
        "emoji": emoji,
        "reactor_key": reactor_key,
        "reactor_identity_id": identity_id,
        "reactor_is_self": bool(is_self),
        "reactor_raw": raw if raw is not None else (reactor_key if identity_id is None else ""),
        "reactor_name": name or "",
    }
