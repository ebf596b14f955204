"""Delivery reads of messages: the sweep's channel page, the recovery scan's page, the
live path's batched reads, and the consumer connection's commit settings.

The sweep set is ``sweep.py``; owed rows and routed marks are ``owed.py``; cursors are
``cursors.py``; session rows are ``sessions.py``.
"""

from __future__ import annotations

from typing import Any

from .engine import Tx
from .messages import MESSAGE_COLUMNS, row_to_message
from .roster import RosterCache
from .sql import PerDialect, Stmt, in_list, list_param
from .sweep import CHANNELS_AGENTS_SELECT, ChannelAgent, channel_agent, channels_agents

CHANNEL_PAGE_FOR = Stmt(
    f"SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.channel_id = :channel_id "
    "AND m.channel_seq > :after_seq AND m.author_account_id <> :agent_id "
    "ORDER BY m.channel_seq LIMIT :limit",
    name="channel_page_for",
)
UNROUTED_PAGE = Stmt(
    f"SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.mentions_routed_at IS NULL "
    "AND m.seq > :after_seq ORDER BY m.seq LIMIT :limit",
    name="unrouted_page",
)
# PostgreSQL plans the page from statistics that are stale exactly when the scan matters
# (after a crash, almost every recent row is NULL while the statistics say almost none
# are), and then picks a bitmap scan of the WHOLE unrouted set plus a sort, per batch:
# quadratic in the backlog. Forbidding the sort inside the read transaction leaves only
# the ordered walk of the partial index, which stops after ``limit`` rows.
ORDERED_WALK = PerDialect(
    name="ordered_walk", sqlite="SELECT 1", postgresql="SET LOCAL enable_sort = off"
)
# The routing flush (owed rows + marks) may commit asynchronously on PostgreSQL: a commit
# lost in a crash loses the marks together with the owed rows, the messages are NULL
# again, and the start scan routes them again. Nothing it writes is trusted before that.
# It is set once per consumer connection (``CONSUMER_PG_SETTINGS``, a session setting;
# a per-transaction ``SET LOCAL`` cost one round trip per flush), and every OTHER write
# on that connection puts the server's own default back for its transaction
# (``strict_commit``), so those commit exactly as durably as on any other connection.
CONSUMER_PG_SETTINGS = {"synchronous_commit": "off"}
STRICT_COMMIT = PerDialect(
    name="strict_commit", sqlite="SELECT 1", postgresql="SET LOCAL synchronous_commit TO DEFAULT"
)
# Batched reads of the live path: the rows of every posted message drained in one pump,
# and the agent members of their channels, one statement each.
_MESSAGES_BY_IDS = f"SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.id {{IN}}"
MESSAGES_BY_IDS = PerDialect(
    name="messages_by_ids",
    **{dialect: _MESSAGES_BY_IDS.replace("{IN}", frag) for dialect, frag in in_list("ids", "text").items()},
)


# The live path's batch in ONE statement when the channels are known up front (a posted
# event names its channel): the rows (part 0) and the agent members of those channels
# (part 1, by channel then account id), as a UNION ALL of the two plain reads, each
# planned on its own (no join, no aggregate; see ``messages_with_agents``).
_MESSAGE_WIDTH = len(MESSAGE_COLUMNS.split(","))
_MESSAGE_NAMES = tuple(c.strip()[2:] for c in MESSAGE_COLUMNS.split(","))
_NULL_MESSAGE = ", ".join(["NULL"] * _MESSAGE_WIDTH)
_MESSAGES_PART = (
    f"SELECT 0 AS part, {MESSAGE_COLUMNS}, NULL, NULL, NULL, NULL, NULL FROM messages m WHERE m.id {{IDS}} "
)
_ORDER = "ORDER BY 1, " + f"{_MESSAGE_WIDTH + 2}, {_MESSAGE_WIDTH + 3}"
_MESSAGES_AND_AGENTS = (
    _MESSAGES_PART
    + f"UNION ALL SELECT 1, {_NULL_MESSAGE}, agents.* FROM ("
    + CHANNELS_AGENTS_SELECT.replace("{IN}", "{CHANNEL_IDS}")
    + ") agents " + _ORDER
)
# The same with a roster copy (``roster.RosterCache``, D108): part 1 reads the channels in
# ``uncached``, and those in ``cached`` only when the epoch is not the one bound (the copy
# is stale); part 2 is the epoch. The epoch test names no row, so both databases evaluate
# it once, and at the bound epoch the cached channels' join never runs.
_EPOCH_MOVED = "COALESCE((SELECT epoch FROM roster_epoch WHERE id = 1), -1) <> :epoch"
_MESSAGES_AND_UNHELD_AGENTS = (
    _MESSAGES_PART
    + f"UNION ALL SELECT 1, {_NULL_MESSAGE}, agents.* FROM ("
    + CHANNELS_AGENTS_SELECT.replace("{IN}", "{UNCACHED}")
    + ") agents "
    f"UNION ALL SELECT 1, {_NULL_MESSAGE}, agents.* FROM ("
    + CHANNELS_AGENTS_SELECT.replace("{IN}", "{CACHED}") + f" AND {_EPOCH_MOVED}"
    + ") agents "
    f"UNION ALL SELECT 2, {_NULL_MESSAGE}, CAST(epoch AS TEXT), NULL, NULL, NULL, NULL "
    "FROM roster_epoch WHERE id = 1 " + _ORDER
)

