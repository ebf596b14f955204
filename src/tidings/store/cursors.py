"""Agent delivery cursors, keyed (agent, channel), over ``channel_seq``.

Only the seed lives here for now; the delivery engine owns the reads and the ack.
A seed rides the same transaction as the membership or policy change that makes a channel
a delivery target, starts at the channel head (no history replay), never resets an
existing cursor, and is a silent no-op for a non-agent account.
"""

from __future__ import annotations

from .engine import Tx
from .sql import Stmt

SEED_CURSOR = Stmt(
    "INSERT INTO agent_cursors (agent_id, channel_id, acked_seq, above_seqs) "
    "SELECT a.id, c.id, c.last_seq, '[]' FROM accounts a, channels c "
    "WHERE a.id = :agent_id AND a.kind = 'agent' AND c.id = :channel_id "
    "ON CONFLICT (agent_id, channel_id) DO NOTHING"
)


def seed_cursor(tx: Tx, agent_id: str, channel_id: str) -> bool:
    """Seed (agent, channel) at the channel head if absent; True when a row was created."""
    return tx.rowcount(SEED_CURSOR, {"agent_id": agent_id, "channel_id": channel_id}) == 1
