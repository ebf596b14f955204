"""The delivery consumer's options (shared by the consumer and the parts it hands them to)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ConsumerOptions:
    scan_enabled: bool = True
    scan_interval_ms: int = 30_000
    scan_batch: int = 1000
    sweep_page: int = 256
    event_batch: int = 256
    # The consumer thread (not a synchronous ``pump()``) may hold a flush back this long
    # (wall time) for more events to share its commit; an edge, a scan, a full unit or
    # the end of the wait flushes at once, and ``wait_idle`` waits for the flush.
    flush_delay_ms: float = 5.0
    # Keep channel rosters between batches while the roster epoch holds (D108); None:
    # on PostgreSQL only, where the roster read is server work and a bigger statement.
    # On SQLite the read is cheap in-process work, and saving it made batches smaller
    # (more reader wake-ups per message) and fan-out slower (measured in D108).
    roster_cache: bool | None = None
    # Negative controls: each restores one reference flaw so a test can show it bites.
    owe_live_gap: bool = True
    settle_on_end: bool = True
    mark_on_route_failure: bool = False
