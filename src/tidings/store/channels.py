"""Channels, members and topics: rows only, no policy.

``next_channel_seq_sql`` is the one place a message's ``channel_seq`` comes from: an UPDATE
of the channel row inside the post transaction (on PostgreSQL inside the message insert
itself, ``messages.INSERT_NEXT_MESSAGE``). The row lock it takes (PostgreSQL) or the
single writer (SQLite) makes ``channel_seq`` gap-free and in commit order within a channel,
which a PostgreSQL sequence is not.
"""

from __future__ import annotations

from typing import Any, cast

from .engine import Tx
from .sql import Stmt

CHANNEL_COLUMNS = (
    "id, name, kind, post_policy, owner_account_id, mandatory_subscription, last_seq, created_by, created_at_ms"
)

INSERT_CHANNEL = Stmt(
    "INSERT INTO channels (id, name, kind, post_policy, owner_account_id, mandatory_subscription, "
    "created_by, created_at_ms) VALUES (:id, :name, :kind, :post_policy, :owner_account_id, "
    ":mandatory, :created_by, :now)",
    name="insert_channel",
)
CHANNEL_BY_ID = Stmt(f"SELECT {CHANNEL_COLUMNS} FROM channels WHERE id = :id", name="channel_by_id")
CHANNEL_FOR_UPDATE = Stmt(f"SELECT {CHANNEL_COLUMNS} FROM channels WHERE id = :id", name="channel_for_update")


def next_channel_seq_sql(param: str) -> str:
    """The one statement a ``channel_seq`` comes from (the channel row lock), for the
    channel id bound to ``:param``; ``messages.INSERT_NEXT_MESSAGE`` embeds it."""
    return f"UPDATE channels SET last_seq = last_seq + 1 WHERE id = :{param} RETURNING last_seq"


NEXT_CHANNEL_SEQ = Stmt(next_channel_seq_sql("id"), name="next_channel_seq")
CHANNELS_OF_MEMBER = Stmt(
    f"SELECT {', '.join('c.' + c.strip() for c in CHANNEL_COLUMNS.split(','))}, m.subscribed "
    "FROM channel_members m JOIN channels c ON c.id = m.channel_id "
    "WHERE m.account_id = :account_id ORDER BY c.name, c.id",
    name="channels_of_member",
)
ALL_CHANNELS = Stmt(f"SELECT {CHANNEL_COLUMNS}, NULL AS subscribed FROM channels ORDER BY name, id", name="all_channels")

MEMBER = Stmt(
    "SELECT subscribed FROM channel_members WHERE channel_id = :channel_id AND account_id = :account_id",
    name="member",
)
INSERT_MEMBER = Stmt(
    "INSERT INTO channel_members (channel_id, account_id, subscribed, added_at_ms) "
    "VALUES (:channel_id, :account_id, :subscribed, :now) "
    "ON CONFLICT (channel_id, account_id) DO NOTHING",
    name="insert_member",
)
SET_SUBSCRIBED = Stmt(
    "UPDATE channel_members SET subscribed = :subscribed "
    "WHERE channel_id = :channel_id AND account_id = :account_id",
    name="set_subscribed",
)
DELETE_MEMBER = Stmt(
    "DELETE FROM channel_members WHERE channel_id = :channel_id AND account_id = :account_id",
    name="delete_member",
)
MEMBERS = Stmt(
    "SELECT a.id, a.kind, a.handle, a.display_name, m.subscribed FROM channel_members m "
    "JOIN accounts a ON a.id = m.account_id WHERE m.channel_id = :channel_id ORDER BY a.handle",
    name="members",
)

INSERT_TOPIC = Stmt(
    "INSERT INTO topics (id, channel_id, name, name_folded, created_by, created_at_ms) "
    "VALUES (:id, :channel_id, :name, :name_folded, :created_by, :now) "
    "ON CONFLICT (channel_id, name_folded) DO NOTHING",
    name="insert_topic",
)
TOPIC_BY_NAME = Stmt(
    "SELECT id, name FROM topics WHERE channel_id = :channel_id AND name_folded = :name_folded",
    name="topic_by_name",
)
TOPIC_BY_ID = Stmt("SELECT id, channel_id, name FROM topics WHERE id = :id", name="topic_by_id")


def insert_channel(
    tx: Tx,
    *,
    id: str,
    name: str,
    kind: str,
    post_policy: str,
    owner_account_id: str | None,
    mandatory: bool,
    created_by: str | None,
    now: int,
) -> None:
    tx.execute(
        INSERT_CHANNEL,
        {
            "id": id,
            "name": name,
            "kind": kind,
            "post_policy": post_policy,
            "owner_account_id": owner_account_id,
            "mandatory": bool(mandatory),
            "created_by": created_by,
            "now": now,
        },
    )


