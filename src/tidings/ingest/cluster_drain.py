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


def claim_frame(tx: Tx, inbox_id: str, now: int) -> tuple[Any, ...] | None:
    """Take the frame's bridge lock inside ``tx``, then claim the frame (``claim_unprocessed``:
    loaded and marked applied in one statement); None when it is processed already. The
    claim comes after the lock, so a frame another node finished meanwhile is seen as gone."""
    row = inbox_store.load_unprocessed(tx, inbox_id)  # its bridge, to know which lock
    if row is None:
        return None
    inbox_store.lock_bridge_appends(tx, row[0])
    return inbox_store.claim_unprocessed(tx, inbox_id, now)
