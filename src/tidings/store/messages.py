"""Hub messages: insert (idempotent per author and client_request_id), read, edit.

``seq`` is the global insert order; ``channel_seq`` is gap-free and commit-ordered within a
channel and is what every cursor and every ``after_seq`` read walks. A reader that pages a
channel by ``channel_seq`` can never skip a message that commits late, which a reader of a
PostgreSQL sequence can.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from . import search_index
from .channels import CHANNEL_COLUMNS, next_channel_seq, next_channel_seq_sql
from .engine import Tx, is_integrity_error
from .sql import PerDialect, Stmt

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
# PostgreSQL: the channel's next ``channel_seq`` (its row lock) and the insert in ONE
# statement, so the lock is taken by the post's last statement before COMMIT and is held
# for one client turn less. A used client request id inserts nothing but has taken the
# seq: the caller rolls the transaction back (``insert_next_message``). SQLite (no UPDATE
# in a WITH) runs ``next_channel_seq`` and ``INSERT_MESSAGE``.
_INSERT_MESSAGE_COLUMNS = (
    "INSERT INTO messages (id, channel_id, channel_seq, topic_id, author_account_id, at_unix_ms, "
    "blocks, text, client_request_id, occurred_at_ms) "
)
_NEXT_MESSAGE_VALUES = (
    "VALUES (:id, :channel_id, (SELECT last_seq FROM next), :topic_id, :author, :now, :blocks, :text, "
    ":client_request_id, :occurred_at_ms) "
)
_INSERT_NEXT = f"WITH next AS ({next_channel_seq_sql('channel_id')}) " + _INSERT_MESSAGE_COLUMNS + _NEXT_MESSAGE_VALUES
INSERT_NEXT_MESSAGE = PerDialect(
    name="insert_next_message",
    sqlite="SELECT NULL",
    postgresql=(
        _INSERT_NEXT
        + "ON CONFLICT (author_account_id, client_request_id) WHERE client_request_id <> '' DO NOTHING "
        "RETURNING seq, channel_seq"
    ),
)
# The same as a statement that commits alone (autocommit): a used client request id fails
# the whole statement (unique violation of ``IDEMPOTENCY_INDEX``), so the seq it took is
# never committed; ``DO NOTHING`` there would commit the channel's bump without a message.
INSERT_NEXT_MESSAGE_ALONE = PerDialect(
    name="insert_next_message_alone", sqlite="SELECT NULL", postgresql=_INSERT_NEXT + "RETURNING seq, channel_seq"
)
# The same for a cluster node: the statement also queues the cluster's "posted" notification
# (``cluster.events``: a JSON object, kind ``k``, node ``n``, message ``m``, channel ``c``,
# author ``a``, ``cs`` and ``s`` the seqs this insert took), so it is sent at the commit of
# the very statement that stored the message, and never without it.
_NOTIFIED = (
    "notified AS (SELECT pg_notify(CAST(:notify_channel AS text), json_build_object("
    "'k', CAST(:notify_kind AS text), 'n', CAST(:notify_node AS text), 'm', CAST(:id AS text), "
    "'c', CAST(:channel_id AS text), 'a', CAST(:author AS text), 'cs', inserted.channel_seq, "
    "'s', inserted.seq)::text) AS sent FROM inserted) "
)
INSERT_NEXT_MESSAGE_ALONE_NOTIFY = PerDialect(
    name="insert_next_message_alone_notify",
    sqlite="SELECT NULL",
    postgresql=(
        f"WITH next AS ({next_channel_seq_sql('channel_id')}), "
        "inserted AS ("
        + _INSERT_MESSAGE_COLUMNS
        + _NEXT_MESSAGE_VALUES
        + "RETURNING seq, channel_seq), "
        + _NOTIFIED
        + "SELECT inserted.seq, inserted.channel_seq FROM inserted CROSS JOIN notified"
    ),
)
IDEMPOTENCY_INDEX = "messages_idem_idx"
# PostgreSQL, a post's common case in ONE statement that commits alone (D110): the checks
# ``hub.posting`` makes from ``POST_CONTEXT`` are the condition of the channel_seq bump
# and the insert. ``admitted`` has the topic's id when the channel exists, the author is a
# member, the channel is not linked (a linked post also writes its outbox row, in a
# transaction), its post policy lets the author post, the topic exists and the author's
# client request id (if any) is unused. When it is empty, nothing is bumped or inserted:
# the statement returns a row of NULLs if the channel is linked and no row otherwise, and
# the caller runs the post's reads to learn why. Every sub-statement sees one snapshot;
# the bump waits for a concurrent post's lock and takes the seq after it, as ``next`` does.
_ADMITTED = (
    "admitted AS (SELECT t.id AS topic_id FROM channels c "
    "JOIN topics t ON t.channel_id = c.id AND t.name_folded = :name_folded "
    "WHERE c.id = :channel_id "
    "AND EXISTS (SELECT 1 FROM channel_members cm WHERE cm.channel_id = c.id AND cm.account_id = :author) "
    "AND NOT EXISTS (SELECT 1 FROM bridge_links l WHERE l.channel_id = c.id) "
    "AND (c.post_policy <> 'owner_only' OR c.owner_account_id = :author) "
    "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.author_account_id = :author "
    "AND m.client_request_id = :client_request_id AND m.client_request_id <> '')), "
    "next AS (UPDATE channels SET last_seq = last_seq + 1 "
    "WHERE id = :channel_id AND EXISTS (SELECT 1 FROM admitted) RETURNING last_seq), "
    "inserted AS (" + _INSERT_MESSAGE_COLUMNS
    + "SELECT :id, :channel_id, next.last_seq, admitted.topic_id, :author, :now, :blocks, :text, "
    ":client_request_id, :occurred_at_ms FROM next CROSS JOIN admitted RETURNING seq, channel_seq, topic_id)"
)
_LINKED_MARK = (
    " UNION ALL SELECT NULL, NULL, NULL WHERE EXISTS (SELECT 1 FROM bridge_links l WHERE l.channel_id = :channel_id)"
)
INSERT_IF_ADMITTED = PerDialect(
    name="insert_if_admitted",
    sqlite="SELECT NULL",
    postgresql="WITH " + _ADMITTED + " SELECT seq, channel_seq, topic_id FROM inserted" + _LINKED_MARK,
)
# The same for a cluster node, with the "posted" notification of ``INSERT_NEXT_MESSAGE_ALONE_NOTIFY``.
INSERT_IF_ADMITTED_NOTIFY = PerDialect(
    name="insert_if_admitted_notify",
    sqlite="SELECT NULL",
    postgresql=(
        "WITH " + _ADMITTED + ", "
        + _NOTIFIED
        + "SELECT inserted.seq, inserted.channel_seq, inserted.topic_id FROM inserted CROSS JOIN notified"
        + _LINKED_MARK
    ),
)
# Everything a post reads before it writes, in one statement (one round trip with the
# transaction's BEGIN on PostgreSQL): the channel, whether a bridge conversation is linked
# to it (an unlinked channel's post costs no outbox statement), whether the author is a
# member, the topic's id by folded name, and the author's stored message with this client
# request id (none for an empty one: an empty id is no key). No read depends on another.
_CHANNEL_AS_C = ", ".join("c." + c.strip() for c in CHANNEL_COLUMNS.split(","))
POST_CONTEXT = Stmt(
    f"SELECT {_CHANNEL_AS_C}, "
    "EXISTS (SELECT 1 FROM bridge_links l WHERE l.channel_id = c.id), "
    "EXISTS (SELECT 1 FROM channel_members cm WHERE cm.channel_id = c.id AND cm.account_id = :author), "
    "(SELECT t.id FROM topics t WHERE t.channel_id = c.id AND t.name_folded = :name_folded), "
    f"{MESSAGE_COLUMNS} FROM channels c LEFT JOIN messages m ON m.author_account_id = :author "
    "AND m.client_request_id = :client_request_id AND m.client_request_id <> '' "
    "WHERE c.id = :channel_id",
    name="post_context",
)
_CHANNEL_NAMES = tuple(c.strip() for c in CHANNEL_COLUMNS.split(","))
_MESSAGE_NAMES = tuple(c.strip()[2:] for c in MESSAGE_COLUMNS.split(","))
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


def _message_params(id: str, channel_id: str, author: str, now: int, blocks: list[dict[str, Any]], text: str,
                    client_request_id: str, occurred_at_ms: int | None) -> dict[str, Any]:
    """The bound values every message insert takes (the topic is the caller's)."""
    return {
        "id": id,
        "channel_id": channel_id,
        "author": author,
        "now": now,
        "blocks": json.dumps(blocks, separators=(",", ":"), ensure_ascii=False),
        "text": text,
        "client_request_id": client_request_id,
        "occurred_at_ms": occurred_at_ms,
    }


def _one_alone(tx: Tx, plain: PerDialect, notifying: PerDialect, params: dict[str, Any],
               notify: dict[str, str] | None) -> Any:
    """Run a post statement that commits alone (``notifying`` when ``notify`` is given);
    its row, or None when the author's client request id was used: the unique violation
    of ``IDEMPOTENCY_INDEX`` failed it whole, so nothing it took was committed."""
    try:
        if notify is not None:
            return tx.one(notifying, {**params, **notify})
        return tx.one(plain, params)
    except Exception as exc:
        if is_integrity_error(exc) and getattr(getattr(exc, "diag", None), "constraint_name", None) == (
            IDEMPOTENCY_INDEX
        ):
            return None
        raise


def insert_next_message(
    tx: Tx,
    *,
    id: str,
    channel_id: str,
    topic_id: str,
    author: str,
    now: int,
    blocks: list[dict[str, Any]],
    text: str,
    client_request_id: str,
    occurred_at_ms: int | None = None,
    alone: bool = False,
    notify: dict[str, str] | None = None,
) -> tuple[int, int] | None:
    """Take the channel's next ``channel_seq`` (holding the channel row lock until commit)
    and insert the message with it; (global ``seq``, ``channel_seq``), or None when the
    author's client request id was used (the seq was taken: roll the transaction back, or
    the channel would have a gap). PostgreSQL: one statement; SQLite: two.

    ``alone`` (PostgreSQL, ``tx`` in autocommit): the statement commits by itself, the row
    lock is held for the server's work and the commit only, and a used client request id
    fails the statement whole (None, nothing committed). ``notify`` (with ``alone``: the
    cluster's ``notify_channel``, ``notify_kind`` and ``notify_node``): the same statement
    also sends the cluster's posted notification at its commit."""
    params = _message_params(id, channel_id, author, now, blocks, text, client_request_id, occurred_at_ms)
    params["topic_id"] = topic_id
    search_index.queued(tx)  # SQLite: wake the search index's pass once this commits
    if tx.dialect == "postgresql":
        if alone:
            row = _one_alone(tx, INSERT_NEXT_MESSAGE_ALONE, INSERT_NEXT_MESSAGE_ALONE_NOTIFY, params, notify)
        else:
            row = tx.one(INSERT_NEXT_MESSAGE, params)
        return None if row is None else (int(row[0]), int(row[1]))
    channel_seq = next_channel_seq(tx, channel_id)
    seq = tx.scalar(INSERT_MESSAGE, {**params, "channel_seq": channel_seq})
    return None if seq is None else (int(seq), channel_seq)


#: ``insert_if_admitted``'s answer for a linked channel: its post needs a transaction.
LINKED = "linked"


def insert_if_admitted(
    tx: Tx,
    *,
    id: str,
    channel_id: str,
    topic: str,
    author: str,
    now: int,
    blocks: list[dict[str, Any]],
    text: str,
    client_request_id: str,
    occurred_at_ms: int | None = None,
    notify: dict[str, str] | None = None,
) -> tuple[int, int, str] | str | None:
    """PostgreSQL, ``tx`` in autocommit: the post's checks, its channel_seq and its insert in
    one statement that commits alone (``INSERT_IF_ADMITTED``). (seq, channel_seq, topic id)
    when it was admitted and stored; ``LINKED`` when the channel is linked; None when
    anything else kept it out (not admitted, or a concurrent post took its client request
    id): nothing was written, and the caller's reads say what to do."""
    params = _message_params(id, channel_id, author, now, blocks, text, client_request_id, occurred_at_ms)
    params["name_folded"] = topic.casefold()
    row = _one_alone(tx, INSERT_IF_ADMITTED, INSERT_IF_ADMITTED_NOTIFY, params, notify)
    if row is None:
        return None
    if row[0] is None:
        return LINKED
    return int(row[0]), int(row[1]), str(row[2])


@dataclass(frozen=True, slots=True)
class PostContext:
    """What ``post_context`` read: the channel row (with ``linked``), whether the author
    is a member, the topic's id (None: no such topic yet) and the author's stored message
    with the post's client request id (None: unused, or no id given)."""

    channel: dict[str, Any]
    is_member: bool
    topic_id: str | None
    existing: dict[str, Any] | None


def post_context(tx: Tx, *, channel_id: str, author: str, topic: str, client_request_id: str) -> PostContext | None:
    """A post's reads in one statement (``POST_CONTEXT``); None when the channel is unknown."""
    row = tx.one(
        POST_CONTEXT,
        {"channel_id": channel_id, "author": author, "name_folded": topic.casefold(),
         "client_request_id": client_request_id},
    )
    if row is None:
        return None
    n = len(_CHANNEL_NAMES)
    channel = dict(zip(_CHANNEL_NAMES, row[:n], strict=True))
    channel["mandatory_subscription"] = bool(channel["mandatory_subscription"])
    channel["linked"] = bool(row[n])
    stored = row[n + 3:]
    existing = None if stored[0] is None else row_to_message(dict(zip(_MESSAGE_NAMES, stored, strict=True)))
    return PostContext(channel, bool(row[n + 1]), row[n + 2], existing)


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
