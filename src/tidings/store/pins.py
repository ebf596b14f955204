"""Channel pins: rows only, no policy (the hub checks who may pin and the limit of 5).

A pin points at a message of its own channel. ``position`` orders a channel's pins and is
unique within the channel; a new pin takes the next position after the current last one.
``lock_channel`` serialises pin changes of one channel (a row lock on PostgreSQL; SQLite
has one writer), so the count checked before an insert is still true at commit.
"""

from __future__ import annotations

from typing import Any

from .engine import Tx
from .messages import MESSAGE_COLUMNS, row_to_message
from .sql import PerDialect, Stmt
from .sweep import sweep_set_sql

_LOCK_SQL = "SELECT id FROM channels WHERE id = :channel_id"
LOCK_CHANNEL = PerDialect(name="pins_lock_channel", sqlite=_LOCK_SQL, postgresql=_LOCK_SQL + " FOR UPDATE")
PIN = Stmt(
    "SELECT position FROM channel_pins WHERE channel_id = :channel_id AND message_id = :message_id",
    name="pin",
)
NEXT_POSITION = Stmt(
    "SELECT COALESCE(MAX(position), 0) + 1, COUNT(*) FROM channel_pins WHERE channel_id = :channel_id",
    name="pins_next_position",
)
INSERT_PIN = Stmt(
    "INSERT INTO channel_pins (channel_id, message_id, position, pinned_at_ms, pinned_by) "
    "VALUES (:channel_id, :message_id, :position, :now, :by)",
    name="insert_pin",
)
DELETE_PIN = Stmt(
    "DELETE FROM channel_pins WHERE channel_id = :channel_id AND message_id = :message_id",
    name="delete_pin",
)
PINNED_MESSAGES = Stmt(
    f"SELECT {MESSAGE_COLUMNS}, p.position AS pin_position, p.pinned_at_ms AS pin_at_ms, "
    "p.pinned_by AS pin_by FROM channel_pins p "
    "JOIN messages m ON m.id = p.message_id WHERE p.channel_id = :channel_id ORDER BY p.position",
    name="pinned_messages",
)

# The pins a session start owes an agent: those of its sweep-set channels (the one sweep-set
# predicate, ``store.delivery.sweep_set_sql``), channel by channel, each in position order.
SWEEP_PINS = Stmt(
    "SELECT p.channel_id, p.message_id FROM channel_pins p "
    "JOIN channel_members cm ON cm.channel_id = p.channel_id "
    "JOIN accounts a ON a.id = cm.account_id JOIN channels c ON c.id = cm.channel_id "
    f"WHERE cm.account_id = :agent_id AND a.kind = 'agent' AND {sweep_set_sql()} "
    "ORDER BY p.channel_id, p.position",
    name="sweep_pins",
)


def sweep_pins(tx: Tx, agent_id: str) -> list[tuple[str, str]]:
    """(channel id, message id) of every pin of the agent's sweep-set channels, in order."""
    return [(r[0], r[1]) for r in tx.all(SWEEP_PINS, {"agent_id": agent_id})]


def lock_channel(tx: Tx, channel_id: str) -> bool:
    """Take the channel's row lock for a pin change; False when there is no such channel."""
    return tx.one(LOCK_CHANNEL, {"channel_id": channel_id}) is not None


def is_pinned(tx: Tx, channel_id: str, message_id: str) -> bool:
    return tx.one(PIN, {"channel_id": channel_id, "message_id": message_id}) is not None


def add_pin(tx: Tx, channel_id: str, message_id: str, by: str, now: int) -> tuple[int, int]:
    """Insert a pin at the next position; returns (its position, pins before it)."""
    position, count = _next_position(tx, channel_id)
    tx.execute(INSERT_PIN, {"channel_id": channel_id, "message_id": message_id, "position": int(position),
                            "now": now, "by": by})
    return int(position), int(count)


def count_pins(tx: Tx, channel_id: str) -> int:
    return int(_next_position(tx, channel_id)[1])


def _next_position(tx: Tx, channel_id: str) -> tuple[Any, ...]:
    """``(next position, pin count)``: an aggregate, so always one row."""
    row = tx.one(NEXT_POSITION, {"channel_id": channel_id})
    assert row is not None
    return row


def remove_pin(tx: Tx, channel_id: str, message_id: str) -> bool:
    return tx.rowcount(DELETE_PIN, {"channel_id": channel_id, "message_id": message_id}) == 1


def pinned_messages(tx: Tx, channel_id: str) -> list[dict[str, Any]]:
    """The pinned message rows of a channel in position order (``pin_position`` added)."""
    return [row_to_message(r) for r in tx.mappings(PINNED_MESSAGES, {"channel_id": channel_id})]
