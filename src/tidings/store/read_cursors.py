"""Read cursors: how far our own side has read each bridge conversation.

Moved only by our own read receipts (the projection decides that), and only forwards: the
cursor names the newest message read, ordered by (occurrence time, id). A receipt for an
older or the same message writes nothing.
"""

from __future__ import annotations

from typing import Any

from .engine import Rows, Tx
from .sql import Stmt

ADVANCE = Stmt(
    "INSERT INTO read_cursors (conversation_id, bridge_id, last_read_message_id, last_read_message_at_ms, "
    "last_read_at_ms, updated_at_ms) VALUES (:conversation_id, :bridge_id, :message_id, :message_at, "
    ":read_at, :now) "
    "ON CONFLICT (conversation_id) DO UPDATE SET last_read_message_id = excluded.last_read_message_id, "
    "last_read_message_at_ms = excluded.last_read_message_at_ms, last_read_at_ms = excluded.last_read_at_ms, "
    "updated_at_ms = excluded.updated_at_ms "
    "WHERE excluded.last_read_message_at_ms > read_cursors.last_read_message_at_ms "
    "OR (excluded.last_read_message_at_ms = read_cursors.last_read_message_at_ms "
    "AND excluded.last_read_message_id > read_cursors.last_read_message_id)",
    name="read_cursors.advance",
)
GET = Stmt(
    "SELECT conversation_id, bridge_id, last_read_message_id, last_read_message_at_ms, last_read_at_ms, "
    "updated_at_ms FROM read_cursors WHERE conversation_id = :conversation_id",
    name="read_cursors.get",
)


def advance(
    tx: Tx,
    *,
    conversation_id: str,
    bridge_id: str,
    message_id: str,
    message_at_ms: int,
    read_at_ms: int,
    now: int,
) -> Rows:
    """Move the cursor to ``message_id`` when it is newer than the stored one; the rows
    written (a write that may go behind, ``Tx.later``)."""
    return tx.later(
            ADVANCE,
            {
                "conversation_id": conversation_id,
                "bridge_id": bridge_id,
                "message_id": message_id,
                "message_at": message_at_ms,
                "read_at": read_at_ms,
                "now": now,
            },
    )


def get(tx: Tx, conversation_id: str) -> dict[str, Any] | None:
    return tx.mapping(GET, {"conversation_id": conversation_id})
