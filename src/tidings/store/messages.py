"""Hub messages: insert (idempotent per author and client_request_id), read, edit.

``seq`` is the global insert order; ``channel_seq`` is gap-free and commit-ordered within a
channel and is what every cursor and every ``after_seq`` read walks. A reader that pages a
channel by ``channel_seq`` can never skip a message that commits late, which a reader of a
PostgreSQL sequence can.
"""

from __future__ import annotations

import json
from typing import Any, cast

from . import search_index
from .engine import Tx
from .sql import Stmt

MESSAGE_COLUMNS = (
    "m.id, m.seq, m.channel_id, m.channel_seq, m.topic_id, m.author_account_id, m.at_unix_ms, "
    "m.blocks, m.text, m.client_request_id, m.edited_at_ms, m.deleted_at_ms, m.mentions_routed_at, "
    "m.occurred_at_ms"
)

INSERT_MESSAGE = Stmt(
    "INSERT INTO messages (id, channel_id, channel_seq, topic_id, author_account_id, at_unix_ms, "
    "blocks, text, client_request_id, occurred_at_ms) VALUES (:id, :channel_id, :channel_seq, :topic_id, "
    ":author, :now, :blocks, :text, :client_request_id, :occurred_at_ms) "
    "ON CONFLICT (author_account_id, client_request_id) WHERE client_request_id <> '' DO NOTHING "
    "RETURNING seq",
    name="insert_message",
)
BY_CLIENT_REQUEST = Stmt(
    f"SELECT {MESSAGE_COLUMNS} FROM messages m "
    "WHERE m.author_account_id = :author AND m.client_request_id = :client_request_id",
    name="by_client_request",
)
BY_ID = Stmt(f"SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.id = :id", name="by_id")
IN_CHANNEL_AFTER = Stmt(
    f"SELECT {MESSAGE_COLUMNS} FROM messages m "
    "WHERE m.channel_id = :channel_id AND m.channel_seq > :after_seq "
    "ORDER BY m.channel_seq LIMIT :limit",
    name="in_channel_after",
)
IN_CHANNEL_LATEST = Stmt(
    f"SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.channel_id = :channel_id "
    "ORDER BY m.channel_seq DESC LIMIT :limit",
    name="in_channel_latest",
)
SET_BLOCKS = Stmt(
    "UPDATE messages SET blocks = :blocks, text = :text, edited_at_ms = :now WHERE id = :id",
    name="set_blocks",
)
MARK_DELETED = Stmt(
    "UPDATE messages SET deleted_at_ms = :now WHERE id = :id AND deleted_at_ms IS NULL",
    name="mark_deleted",
)


def row_to_message(row: dict[str, Any]) -> dict[str, Any]:
    """Decode the JSON blocks of a message row in place and return it."""
    if isinstance(row.get("blocks"), str):
        row["blocks"] = json.loads(row["blocks"])
    return row


def insert_message(
    tx: Tx,
    *,
    id: str,
    channel_id: str,
    channel_seq: int,
    topic_id: str,
    author: str,
    now: int,
    blocks: list[dict[str, Any]],
    text: str,
    client_request_id: str,
    occurred_at_ms: int | None = None,
) -> int | None:
    """Insert a message; the global ``seq``, or None when the client request id was used.
    ``occurred_at_ms``: the network time of a message posted from a network, else None."""
    search_index.queued(tx)
    return cast("int | None", tx.scalar(
        INSERT_MESSAGE,
        {
            "id": id,
            "channel_id": channel_id,
            "channel_seq": channel_seq,
            "topic_id": topic_id,
            "author": author,
            "now": now,
            "blocks": json.dumps(blocks, separators=(",", ":"), ensure_ascii=False),
            "text": text,
            "client_request_id": client_request_id,
            "occurred_at_ms": occurred_at_ms,
        },
    ))


def by_client_request(tx: Tx, author: str, client_request_id: str) -> dict[str, Any] | None:
    row = tx.mapping(BY_CLIENT_REQUEST, {"author": author, "client_request_id": client_request_id})
    return None if row is None else row_to_message(row)


def message(tx: Tx, message_id: str) -> dict[str, Any] | None:
    row = tx.mapping(BY_ID, {"id": message_id})
    return None if row is None else row_to_message(row)


def messages_after(tx: Tx, channel_id: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
    rows = tx.mappings(IN_CHANNEL_AFTER, {"channel_id": channel_id, "after_seq": after_seq, "limit": limit})
    return [row_to_message(r) for r in rows]


def latest_messages(tx: Tx, channel_id: str, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` messages of a channel, returned oldest first."""
    rows = tx.mappings(IN_CHANNEL_LATEST, {"channel_id": channel_id, "limit": limit})
    return [row_to_message(r) for r in reversed(rows)]


def set_blocks(tx: Tx, message_id: str, blocks: list[dict[str, Any]], text: str, now: int) -> None:
    search_index.queued(tx)
    tx.execute(
        SET_BLOCKS,
        {"id": message_id, "blocks": json.dumps(blocks, separators=(",", ":"), ensure_ascii=False), "text": text, "now": now},
    )


def mark_deleted(tx: Tx, message_id: str, now: int) -> bool:
    return tx.rowcount(MARK_DELETED, {"id": message_id, "now": now}) == 1
