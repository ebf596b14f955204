"""Owed mentions and routed marks: the durable half of the mention pass.

**Owed mention.** A durable ``owed_mentions(agent, message)`` row: the agent was mentioned
outside the channel's sweep set, so its cursor will never carry the message. It is owed
while ``acked_at_ms`` is NULL. Recording is idempotent (primary-key insert-if-absent). An
ack does not delete the row, it stamps ``acked_at_ms`` (``cursors.ack``); since recording
never touches an existing row, a later pass over the same message (a retried flush, the
recovery scan, a settle that fires after the agent read and acked the message) can never
owe an acked mention again.

**Routed mark.** ``messages.mentions_routed_at`` is stamped when a message's mention pass
committed; ``record_and_mark`` writes the owed rows and the marks together (the routing
flush, D16).
"""

from __future__ import annotations

import json
from typing import Any

from .engine import Tx
from .messages import MESSAGE_COLUMNS, row_to_message
from .nodes import CHANNEL as CLUSTER_CHANNEL
from .sql import PerDialect, Stmt, in_list, list_param

RECORD_OWED = Stmt(
    "INSERT INTO owed_mentions (agent_id, message_id, channel_id, recorded_at_ms) "
    "VALUES (:agent_id, :message_id, :channel_id, :now) ON CONFLICT (agent_id, message_id) DO NOTHING",
    name="record_owed",
)
RECORD_OWED_MANY = PerDialect(
    name="record_owed_many",
    sqlite=(
        "INSERT INTO owed_mentions (agent_id, message_id, channel_id, recorded_at_ms) "
        "SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), :now "
        "FROM json_each(:rows) WHERE true ON CONFLICT (agent_id, message_id) DO NOTHING"
    ),
    postgresql=(
        "INSERT INTO owed_mentions (agent_id, message_id, channel_id, recorded_at_ms) "
        "SELECT t.a, t.m, t.c, :now FROM unnest(CAST(:agents AS text[]), CAST(:messages AS text[]), "
        "CAST(:channels AS text[])) AS t(a, m, c) ON CONFLICT (agent_id, message_id) DO NOTHING"
    ),
)
CLEAR_OWED = Stmt("DELETE FROM owed_mentions WHERE agent_id = :agent_id AND message_id = :message_id", name="clear_owed")
OWED_OF = Stmt(
    "SELECT o.message_id, m.channel_id, m.channel_seq FROM owed_mentions o "
    "JOIN messages m ON m.id = o.message_id WHERE o.agent_id = :agent_id AND o.acked_at_ms IS NULL "
    "ORDER BY m.channel_id, m.channel_seq",
    name="owed_of",
)
OWED_PAGE = Stmt(
    f"SELECT {MESSAGE_COLUMNS} FROM owed_mentions o JOIN messages m ON m.id = o.message_id "
    "WHERE o.agent_id = :agent_id AND o.acked_at_ms IS NULL "
    "AND (m.channel_id > :after_channel OR (m.channel_id = :after_channel AND m.channel_seq > :after_seq)) "
    "ORDER BY m.channel_id, m.channel_seq LIMIT :limit",
    name="owed_page",
)
COUNT_OWED = Stmt("SELECT COUNT(*) FROM owed_mentions WHERE acked_at_ms IS NULL", name="count_owed")
COUNT_OWED_OF = Stmt(
    "SELECT COUNT(*) FROM owed_mentions WHERE agent_id = :agent_id AND acked_at_ms IS NULL", name="count_owed_of"
)
# Marks name their rows one by one (never a seq range): a range could cover a lower seq
# that commits after the scan read it, and that row would be marked without being routed.
_MARK_ROUTED = "UPDATE messages SET mentions_routed_at = :now WHERE mentions_routed_at IS NULL AND seq {IN}"
MARK_ROUTED = PerDialect(
    name="mark_routed",
    **{dialect: _MARK_ROUTED.replace("{IN}", frag) for dialect, frag in in_list("seqs", "bigint").items()},
)
# The routing flush as ONE statement on PostgreSQL (so it can run in autocommit, with no
# BEGIN/COMMIT round trips): the owed rows and the marks are two data-modifying CTEs of a
# single statement, which commits (or fails) as a whole. SQLite runs the same two writes
# as two statements of one transaction (``record_owed_many`` then ``mark_routed``).
_RECORD_AND_MARK_CTES = (
    "WITH owed AS (INSERT INTO owed_mentions (agent_id, message_id, channel_id, recorded_at_ms) "
    "SELECT t.a, t.m, t.c, :now FROM unnest(CAST(:agents AS text[]), CAST(:messages AS text[]), "
    "CAST(:channels AS text[])) AS t(a, m, c) ON CONFLICT (agent_id, message_id) DO NOTHING RETURNING 1), "
    "marked AS (UPDATE messages SET mentions_routed_at = :now WHERE mentions_routed_at IS NULL "
    f"AND seq {in_list('seqs', 'bigint')['postgresql']} RETURNING 1)"
)
RECORD_AND_MARK = PerDialect(
    name="record_and_mark",
    sqlite="SELECT 1",
    postgresql=_RECORD_AND_MARK_CTES + " SELECT (SELECT count(*) FROM owed), (SELECT count(*) FROM marked)",
)
# The same for a cluster node: the statement also sends the owed hints (``cluster.events``,
# kind ``o``), so they go out at the commit of the very statement that recorded the rows,
# and never without it (D123). ``notified`` is counted so that PostgreSQL runs it.
RECORD_AND_MARK_NOTIFY = PerDialect(
    name="record_and_mark_notify",
    sqlite="SELECT 1",
    postgresql=(
        _RECORD_AND_MARK_CTES
        + ", notified AS (SELECT pg_notify(CAST(:notify_channel AS text), p) FROM unnest(CAST(:hints AS text[])) AS p) "
        "SELECT (SELECT count(*) FROM owed), (SELECT count(*) FROM marked), (SELECT count(*) FROM notified)"
    ),
)


