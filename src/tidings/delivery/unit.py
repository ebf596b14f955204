"""The durability unit (D16): the owed rows and routed marks the passes decided since the
last flush, written in one commit, and the wakes requested only after it. On a cluster
node the same statement notifies the owed rows' agents (D123).

A message is marked ``mentions_routed_at`` only when its pass ran AND this commit
succeeded; otherwise it stays NULL and the next recovery scan routes it again. On
PostgreSQL the flush runs in autocommit on a connection whose commits do not wait for the
WAL flush: a lost commit loses marks and owed rows together and leaves the messages NULL
for the scan, so it is safe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from ..clock import Clock
from ..counters import Counters
from ..faults import Faults
from ..store import owed as owed_store
from ..store.sweep import ChannelAgent
from .link import Link
from .wakers import WakeRequests

log = structlog.get_logger("tidings.delivery")

#: Fault point: one flush (owed rows + marks) fails.
FLUSH_FAULT = "delivery.flush_error"


@dataclass
class Unit:
    """Durable effects decided by the passes since the last flush, written in one commit."""

    marks: dict[str, int] = field(default_factory=dict)  # message id -> global seq
    owed: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    wakes: dict[str, tuple[str | None, str]] = field(default_factory=dict)

    def mark(self, row: dict[str, Any]) -> None:
        self.marks[row["id"]] = row["seq"]

    def owe(self, message_id: str, agent_id: str, channel_id: str) -> None:
        self.owed.setdefault(message_id, []).append((agent_id, channel_id))

    def wake(self, agent: ChannelAgent, reason: str) -> None:
        if reason == "mention" or agent.id not in self.wakes:
            self.wakes[agent.id] = (agent.wake_json, reason)

    def empty(self) -> bool:
        return not (self.marks or self.owed or self.wakes)

    def size(self) -> int:
        """How many messages the unit marks or owes for (the flush-when-full measure)."""
        return len(self.marks) + len(self.owed)

    def take(self) -> Unit:
        """Move everything decided so far into a new unit and start empty again."""
        taken = Unit(self.marks, self.owed, self.wakes)
        self.marks, self.owed, self.wakes = {}, {}, {}
        return taken


class Flusher:
    """Writes a taken ``Unit``: marks and owed rows in one commit, then the wakes."""

    def __init__(
        self,
        *,
        link: Link,
        clock: Clock,
        faults: Faults,
        counters: Counters,
        wakers: WakeRequests,
        on_owed_recorded: Callable[[], None],
    ) -> None:
        self.link = link
        self.clock = clock
        self.faults = faults
        self.counters = counters
        self.wakers = wakers
        self.on_owed_recorded = on_owed_recorded

    def flush(self, unit: Unit) -> int:
        """Commit the unit's owed rows and marks; returns the number of rows marked.

        If the batch fails, each message is retried alone so one bad message cannot keep
        the others unmarked; whatever still fails stays NULL for the next scan.
        """
        marked = 0
        try:
            marked = self._write(list(unit.marks.values()), unit.owed)
        except Exception as exc:  # noqa: BLE001
            ids = list(dict.fromkeys([*unit.marks, *unit.owed]))
            if len(ids) > 1:
                self.link.failed(None, exc, counter="flush_failures")
                for message_id in ids:
                    try:
                        marked += self._write(
                            [unit.marks[message_id]] if message_id in unit.marks else [],
                            {message_id: unit.owed.get(message_id, [])},
                        )
                    except Exception as one_exc:  # noqa: BLE001
                        self.link.failed("routing not committed; left for the recovery scan", one_exc,
                                         counter="flush_failures", message_id=message_id)
            else:
                self.link.failed("routing not committed; left for the recovery scan", exc,
                                 counter="flush_failures", message_ids=ids)
        for agent_id, (wake_json, reason) in unit.wakes.items():
            self.wakers.request(agent_id, wake_json, reason)
        return marked

    def _write(self, marks: list[int], owed: dict[str, list[tuple[str, str]]]) -> int:
        now = self.clock.now_ms()
        rows = [(agent_id, message_id, channel_id) for message_id, pairs in owed.items() for agent_id, channel_id in pairs]
        # One statement on PostgreSQL, in autocommit on a connection whose commits do not
        # wait for the WAL flush: safe, a lost commit loses marks and owed rows together
        # and leaves the messages NULL for the scan (D16).
        # A cluster node's owed rows go out with a hint naming their agents, from the same
        # statement, so the node holding an agent's session steers them (D123).
        cluster = self.link.cluster
        hints = cluster.owed_hints(sorted({r[0] for r in rows})) if cluster is not None and rows else None
        with self.link.db.autocommit_write() as tx:
            if self.faults.fire(FLUSH_FAULT):
                raise RuntimeError("fault: delivery.flush_error")
            recorded, marked = owed_store.record_and_mark(tx, rows, marks, now, hints)
        if recorded:
            self.counters.incr("owed_recorded", recorded)
            self.on_owed_recorded()
        return marked
