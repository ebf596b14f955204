"""The recovery scan (RIG-2490) and the periodic scan.

The scan routes every committed message whose mention pass never completed
(``mentions_routed_at`` NULL), through the same ``Router.route_mentions_for`` as the live
path. It runs at start, after a bus overrun, and every ``scan_interval_ms`` (the periodic
scan), so a NULL left by a failed pass does not wait for a restart. Every scan also
dispatches the owed answers a crash left undispatched (``asks.Answers``). In a cluster only
the leader scans, and it leaves rows younger than the dead-after interval to the node that
posted them.

The scanner is handed the consumer's connection (``Link``), its counters, the held message
ids (a held message belongs to its settle edge) and the shared ``Unit``; ``flush`` commits
the unit.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import structlog

from ..clock import Clock
from ..counters import Counters
from ..faults import Faults
from ..store import delivery as delivery_store
from ..store import sweep as sweep_store
from ..store.sweep import ChannelAgent
from .asks import Answers
from .link import Link
from .mentions import mention_handles
from .options import ConsumerOptions
from .routing import Router
from .sweeps import Sweeper
from .unit import Unit

log = structlog.get_logger("tidings.delivery")

#: Fault point: one scan batch read fails.
SCAN_READ_FAULT = "delivery.scan_read_error"


class Scanner:
    """The recovery and periodic scans; see the module docstring."""

    def __init__(
        self,
        *,
        link: Link,
        counters: Counters,
        faults: Faults,
        held_ids: set[str],
        unit: Unit,
        router: Router,
        sweeper: Sweeper,
        flush: Callable[[], int],
        options: ConsumerOptions,
        answers: Answers,
        clock: Clock,
    ) -> None:
        self.link = link
        self.counters = counters
        self.faults = faults
        self.held_ids = held_ids
        self.unit = unit
        self.router = router
        self.sweeper = sweeper
        self.flush = flush
        self.options = options
        self.answers = answers
        self.clock = clock

    def scan(self) -> int:
        """Route every committed message whose mention pass never completed. Returns how
        many messages it marked.

        Ascending global seq, in batches, with a floor that lives only in this call (never
        persisted: a row that commits late below it is simply found by the next scan).
        A message held right now is skipped (its settle edge owns it). A per-message failure
        leaves that message NULL and the scan goes on; a failed batch read ends this scan.
        Memory is one batch plus one member list per channel in that batch.
        """
        self.flush()  # the scan must see the marks of every pass already decided
        self.counters.incr("scans")
        floor = 0
        marked = 0
        skipped = 0
        batch = self.options.scan_batch
        while True:
            try:
                if self.faults.fire(SCAN_READ_FAULT):
                    raise RuntimeError("fault: delivery.scan_read_error")
                with self.link.db.read() as tx:
                    rows = delivery_store.unrouted_page(tx, floor, batch)
            except Exception as exc:  # noqa: BLE001 - the scan never crashes the consumer
                self.link.failed("recovery scan: batch read failed; this scan ends here", exc,
                                 counter="scan_failures", after_seq=floor)
                break
            members_of: dict[str, list[ChannelAgent]] = {}
            for row in rows:
                floor = row["seq"]
                message_id = row["id"]
                cluster = self.link.cluster
                if message_id in self.held_ids or (
                    cluster is not None and row["at_unix_ms"] > self.clock.now_ms() - cluster.scan_grace_ms()
                ):  # held here; or (cluster) young enough that the posting node routes it
                    skipped += 1
                    continue
                if row["deleted_at_ms"] is not None:
                    self.unit.mark(row)
                    continue
                # Most messages mention nobody: skip decoding their blocks at all.
                raw = row["blocks"]
                handles: list[str] = []
                if "@" in raw:
                    row["blocks"] = json.loads(raw)
                    handles = mention_handles(row["blocks"])
                members: list[ChannelAgent] = []
                if handles:
                    channel_id = row["channel_id"]
                    cached = members_of.get(channel_id)
                    if cached is None:
                        try:
                            with self.link.db.read() as tx:
                                cached = sweep_store.channel_agents(tx, channel_id)
                        except Exception as exc:  # noqa: BLE001 - this message stays NULL
                            self.link.failed("recovery scan: members not read", exc,
                                             counter="route_failures", message_id=message_id)
                            continue
                        members_of[channel_id] = cached
                    members = cached
                self.router.route_mentions_for(row, members, handles=handles)
            marked += self.flush()
            if len(rows) < batch:
                break
        self.counters.incr("scan_recovered", marked)
        self.scan_answers()
        if marked or skipped:
            log.info("recovery scan done", marked=marked, skipped_held=skipped)
        return marked

    def scan_answers(self) -> None:
        try:
            self.answers.scan_undispatched()
        except Exception as exc:  # noqa: BLE001 - the next scan tries again
            self.link.failed("recovery scan: answers not dispatched", exc, counter="scan_failures")

    def allowed(self) -> bool:
        """The recovery scan runs in one process, or on the cluster's leader only."""
        return self.options.scan_enabled and (self.link.cluster is None or bool(self.link.cluster.is_leader))

    def periodic(self) -> None:
        """The clock's recovery point: a NULL left by a failed pass does not wait for a
        restart or an overrun (the Zulip "hard disconnect" lesson)."""
        recovered = self.scan() if self.allowed() else 0
        if self.link.resweep_live or recovered:
            # A message the scan had to route is one whose event this consumer never
            # handled (a dropped publish, another process's post): its live subscribers
            # have not had it pushed either, and their cursor sweep is what pushes it.
            self.link.resweep_live = False
            self.sweeper.sweep_all_live()