def record_owed(tx: Tx, agent_id: str, message_id: str, channel_id: str, now: int) -> bool:
    """Record an owed mention; True when the row is new (a repeat is a no-op)."""
    return (
        tx.rowcount(RECORD_OWED, {"agent_id": agent_id, "message_id": message_id, "channel_id": channel_id, "now": now})
        == 1
    )


def record_owed_many(tx: Tx, rows: list[tuple[str, str, str]], now: int) -> int:
    """Record many (agent_id, message_id, channel_id) owed mentions in one statement;
    returns how many rows were new."""
    if not rows:
        return 0
    if tx.dialect == "postgresql":
        params: dict[str, Any] = {
            "agents": [r[0] for r in rows],
            "messages": [r[1] for r in rows],
            "channels": [r[2] for r in rows],
            "now": now,
        }
    else:
        params = {"rows": json.dumps([list(r) for r in rows]), "now": now}
    return tx.rowcount(RECORD_OWED_MANY, params)


def clear_owed(tx: Tx, agent_id: str, message_id: str) -> bool:
    """Delete the row outright (its message is gone); an ack stamps it instead."""
    return tx.rowcount(CLEAR_OWED, {"agent_id": agent_id, "message_id": message_id}) == 1


def owed_of(tx: Tx, agent_id: str) -> list[dict[str, Any]]:
    """The agent's owed mentions as ``{"message_id", "channel_id", "seq"}``, by channel then seq."""
    return [
        {"message_id": r[0], "channel_id": r[1], "seq": int(r[2])} for r in tx.all(OWED_OF, {"agent_id": agent_id})
    ]


def owed_page(tx: Tx, agent_id: str, after_channel: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
    """Owed messages (full rows) after the (channel, channel_seq) position, in that order."""
    rows = tx.mappings(
        OWED_PAGE,
        {"agent_id": agent_id, "after_channel": after_channel, "after_seq": after_seq, "limit": limit},
    )
    return [row_to_message(r) for r in rows]


def count_owed(tx: Tx, agent_id: str | None = None) -> int:
    if agent_id is None:
        return int(tx.scalar(COUNT_OWED))
    return int(tx.scalar(COUNT_OWED_OF, {"agent_id": agent_id}))


def record_and_mark(
    tx: Tx, owed: list[tuple[str, str, str]], seqs: list[int], now: int, hints: list[str] | None = None
) -> tuple[int, int]:
    """The routing flush: record the owed (agent_id, message_id, channel_id) rows and mark
    the messages with these global seqs, together; returns (owed rows new, rows marked).
    ``hints`` (a cluster node's owed hints, PostgreSQL) are notified by the same statement.

    PostgreSQL: one statement (fit for ``Dedicated.autocommit_write``). SQLite: two
    statements, so ``tx`` must be a transaction.
    """
    if tx.dialect != "postgresql":
        return record_owed_many(tx, owed, now), mark_routed(tx, seqs, now)
    if not owed:
        return 0, mark_routed(tx, seqs, now)
    params: dict[str, Any] = {
        "agents": [r[0] for r in owed],
        "messages": [r[1] for r in owed],
        "channels": [r[2] for r in owed],
        "seqs": list(seqs),
        "now": now,
    }
    if hints:
        params["notify_channel"] = CLUSTER_CHANNEL
        params["hints"] = hints
    row = tx.one(RECORD_AND_MARK_NOTIFY if hints else RECORD_AND_MARK, params)
    assert row is not None
    return int(row[0]), int(row[1])


def mark_routed(tx: Tx, seqs: list[int], now: int) -> int:
    """Stamp ``mentions_routed_at`` on exactly the rows with these global seqs (already
    marked rows keep their time); returns how many rows changed."""
    if not seqs:
        return 0
    return tx.rowcount(MARK_ROUTED, {"seqs": list_param(tx, seqs), "now": now})
