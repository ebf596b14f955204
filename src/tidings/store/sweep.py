"""The sweep set, written once, and every statement built from it.

An agent is a plain-delivery target of a channel when it is a member AND (subscribed OR
the channel is its home OR the channel is mandatory). ``sweep_set_sql`` renders that
disjunct for the aliases of a query, and every statement that needs it (the recipients of
a post, the in-sweep flag used by mention routing, the channels and cursors a sweep walks)
is built from it at import time. Nothing else in the code base spells the rule out, so
the recipients, the owed-mention decision and the sweep can never drift apart.

Booleans are normalised with ``bool()`` because SQLite answers 0/1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .engine import Tx
from .sql import PerDialect, Stmt, in_list, list_param


def sweep_set_sql(member: str = "cm", account: str = "a", channel: str = "c") -> str:
    """The sweep-set disjunct over ``channel_members {member}``, ``accounts {account}`` and
    ``channels {channel}`` (membership itself comes from the join on ``{member}``)."""
    return (
        f"({member}.subscribed OR {channel}.mandatory_subscription "
        f"OR {account}.home_channel_id = {channel}.id)"
    )


SWEEP_SET = sweep_set_sql()

_MEMBER_JOINS = (
    "FROM channel_members cm JOIN accounts a ON a.id = cm.account_id "
    "JOIN channels c ON c.id = cm.channel_id"
)

CHANNEL_AGENTS = Stmt(
    f"SELECT a.id, a.handle, a.wake_json, {SWEEP_SET} AS in_sweep {_MEMBER_JOINS} "
    "WHERE cm.channel_id = :channel_id AND a.kind = 'agent' ORDER BY a.id",
    name="channel_agents",
)
IN_SWEEP_SET = Stmt(
    f"SELECT 1 {_MEMBER_JOINS} WHERE cm.channel_id = :channel_id AND cm.account_id = :agent_id "
    f"AND a.kind = 'agent' AND {SWEEP_SET}",
    name="in_sweep_set",
)
SWEEP_CHANNELS = Stmt(
    f"SELECT cm.channel_id {_MEMBER_JOINS} WHERE cm.account_id = :agent_id AND a.kind = 'agent' "
    f"AND {SWEEP_SET} ORDER BY cm.channel_id",
    name="sweep_channels",
)
SWEEP_CURSORS = Stmt(
    "SELECT k.channel_id, k.acked_seq, k.above_seqs FROM agent_cursors k "
    "JOIN channel_members cm ON cm.channel_id = k.channel_id AND cm.account_id = k.agent_id "
    "JOIN accounts a ON a.id = k.agent_id JOIN channels c ON c.id = k.channel_id "
    f"WHERE k.agent_id = :agent_id AND {SWEEP_SET} ORDER BY k.channel_id",
    name="sweep_cursors",
)
#: The agent members of the channels in ``{IN}`` (an ``in_list`` fragment), unordered:
#: ``CHANNELS_AGENTS`` orders it; ``delivery.MESSAGES_AND_AGENTS`` embeds it.
CHANNELS_AGENTS_SELECT = (
    f"SELECT cm.channel_id, a.id, a.handle, a.wake_json, {SWEEP_SET} AS in_sweep {_MEMBER_JOINS} "
    "WHERE cm.channel_id {IN} AND a.kind = 'agent'"
)
_CHANNELS_AGENTS = CHANNELS_AGENTS_SELECT + " ORDER BY cm.channel_id, a.id"
CHANNELS_AGENTS = PerDialect(
    name="channels_agents",
    **{dialect: _CHANNELS_AGENTS.replace("{IN}", frag) for dialect, frag in in_list("channel_ids", "text").items()},
)


@dataclass(frozen=True, slots=True)
class ChannelAgent:
    """An agent member of a channel, as mention routing and fan-out see it."""

    id: str
    handle: str
    wake_json: str | None
    in_sweep: bool


def channel_agents(tx: Tx, channel_id: str) -> list[ChannelAgent]:
    """Every agent member of a channel (author included; callers drop it), by account id."""
    return [ChannelAgent(r[0], r[1], r[2], bool(r[3])) for r in tx.all(CHANNEL_AGENTS, {"channel_id": channel_id})]


def channels_agents(tx: Tx, channel_ids: list[str]) -> dict[str, list[ChannelAgent]]:
    """``channel_agents`` of several channels in one statement: every requested channel is
    a key (an empty list when it has no agent member), each list by account id."""
    out: dict[str, list[ChannelAgent]] = {cid: [] for cid in channel_ids}
    if not channel_ids:
        return out
    for r in tx.all(CHANNELS_AGENTS, {"channel_ids": list_param(tx, channel_ids)}):
        out[r[0]].append(channel_agent(r[1:]))
    return out


def channel_agent(r: tuple[Any, ...]) -> ChannelAgent:
    """A ``ChannelAgent`` from the (id, handle, wake_json, in_sweep) columns of a row."""
    return ChannelAgent(r[0], r[1], r[2], bool(r[3]))


def in_sweep_set(tx: Tx, agent_id: str, channel_id: str) -> bool:
    return tx.one(IN_SWEEP_SET, {"agent_id": agent_id, "channel_id": channel_id}) is not None


def sweep_channels(tx: Tx, agent_id: str) -> list[str]:
    return [r[0] for r in tx.all(SWEEP_CHANNELS, {"agent_id": agent_id})]


@dataclass(frozen=True, slots=True)
class SweepCursor:
    channel_id: str
    acked_seq: int
    above: frozenset[int]


def sweep_cursors(tx: Tx, agent_id: str) -> list[SweepCursor]:
    """The cursors of the agent's sweep-set channels, by channel id.

    A sweep-set channel without a cursor row is treated as caught up (nothing returned for
    it): every path that makes a channel a target seeds the cursor in the same transaction.
    """
    return [
        SweepCursor(r[0], int(r[1]), frozenset(json.loads(r[2]) if r[2] else ()))
        for r in tx.all(SWEEP_CURSORS, {"agent_id": agent_id})
    ]
