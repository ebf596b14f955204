"""Draining one inbox from several cluster nodes (PostgreSQL).

Every node's worker walks the unprocessed frames in receipt order. In a cluster, before a
drained frame is applied, its transaction takes the bridge's transaction-scoped advisory
lock (the same lock an append that applies on append takes) and then loads the frame
again: so frames of one bridge are applied by one node at a time, a frame another node
finished while this one waited is seen as gone (apply-once), and since each walker passes
the older frames first, receipt order per bridge holds. A node killed mid-drain holds the
lock only inside its open transaction, which dies with its connection: its frame stays
unprocessed and the next walk on any node applies it.
"""

from __future__ import annotations

from typing import Any

from ..store import inbox as inbox_store
from ..store.engine import Tx


def claim_frame(tx: Tx, inbox_id: str, row: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Take the frame's bridge lock inside ``tx``; the frame's row if still unprocessed."""
    inbox_store.lock_bridge_appends(tx, row[0])
    return inbox_store.load_unprocessed(tx, inbox_id)