# Every roster the batch needs is held (D126): the rows and the epoch, nothing joined. At the
# epoch held the copy serves them all; at any other, ``MESSAGES_AND_UNHELD_AGENTS`` follows.
# The join branches of that statement cost PostgreSQL about 0.2 ms a run even when their
# epoch test leaves them unexecuted; this one costs about what a bare row read does.
_MESSAGES_AND_EPOCH = (
    _MESSAGES_PART
    + f"UNION ALL SELECT 2, {_NULL_MESSAGE}, CAST(epoch AS TEXT), NULL, NULL, NULL, NULL "
    "FROM roster_epoch WHERE id = 1"
)


def _fill(template: str, dialect: str) -> str:
    for key, param in (("{IDS}", "ids"), ("{CHANNEL_IDS}", "channel_ids"), ("{UNCACHED}", "uncached"),
                       ("{CACHED}", "cached")):
        template = template.replace(key, in_list(param, "text")[dialect])
    return template


MESSAGES_AND_AGENTS = PerDialect(
    name="messages_and_agents",
    **{dialect: _fill(_MESSAGES_AND_AGENTS, dialect) for dialect in ("sqlite", "postgresql")},
)
MESSAGES_AND_UNHELD_AGENTS = PerDialect(
    name="messages_and_unheld_agents",
    **{dialect: _fill(_MESSAGES_AND_UNHELD_AGENTS, dialect) for dialect in ("sqlite", "postgresql")},
)
MESSAGES_AND_EPOCH = PerDialect(
    name="messages_and_epoch",
    **{dialect: _fill(_MESSAGES_AND_EPOCH, dialect) for dialect in ("sqlite", "postgresql")},
)