def channel(tx: Tx, channel_id: str) -> dict[str, Any] | None:
    row = tx.mapping(CHANNEL_BY_ID, {"id": channel_id})
    if row is not None:
        row["mandatory_subscription"] = bool(row["mandatory_subscription"])
    return row


def channels_of(tx: Tx, account_id: str | None) -> list[dict[str, Any]]:
    """Channels ``account_id`` is a member of (with its ``subscribed`` flag); None: all."""
    rows = tx.mappings(ALL_CHANNELS) if account_id is None else tx.mappings(
        CHANNELS_OF_MEMBER, {"account_id": account_id}
    )
    for r in rows:
        r["mandatory_subscription"] = bool(r["mandatory_subscription"])
        if r["subscribed"] is not None:
            r["subscribed"] = bool(r["subscribed"])
    return rows


def next_channel_seq(tx: Tx, channel_id: str) -> int:
    """Take the next ``channel_seq`` of a channel; holds the channel row lock until commit."""
    return cast(int, tx.scalar(NEXT_CHANNEL_SEQ, {"id": channel_id}))


def membership(tx: Tx, channel_id: str, account_id: str) -> bool | None:
    """None when not a member, else the ``subscribed`` flag."""
    row = tx.one(MEMBER, {"channel_id": channel_id, "account_id": account_id})
    return None if row is None else bool(row[0])


def add_member(tx: Tx, channel_id: str, account_id: str, subscribed: bool, now: int) -> bool:
    """Insert a membership; an existing member is left as it is. True if inserted."""
    return (
        tx.rowcount(
            INSERT_MEMBER,
            {"channel_id": channel_id, "account_id": account_id, "subscribed": bool(subscribed), "now": now},
        )
        == 1
    )


def set_subscribed(tx: Tx, channel_id: str, account_id: str, subscribed: bool) -> None:
    tx.execute(
        SET_SUBSCRIBED, {"channel_id": channel_id, "account_id": account_id, "subscribed": bool(subscribed)}
    )


def remove_member(tx: Tx, channel_id: str, account_id: str) -> bool:
    return tx.rowcount(DELETE_MEMBER, {"channel_id": channel_id, "account_id": account_id}) == 1


def members(tx: Tx, channel_id: str) -> list[dict[str, Any]]:
    rows = tx.mappings(MEMBERS, {"channel_id": channel_id})
    for r in rows:
        r["subscribed"] = bool(r["subscribed"])
    return rows


def get_or_create_topic(tx: Tx, *, id: str, channel_id: str, name: str, created_by: str, now: int) -> str:
    """The topic id for ``name`` in a channel, matched case-insensitively; created if missing."""
    folded = name.casefold()
    row = tx.one(TOPIC_BY_NAME, {"channel_id": channel_id, "name_folded": folded})
    if row is not None:
        return cast(str, row[0])
    tx.execute(
        INSERT_TOPIC,
        {"id": id, "channel_id": channel_id, "name": name, "name_folded": folded, "created_by": created_by, "now": now},
    )
    return cast(str, cast("tuple[Any, ...]", tx.one(TOPIC_BY_NAME, {"channel_id": channel_id, "name_folded": folded}))[0])


def topic(tx: Tx, topic_id: str) -> tuple[Any, ...] | None:
    return tx.one(TOPIC_BY_ID, {"id": topic_id})


CHANNEL_IDS_NAMED = Stmt("SELECT id FROM channels WHERE name = :name ORDER BY created_at_ms, id")
OWNS_AN_AGENT_MEMBER = Stmt(
    "SELECT 1 FROM channel_members m JOIN accounts a ON a.id = m.account_id "
    "WHERE m.channel_id = :channel_id AND a.kind = 'agent' AND a.owner_id = :account_id LIMIT 1"
)


def channel_ids_named(tx: Tx, name: str) -> list[str]:
    """Ids of every channel called ``name`` (names are not unique), oldest first."""
    return [r[0] for r in tx.all(CHANNEL_IDS_NAMED, {"name": name})]


def owns_an_agent_member(tx: Tx, channel_id: str, account_id: str) -> bool:
    """Whether ``account_id`` owns an agent that is a member of the channel."""
    return tx.one(OWNS_AN_AGENT_MEMBER, {"channel_id": channel_id, "account_id": account_id}) is not None
