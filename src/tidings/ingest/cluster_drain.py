"""Draining one inbox from several cluster nodes (PostgreSQL).

Every node's worker walks the unprocessed frames in receipt order. In a cluster, before a
drained frame is applied, its transaction takes the bridge's transaction-scoped advisory
lock (the same lock an append that applies on append takes) and then claims the frame
(loads it and marks it applied in one statement): so frames of one bridge are applied by
one node at a time, a frame another node finished while this one waited is seen as gone
(apply-once), and since each walker passes the older frames first, receipt order per
bridge holds. A node killed mid-drain holds the lock only inside its open transaction,
which dies with its connection: its frame stays unprocessed and the next walk on any node
applies it.
"""

from __future__ import annotations

from typing import Any

from ..store import inbox as inbox_store
from ..store.engine import Tx


def claim_frame(tx: Tx, inbox_id: str, now_ms: int) -> tuple[Any, ...] | None:
    """Take the frame's bridge lock inside ``tx``, then claim the frame (load it and mark it
    applied, as a single node's drain does); None when it is gone. The lock comes BEFORE the
    claim: a claim first would hold the frame's row while another node applied a later
    frame of the same bridge, out of receipt order."""
    listed = inbox_store.load_unprocessed(tx, inbox_id)
    if listed is None:
        return None
    inbox_store.lock_bridge_appends(tx, listed[0])
    return inbox_store.claim_unprocessed(tx, inbox_id, now_ms)


def claim_frames(tx: Tx, inbox_ids: list[str], now_ms: int) -> dict[str, tuple[Any, ...]]:
    """``claim_frame`` for a drain group: the locks of the bridges of its frames still
    unprocessed, sorted, then every frame claimed in one statement (``inbox.claim_many``)."""
    for bridge_id in inbox_store.unprocessed_bridges(tx, inbox_ids):
        inbox_store.lock_bridge_appends(tx, bridge_id)
    return inbox_store.claim_many(tx, inbox_ids, now_ms)
