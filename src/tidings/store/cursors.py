"""Agent delivery cursors and owed mentions, keyed on ``channel_seq``.

**Cursor.** Per (agent, channel): ``acked_seq``, a low-water mark (every message owed to
the agent at or below it is acked), and ``above_seqs``, the acked ``channel_seq`` values
above it (a JSON array). Acks arrive out of order (steers, lost acks), so a single
high-water mark would skip an earlier unacked message.

**Seed.** A seed rides the same transaction as the membership or policy change that makes a
channel a delivery target, starts at the channel head (no history replay), never resets an
existing cursor, and is a silent no-op for a non-agent account.

**Contiguous advance (reference flaw, fixed).** The reference keys its cursor on the global
seq, so another channel's seqs (and unused sequence values) stop the advance and the
above-set grows without bound. Ours walks ``channel_seq``, which is gap-free and
commit-ordered within a channel, so the advance steps over exactly two things: acked seqs
and seqs the agent authored itself. It never steps over a seq merely because it is not
visible yet: an in-flight post is neither acked nor visible as self-authored, so the
advance stops below it and the message is swept once it commits.

**Ack.** An ack stamps the agent's owed row (``owed.py``) if there is one, and, for an
agent outside the sweep set, leaves such a stamped row even when nothing was owed yet, so
a later pass can never owe an acked mention again. The ack's clear runs first and commits
even when the agent has no cursor in the channel or the ack is a duplicate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .engine import Tx
from .sql import PerDialect, Stmt
from .sweep import IN_SWEEP_SET

SEED_CURSOR = Stmt(
    "INSERT INTO agent_cursors (agent_id, channel_id, acked_seq, above_seqs) "
    "SELECT a.id, c.id, c.last_seq, '[]' FROM accounts a, channels c "
    "WHERE a.id = :agent_id AND a.kind = 'agent' AND c.id = :channel_id "
    "ON CONFLICT (agent_id, channel_id) DO NOTHING",
    name="seed_cursor",
)
CURSOR = Stmt(
    "SELECT acked_seq, above_seqs FROM agent_cursors WHERE agent_id = :agent_id AND channel_id = :channel_id",
    name="cursor",
)
_CURSOR_SQL = "SELECT acked_seq, above_seqs FROM agent_cursors WHERE agent_id = :agent_id AND channel_id = :channel_id"
CURSOR_FOR_UPDATE = PerDialect(name="cursor_for_update", sqlite=_CURSOR_SQL, postgresql=_CURSOR_SQL + " FOR UPDATE")
ACK_TARGET = Stmt(
    "SELECT m.channel_id, m.channel_seq, "
    "EXISTS (SELECT 1 FROM channel_members cm WHERE cm.channel_id = m.channel_id AND cm.account_id = :agent_id), "
    "EXISTS (SELECT 1 FROM owed_mentions o WHERE o.agent_id = :agent_id AND o.message_id = m.id) "
    "FROM messages m WHERE m.id = :message_id",
    name="ack_target",
)
ACK_OWED = Stmt(
    "UPDATE owed_mentions SET acked_at_ms = :now "
    "WHERE agent_id = :agent_id AND message_id = :message_id AND acked_at_ms IS NULL",
    name="ack_owed",
)
ACKED_TOMBSTONE = Stmt(
    "INSERT INTO owed_mentions (agent_id, message_id, channel_id, recorded_at_ms, acked_at_ms) "
    "VALUES (:agent_id, :message_id, :channel_id, :now, :now) ON CONFLICT (agent_id, message_id) DO NOTHING",
    name="acked_tombstone",
)
OWN_SEQS_ABOVE = Stmt(
    "SELECT channel_seq FROM messages WHERE author_account_id = :agent_id AND channel_id = :channel_id "
    "AND channel_seq > :after_seq ORDER BY channel_seq LIMIT :limit",
    name="own_seqs_above",
)
UPDATE_CURSOR = Stmt(
    "UPDATE agent_cursors SET acked_seq = :acked_seq, above_seqs = :above_seqs, acked_at_ms = :now "
    "WHERE agent_id = :agent_id AND channel_id = :channel_id",
    name="update_cursor",
)


#: How many of its own seqs above the mark one ack looks at; a longer self-authored run
#: is finished by the next ack.
OWN_RUN_LIMIT = 1024


def seed_cursor(tx: Tx, agent_id: str, channel_id: str) -> bool:
    """Seed (agent, channel) at the channel head if absent; True when a row was created."""
    return tx.rowcount(SEED_CURSOR, {"agent_id": agent_id, "channel_id": channel_id}) == 1


@dataclass(frozen=True, slots=True)
class Cursor:
    acked_seq: int
    above: tuple[int, ...]


def cursor(tx: Tx, agent_id: str, channel_id: str) -> Cursor | None:
    row = tx.one(CURSOR, {"agent_id": agent_id, "channel_id": channel_id})
    return None if row is None else Cursor(int(row[0]), tuple(json.loads(row[1]) if row[1] else ()))


def advance(acked_seq: int, above: set[int], own: set[int]) -> tuple[int, list[int]]:
    """The contiguous advance: step over acked and self-authored seqs, nothing else."""
    while acked_seq + 1 in above or acked_seq + 1 in own:
        acked_seq += 1
    return acked_seq, sorted(s for s in above if s > acked_seq)


@dataclass(frozen=True, slots=True)
class AckResult:
    channel_id: str
    channel_seq: int
    owed_cleared: bool
    cursor_moved: bool
    acked_seq: int | None
    above: tuple[int, ...]


def ack(tx: Tx, agent_id: str, message_id: str, now: int) -> AckResult | None:
    """Ack ``message_id`` for ``agent_id`` in ``tx``; None when the message is unknown or
    not the agent's to ack (not a member of its channel and never owed it).

    Order matters: the owed row is cleared first, so the clear commits with the
    transaction even when the cursor arm finds nothing to do (no cursor row in a channel
    outside the sweep set, or a duplicate ack at or below the mark). Outside the sweep set
    the ack also leaves a stamped row when nothing was owed yet (the agent acked before the
    mention pass committed), so that pass cannot owe it afterwards.
    """
    target = tx.one(ACK_TARGET, {"agent_id": agent_id, "message_id": message_id})
    if target is None:
        return None
    channel_id, seq, is_member, has_row = target[0], int(target[1]), bool(target[2]), bool(target[3])
    if not is_member and not has_row:
        return None
    keys = {"agent_id": agent_id, "message_id": message_id}
    cleared = has_row and tx.rowcount(ACK_OWED, {**keys, "now": now}) == 1
    if not has_row and tx.one(IN_SWEEP_SET, {"agent_id": agent_id, "channel_id": channel_id}) is None:
        tx.execute(ACKED_TOMBSTONE, {**keys, "channel_id": channel_id, "now": now})
    row = tx.one(CURSOR_FOR_UPDATE, {"agent_id": agent_id, "channel_id": channel_id})
    if row is None:
        return AckResult(channel_id, seq, cleared, False, None, ())
    acked_seq, above = int(row[0]), set(json.loads(row[1]) if row[1] else ())
    if seq <= acked_seq or seq in above:
        return AckResult(channel_id, seq, cleared, False, acked_seq, tuple(sorted(above)))
    above.add(seq)
    own = {
        r[0]
        for r in tx.all(
            OWN_SEQS_ABOVE,
            {"agent_id": agent_id, "channel_id": channel_id, "after_seq": acked_seq, "limit": OWN_RUN_LIMIT},
        )
    }
    new_acked, new_above = advance(acked_seq, above, own)
    tx.execute(
        UPDATE_CURSOR,
        {
            "agent_id": agent_id,
            "channel_id": channel_id,
            "acked_seq": new_acked,
            "above_seqs": json.dumps(new_above),
            "now": now,
        },
    )
    return AckResult(channel_id, seq, cleared, True, new_acked, tuple(new_above))
