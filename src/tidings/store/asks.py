"""Ask answers: rows only, no policy (the hub decides who may answer and what is valid).

One row per answered ask; the primary key ``(message_id, ask_id)`` is what makes an ask
answerable exactly once, even when two answers race on PostgreSQL. The same row is the
asking agent's owed answer: owed while ``acked_at_ms`` is NULL (only the agent's ack sets
it), and not yet dispatched while ``dispatched_at_ms`` is NULL (the delivery consumer sets
it once the answer was pushed to a live session or the agent was woken; the recovery scan
dispatches whatever a crash left NULL).
"""

from __future__ import annotations

import json
from typing import Any

from .engine import Tx
from .sql import PerDialect, Stmt

ANSWER_COLUMNS = (
    "message_id, ask_id, channel_id, asker_id, answered_by, answered_at_ms, answers, dispatched_at_ms, acked_at_ms"
)

_LOCK_MESSAGE_SQL = "SELECT id FROM messages WHERE id = :message_id"
LOCK_MESSAGE = PerDialect(
    name="asks_lock_message", sqlite=_LOCK_MESSAGE_SQL, postgresql=_LOCK_MESSAGE_SQL + " FOR UPDATE"
)
INSERT_ANSWER = Stmt(
    f"INSERT INTO ask_answers ({ANSWER_COLUMNS}) VALUES (:message_id, :ask_id, :channel_id, :asker_id, "
    ":answered_by, :now, :answers, :dispatched, :acked) ON CONFLICT (message_id, ask_id) DO NOTHING",
    name="insert_answer",
)
ANSWER = Stmt(
    f"SELECT {ANSWER_COLUMNS} FROM ask_answers WHERE message_id = :message_id AND ask_id = :ask_id",
    name="answer",
)
OWED_ANSWERS = Stmt(
    f"SELECT {ANSWER_COLUMNS} FROM ask_answers WHERE asker_id = :agent_id AND acked_at_ms IS NULL "
    "ORDER BY answered_at_ms, message_id, ask_id LIMIT :limit",
    name="owed_answers",
)
UNDISPATCHED = Stmt(
    f"SELECT {ANSWER_COLUMNS} FROM ask_answers WHERE dispatched_at_ms IS NULL "
    "ORDER BY answered_at_ms, message_id, ask_id LIMIT :limit",
    name="undispatched_answers",
)
MARK_DISPATCHED = Stmt(
    "UPDATE ask_answers SET dispatched_at_ms = :now "
    "WHERE message_id = :message_id AND ask_id = :ask_id AND dispatched_at_ms IS NULL",
    name="mark_answer_dispatched",
)
ACK_ANSWER = Stmt(
    "UPDATE ask_answers SET acked_at_ms = :now, dispatched_at_ms = COALESCE(dispatched_at_ms, :now) "
    "WHERE message_id = :message_id AND ask_id = :ask_id AND asker_id = :agent_id AND acked_at_ms IS NULL",
    name="ack_answer",
)


def _decode(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is not None and isinstance(row.get("answers"), str):
        row["answers"] = json.loads(row["answers"])
    return row


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    if isinstance(row.get("answers"), str):
        row["answers"] = json.loads(row["answers"])
    return row


def lock_message(tx: Tx, message_id: str) -> None:
    """Serialise answers to one message (its ``blocks`` are rewritten by each answer)."""
    tx.one(LOCK_MESSAGE, {"message_id": message_id})


def insert_answer(
    tx: Tx,
    *,
    message_id: str,
    ask_id: str,
    channel_id: str,
    asker_id: str,
    answered_by: str,
    answers: dict[str, str],
    now: int,
    owed: bool,
) -> bool:
    """Record the answer; False when the ask was already answered. An answer nobody is
    owed (the asker is not an agent) is stored already dispatched and acked."""
    return tx.rowcount(
        INSERT_ANSWER,
        {
            "message_id": message_id,
            "ask_id": ask_id,
            "channel_id": channel_id,
            "asker_id": asker_id,
            "answered_by": answered_by,
            "now": now,
            "answers": json.dumps(answers, separators=(",", ":"), ensure_ascii=False),
            "dispatched": None if owed else now,
            "acked": None if owed else now,
        },
    ) == 1


def answer(tx: Tx, message_id: str, ask_id: str) -> dict[str, Any] | None:
    return _decode(tx.mapping(ANSWER, {"message_id": message_id, "ask_id": ask_id}))


def owed_answers(tx: Tx, agent_id: str, limit: int) -> list[dict[str, Any]]:
    """The agent's unacked answers, oldest first."""
    return [_decoded(r) for r in tx.mappings(OWED_ANSWERS, {"agent_id": agent_id, "limit": limit})]


def undispatched(tx: Tx, limit: int) -> list[dict[str, Any]]:
    """Answers no consumer has dispatched yet, oldest first (the recovery scan's read)."""
    return [_decoded(r) for r in tx.mappings(UNDISPATCHED, {"limit": limit})]


def mark_dispatched(tx: Tx, message_id: str, ask_id: str, now: int) -> bool:
    return tx.rowcount(MARK_DISPATCHED, {"message_id": message_id, "ask_id": ask_id, "now": now}) == 1


def ack_answer(tx: Tx, agent_id: str, message_id: str, ask_id: str, now: int) -> bool:
    """Clear the agent's owed answer; False when there was none open (idempotent)."""
    return tx.rowcount(ACK_ANSWER, {"agent_id": agent_id, "message_id": message_id, "ask_id": ask_id, "now": now}) == 1


SET_MESSAGE_BLOCKS = Stmt("UPDATE messages SET blocks = :blocks WHERE id = :id", name="asks_set_blocks")


def set_message_blocks(tx: Tx, message_id: str, blocks: list[dict[str, Any]]) -> None:
    """Rewrite a message's blocks for an answered ask (not an edit: ``edited_at_ms`` and
    ``text`` stay as they are)."""
    tx.execute(SET_MESSAGE_BLOCKS, {"id": message_id, "blocks": json.dumps(blocks, separators=(",", ":"), ensure_ascii=False)})
