"""Per-bridge ingest counters (docs/api.md §8.1: ``ingest.per_bridge.<bridge_id>``).

In memory, reset on restart, like the reference's. ``deferred`` counts attempts that
exhausted their transient retries, not frames currently waiting (that is the status's
``deferred_now``).
"""

from __future__ import annotations

import threading

from ..counters import Counters

INGEST_COUNTERS = (
    "appended",            # a frame was newly committed to the inbox
    "deduped",             # a frame repeated a (bridge, dedupe_key) already stored
    "stale_replays",       # ... and its payload differed from the stored one (ignored)
    "decoded_events",      # events produced by successful decodes (retries count again)
    "projected",           # frames whose projection committed (applied)
    "applied_on_append",   # ... of which (or quarantined) in their own append transaction
    "left_for_worker",     # apply on append failed transiently, or broke its transaction: the drain takes the frame
    "imported",            # message events after the first in one frame
    "messages_written",    # message rows inserted or changed
    "conversations_written",  # conversation rows inserted or changed
    "identities_written",  # identity rows inserted or changed
    "roster_changes",      # roster rows inserted, updated or deleted
    "quarantined",         # frames set aside with a cause (deterministic failure)
    "deferred",            # attempts that exhausted the in-attempt transient retries
    "transient_retries",   # in-attempt retries after a transient database error
    "reactions_applied",
    "reactions_removed",
    "reactions_orphaned",
    "mutations",           # edits and deletes that hit a stored message
    "mutations_orphaned",  # edits and deletes of a message we do not have
    "receipts_self",       # self read receipts that moved a read cursor
    "receipts_dropped",    # receipts that moved nothing
    "links_posted",        # linked-conversation messages posted into a channel
)


class BridgeCounters:
    """One ``Counters`` per bridge, created on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_bridge: dict[str, Counters] = {}

    def of(self, bridge_id: str) -> Counters:
        with self._lock:
            c = self._by_bridge.get(bridge_id)
            if c is None:
                c = self._by_bridge[bridge_id] = Counters(INGEST_COUNTERS)
            return c

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            items = list(self._by_bridge.items())
        return {bridge_id: c.snapshot() for bridge_id, c in items}
