"""Bridge links: rows only. A link says "post this conversation's new messages there"."""

from __future__ import annotations

from typing import Any, cast

from .engine import Tx
from .sql import Stmt

INSERT_LINK = Stmt(
    "INSERT INTO bridge_links (conversation_id, channel_id, bridge_id, created_by, created_at_ms) "
    "VALUES (:conversation_id, :channel_id, :bridge_id, :created_by, :now) "
    "ON CONFLICT (conversation_id, channel_id) DO NOTHING",
    name="insert_link",
)
CHANNELS_OF_CONVERSATION = Stmt(
    "SELECT l.channel_id, b.account_id FROM bridge_links l JOIN bridges b ON b.id = l.bridge_id "
    "WHERE l.conversation_id = :conversation_id ORDER BY l.channel_id",
    name="channels_of_conversation",
)
LINKS_OF_BRIDGE = Stmt(
    "SELECT conversation_id, channel_id, created_by, created_at_ms FROM bridge_links "
    "WHERE bridge_id = :bridge_id ORDER BY created_at_ms, conversation_id, channel_id",
    name="links_of_bridge",
)
CONVERSATION_OF_BRIDGE = Stmt(
    "SELECT id, title FROM conversations WHERE id = :id AND bridge_id = :bridge_id",
    name="conversation_of_bridge",
)
SENDER_LABEL = Stmt("SELECT display_name, raw FROM identities WHERE id = :id", name="sender_label")


def insert_link(tx: Tx, *, conversation_id: str, channel_id: str, bridge_id: str, created_by: str | None, now: int) -> bool:
    return (
        tx.rowcount(
            INSERT_LINK,
            {"conversation_id": conversation_id, "channel_id": channel_id, "bridge_id": bridge_id,
             "created_by": created_by, "now": now},
        )
        == 1
    )


def linked_channels(tx: Tx, conversation_id: str) -> list[tuple[str, str]]:
    """(channel_id, bridge account id) for every channel this conversation is linked to."""
    return tx.all(CHANNELS_OF_CONVERSATION, {"conversation_id": conversation_id})


def read_ahead_linked_channels(tx: Tx, conversation_id: str) -> None:
    """Announce ``linked_channels(tx, conversation_id)`` (``Tx.read_ahead``; PostgreSQL)."""
    tx.read_ahead(CHANNELS_OF_CONVERSATION, {"conversation_id": conversation_id})


def links_of_bridge(tx: Tx, bridge_id: str) -> list[dict[str, Any]]:
    return tx.mappings(LINKS_OF_BRIDGE, {"bridge_id": bridge_id})


def conversation_of_bridge(tx: Tx, conversation_id: str, bridge_id: str) -> tuple[Any, ...] | None:
    return tx.one(CONVERSATION_OF_BRIDGE, {"id": conversation_id, "bridge_id": bridge_id})


def sender_label(tx: Tx, identity_id: str | None) -> str:
    """How a linked message names its sender: the display name, else the raw address."""
    if identity_id is None:
        return "unknown"
    row = tx.one(SENDER_LABEL, {"id": identity_id})
    if row is None:
        return "unknown"
    return cast(str, row[0] or row[1])
