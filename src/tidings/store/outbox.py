"""The bridge outbox: rows only. One row is one action the hub owes a network.

An item is written in the transaction of the hub change that causes it, so it exists
exactly when that change does. It is ``pending`` (with ``attempts`` and ``not_before_ms``)
until its bridge reports it ``sent`` (with the network's message id) or ``failed`` (with
a cause); both end states are final and a repeated report of the same outcome changes
nothing. Items are read in ``seq`` (commit-insert) order per bridge. An item with
``await_settle`` is not handed out before its hub message's delivery pass ran
(``messages.mentions_routed_at``): that is how an agent's held mid-turn post waits for its
turn to settle.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from .batch_rows import Read, Write
from .engine import Tx
from .sql import PerDialect, Stmt


class OutboxState(StrEnum):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


class OutboxKind(StrEnum):
    SEND = "send"
    REPLY = "reply"
    REACT = "react"
    EDIT = "edit"
    DELETE = "delete"


ITEM_COLUMNS = (
    "o.seq, o.id, o.bridge_id, o.conversation_id, o.channel_id, o.message_id, o.kind, o.body, "
    "o.target_remote_id, o.emoji, o.await_settle, o.state, o.attempts, o.not_before_ms, o.remote_id, "
    "o.cause, o.echo_message_id, o.created_at_ms, o.updated_at_ms, "
    "c.remote_conversation_id, c.kind AS conversation_kind"
)

LINK_TARGETS = Stmt(
    "SELECT l.bridge_id, l.conversation_id, b.account_id FROM bridge_links l "
    "JOIN bridges b ON b.id = l.bridge_id WHERE l.channel_id = :channel_id "
    "ORDER BY l.bridge_id, l.conversation_id",
    name="outbox.link_targets",
)
INSERT_ITEM = Stmt(
    "INSERT INTO outbox (id, bridge_id, conversation_id, channel_id, message_id, kind, body, "
    "target_remote_id, emoji, await_settle, state, attempts, not_before_ms, created_at_ms, updated_at_ms) "
    "VALUES (:id, :bridge_id, :conversation_id, :channel_id, :message_id, :kind, :body, "
    ":target_remote_id, :emoji, :await_settle, 'pending', 0, 0, :now, :now)"
)
PENDING = Stmt(
    f"SELECT {ITEM_COLUMNS} FROM outbox o JOIN conversations c ON c.id = o.conversation_id "
    "LEFT JOIN messages m ON m.id = o.message_id "
    "WHERE o.bridge_id = :bridge_id AND o.state = 'pending' AND o.seq > :after_seq "
    "AND o.not_before_ms <= :now AND (o.await_settle = :false OR m.mentions_routed_at IS NOT NULL) "
    "ORDER BY o.seq LIMIT :limit"
)
BY_ID = Stmt(
    f"SELECT {ITEM_COLUMNS} FROM outbox o JOIN conversations c ON c.id = o.conversation_id WHERE o.id = :id"
)
_OF_MESSAGES = f"SELECT {ITEM_COLUMNS} FROM outbox o JOIN conversations c ON c.id = o.conversation_id WHERE "
OF_MESSAGES = PerDialect(
    name="outbox_of_messages",
    sqlite=_OF_MESSAGES + "o.message_id IN (SELECT value FROM json_each(:ids)) ORDER BY o.seq",
    postgresql=_OF_MESSAGES + "o.message_id = ANY(CAST(:ids AS text[])) ORDER BY o.seq",
)
SENT_ITEMS_OF_MESSAGE = Stmt(
    f"SELECT {ITEM_COLUMNS} FROM outbox o JOIN conversations c ON c.id = o.conversation_id "
    "WHERE o.message_id = :message_id AND o.kind IN ('send', 'reply') ORDER BY o.seq"
)
MARK_SENT = Stmt(
    "UPDATE outbox SET state = 'sent', remote_id = :remote_id, attempts = attempts + 1, updated_at_ms = :now "
    "WHERE id = :id AND state = 'pending'"
)
MARK_FAILED = Stmt(
    "UPDATE outbox SET state = 'failed', cause = :cause, attempts = attempts + 1, updated_at_ms = :now "
    "WHERE id = :id AND state = 'pending'"
)
RETRY_LATER = Stmt(
    "UPDATE outbox SET attempts = attempts + 1, not_before_ms = :not_before, cause = :cause, updated_at_ms = :now "
    "WHERE id = :id AND state = 'pending'"
)
SET_BODY = Stmt("UPDATE outbox SET body = :body, updated_at_ms = :now WHERE id = :id AND state = 'pending'")
SET_ECHO = Stmt(
    "UPDATE outbox SET echo_message_id = :echo, updated_at_ms = :now WHERE id = :id AND echo_message_id IS NULL"
)
# The echo candidates of several (conversation, remote id) pairs at once (a batch of frames,
# ``bridges/echo.py``), and their echo links written in one statement.
ECHO_CANDIDATES_OF = Read(
    "outbox.echo_candidates_of", "outbox", "conversation_id, remote_id, id, echo_message_id, seq",
    "conversation_id, remote_id", "bridge_id = :bridge_id AND remote_id IS NOT NULL AND kind IN ('send', 'reply')",
    order="seq",
)
SET_ECHOES = Write(
    "outbox.set_echoes",
    "UPDATE outbox SET echo_message_id = r.echo_message_id, updated_at_ms = r.updated_at_ms FROM {rows} "
    "WHERE outbox.id = r.id AND outbox.echo_message_id IS NULL",
    "id text, echo_message_id text, updated_at_ms bigint",
)
TYPING = Stmt(
    "SELECT DISTINCT l.conversation_id, c.remote_conversation_id FROM agent_sessions s "
    "JOIN channel_members cm ON cm.account_id = s.agent_id "
    "JOIN bridge_links l ON l.channel_id = cm.channel_id "
    "JOIN conversations c ON c.id = l.conversation_id "
    "WHERE l.bridge_id = :bridge_id AND s.ended_at_ms IS NULL AND s.last_state = 'working' "
    "ORDER BY l.conversation_id"
)
COUNTS = Stmt("SELECT state, count(*) FROM outbox WHERE bridge_id = :bridge_id GROUP BY state")


def _item(row: dict[str, Any]) -> dict[str, Any]:
    row["await_settle"] = bool(row["await_settle"])
    return row


def link_targets(tx: Tx, channel_id: str) -> list[tuple[str, str, str]]:
    """(bridge_id, conversation_id, bridge account id) of every conversation linked to the channel."""
    return tx.all(LINK_TARGETS, {"channel_id": channel_id})


def insert_item(
    tx: Tx, *, id: str, bridge_id: str, conversation_id: str, channel_id: str, message_id: str,
    kind: OutboxKind, body: str, now: int, target_remote_id: str | None = None, emoji: str = "",
    await_settle: bool = False,
) -> None:
    tx.execute(INSERT_ITEM, {
        "id": id, "bridge_id": bridge_id, "conversation_id": conversation_id, "channel_id": channel_id,
        "message_id": message_id, "kind": str(kind), "body": body, "target_remote_id": target_remote_id,
        "emoji": emoji, "await_settle": bool(await_settle), "now": now,
    })


def pending(tx: Tx, bridge_id: str, *, after_seq: int, now: int, limit: int) -> list[dict[str, Any]]:
    rows = tx.mappings(PENDING, {"bridge_id": bridge_id, "after_seq": after_seq, "now": now, "limit": limit,
                                 "false": False})
    return [_item(r) for r in rows]


def item(tx: Tx, item_id: str) -> dict[str, Any] | None:
    row = tx.mapping(BY_ID, {"id": item_id})
    return None if row is None else _item(row)


def of_messages(tx: Tx, message_ids: list[str]) -> list[dict[str, Any]]:
    if not message_ids:
        return []
    ids = json.dumps(list(message_ids)) if tx.dialect == "sqlite" else list(message_ids)
    return [_item(r) for r in tx.mappings(OF_MESSAGES, {"ids": ids})]


def sends_of_message(tx: Tx, message_id: str) -> list[dict[str, Any]]:
    return [_item(r) for r in tx.mappings(SENT_ITEMS_OF_MESSAGE, {"message_id": message_id})]


def mark_sent(tx: Tx, item_id: str, remote_id: str, now: int) -> bool:
    return tx.rowcount(MARK_SENT, {"id": item_id, "remote_id": remote_id, "now": now}) == 1


def mark_failed(tx: Tx, item_id: str, cause: str, now: int) -> bool:
    return tx.rowcount(MARK_FAILED, {"id": item_id, "cause": cause, "now": now}) == 1


def retry_later(tx: Tx, item_id: str, not_before: int, cause: str, now: int) -> bool:
    return tx.rowcount(RETRY_LATER, {"id": item_id, "not_before": not_before, "cause": cause, "now": now}) == 1


def set_body(tx: Tx, item_id: str, body: str, now: int) -> bool:
    return tx.rowcount(SET_BODY, {"id": item_id, "body": body, "now": now}) == 1


def set_echo(tx: Tx, item_id: str, echo_message_id: str, now: int) -> bool:
    return tx.rowcount(SET_ECHO, {"id": item_id, "echo": echo_message_id, "now": now}) == 1


def counts(tx: Tx, bridge_id: str) -> dict[str, int]:
    out = {str(s): 0 for s in OutboxState}
    for state, n in tx.all(COUNTS, {"bridge_id": bridge_id}):
        out[state] = int(n)
    return out


def typing(tx: Tx, bridge_id: str) -> list[dict[str, Any]]:
    """Linked conversations of this bridge whose channel has an agent member whose open
    session last reported ``working``."""
    return tx.mappings(TYPING, {"bridge_id": bridge_id})