def messages_by_ids(tx: Tx, message_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The current rows of these messages (blocks decoded), by id; unknown ids are absent."""
    if not message_ids:
        return {}
    rows = tx.mappings(MESSAGES_BY_IDS, {"ids": list_param(tx, message_ids)})
    return {r["id"]: row_to_message(r) for r in rows}


def messages_with_agents(
    tx: Tx, message_ids: list[str], channel_ids: list[str] | None = None, roster: RosterCache | None = None
) -> tuple[dict[str, dict[str, Any]], dict[str, list[ChannelAgent]]]:
    """``messages_by_ids`` and the ``channels_agents`` of every channel those rows are in
    (two statements: run them in one ``read()`` for one snapshot on SQLite).

    With ``channel_ids`` (the channels the messages were posted in, known from their
    events): ONE statement, ``MESSAGES_AND_AGENTS``, and the agents of exactly those
    channels (a row in a channel not listed reads its agents alone, as before). With
    ``roster`` too, the agents of a channel it holds at the epoch this statement reads
    come from it, and the statement returns only the others (``roster.RosterCache``).
    When it holds them all, the statement reads the rows and the epoch only
    (``MESSAGES_AND_EPOCH``, D126); at a moved epoch a second statement reads the rows
    and rosters again, together, so a roster is never older than the rows it serves.

    Plain statements, not a join: a single statement joining both (a CTE with a JSON
    aggregate, or a correlated subquery) costs PostgreSQL more planning time per call than
    the round trip it saves (measured: ~350 us and ~220 us against ~135 us for both).
    """
    if channel_ids is None:
        rows = messages_by_ids(tx, message_ids)
        return rows, channels_agents(tx, sorted({r["channel_id"] for r in rows.values()}))
    wanted = sorted(set(channel_ids))
    rows = {}
    fetched: dict[str, list[ChannelAgent]] = {cid: [] for cid in wanted}
    if roster is None:
        statement, params = MESSAGES_AND_AGENTS, {"channel_ids": list_param(tx, wanted)}
    else:
        cached = roster.cached(wanted)
        uncached = set(wanted) - cached
        if not uncached:
            held = _rows_at_held_epoch(tx, message_ids, wanted, roster)
            if held is not None:
                return held
        statement = MESSAGES_AND_UNHELD_AGENTS
        params = {"uncached": list_param(tx, sorted(uncached)), "cached": list_param(tx, sorted(cached)),
                  "epoch": roster.bound_epoch()}
    params["ids"] = list_param(tx, message_ids)
    read_epoch = None
    for r in tx.all(statement, params):
        if r[0] == 0:
            row = _message_of(r)
            rows[row["id"]] = row
        elif r[0] == 1:
            fetched[r[_MESSAGE_WIDTH + 1]].append(channel_agent(r[_MESSAGE_WIDTH + 2:]))
        else:
            read_epoch = int(r[_MESSAGE_WIDTH + 1])
    if roster is None:
        return rows, fetched
    return rows, roster.settle(read_epoch, fetched, uncached)


def _message_of(r: tuple[Any, ...]) -> dict[str, Any]:
    """The message of a part-0 row of the batched reads (its columns after the part)."""
    return row_to_message(dict(zip(_MESSAGE_NAMES, r[1:_MESSAGE_WIDTH + 1], strict=True)))


def _rows_at_held_epoch(
    tx: Tx, message_ids: list[str], wanted: list[str], roster: RosterCache
) -> tuple[dict[str, dict[str, Any]], dict[str, list[ChannelAgent]]] | None:
    """Every roster in ``wanted`` held: the rows and the epoch in one statement that joins
    nothing (D126). At the epoch held, the rows and the held rosters; at any other (or with
    no epoch row), None: the caller reads rows and rosters again in one statement."""
    rows: dict[str, dict[str, Any]] = {}
    read_epoch = None
    for r in tx.all(MESSAGES_AND_EPOCH, {"ids": list_param(tx, message_ids)}):
        if r[0] == 0:
            row = _message_of(r)
            rows[row["id"]] = row
        else:
            read_epoch = int(r[_MESSAGE_WIDTH + 1])
    if read_epoch is None or read_epoch != roster.epoch:
        return None
    return rows, roster.settle(read_epoch, {cid: [] for cid in wanted}, set())


def channel_page_for(tx: Tx, agent_id: str, channel_id: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
    """Messages of a channel above ``after_seq`` not authored by ``agent_id``, ascending."""
    rows = tx.mappings(
        CHANNEL_PAGE_FOR, {"channel_id": channel_id, "after_seq": after_seq, "agent_id": agent_id, "limit": limit}
    )
    return [row_to_message(r) for r in rows]


def unrouted_page(tx: Tx, after_seq: int, limit: int) -> list[dict[str, Any]]:
    """Committed messages whose mention pass never completed, global seq > ``after_seq``.

    ``blocks`` is left as stored JSON text: the scan decodes only the rows that can hold a
    mention at all.
    """
    if tx.dialect == "postgresql":
        tx.execute(ORDERED_WALK).close()
    return tx.mappings(UNROUTED_PAGE, {"after_seq": after_seq, "limit": limit})


def strict_commit(tx: Tx) -> None:
    """On a connection opened with ``CONSUMER_PG_SETTINGS``: this transaction commits with
    the server's default ``synchronous_commit`` (PostgreSQL only; a no-op on SQLite)."""
    if tx.dialect == "postgresql":
        tx.execute(STRICT_COMMIT).close()
