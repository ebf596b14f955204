"""Sweeps: what a session is owed from the store, a page at a time.

A session's sweep runs in phases: its cursors first (every sweep-set channel from the
acked mark, skipping what it acked above the mark), then its owed mentions, then live.
Each ``sweep`` call does at most one page of each and asks for a refill when there may be
more or the queue is full, so a large backlog never blocks the consumer thread.

The sweeper is handed the consumer's connection (``Link``), its counters and the
live-session view (``live``).
"""

from __future__ import annotations

import structlog

from ..counters import Counters
from ..hub.channels import public_message
from ..store import delivery as delivery_store
from ..store import owed as owed_store
from ..store import sweep as sweep_store
from .link import Link
from .options import ConsumerOptions
from .sessions import OFFER_CLOSED, OFFER_OK, PHASE_CURSOR, PHASE_LIVE, PHASE_OWED, Dispatch, Session

log = structlog.get_logger("tidings.delivery")


class Sweeper:
    """Cursor and owed sweeps of live sessions."""

    def __init__(self, *, link: Link, counters: Counters, live: dict[str, Session], options: ConsumerOptions) -> None:
        self.link = link
        self.counters = counters
        self.live = live
        self.options = options

    def sweep(self, session: Session) -> None:
        """One step of a session's sweep: a page of cursors, then a page of owed mentions."""
        if self.live.get(session.agent_id) is not session or session.closed:
            return
        if session.phase == PHASE_CURSOR:
            if not self.cursor_page(session):
                session.want_refill()
                return
            session.phase = PHASE_OWED
        if session.phase == PHASE_OWED:
            if not self.owed_page(session):
                session.want_refill()
                return
            session.phase = PHASE_LIVE

    def cursor_page(self, session: Session) -> bool:
        """Deliver up to one page of what the agent's cursors say is undelivered.

        True when the sweep reached the head of every sweep-set channel (or the session is
        gone); False when there may be more, or the queue is full.
        """
        agent_id = session.agent_id
        budget = self.options.sweep_page
        with self.link.db.read() as tx:
            for cur in sweep_store.sweep_cursors(tx, agent_id):
                channel_id = cur.channel_id
                floor = max(cur.acked_seq, session.floors.get(channel_id, 0))
                session.floors[channel_id] = floor
                rows = delivery_store.channel_page_for(tx, agent_id, channel_id, floor, budget)
                for row in rows:
                    seq = row["channel_seq"]
                    if seq not in cur.above and row["deleted_at_ms"] is None:
                        outcome = session.offer(Dispatch("deliver", public_message(row), channel_id))
                        if outcome != OFFER_OK:
                            self.counters.incr("dispatch_refused")
                            return outcome == OFFER_CLOSED
                        self.counters.incr("delivered")
                    session.floors[channel_id] = seq
                budget -= len(rows)
                if budget <= 0:
                    return False
        return True

    def owed_page(self, session: Session) -> bool:
        """Steer up to one page of the agent's owed mentions; owed rows of deleted
        messages are cleared instead (they would be re-logged at every start)."""
        after_channel, after_seq = session.owed_after
        page = self.options.sweep_page
        with self.link.db.read() as tx:
            rows = owed_store.owed_page(tx, session.agent_id, after_channel, after_seq, page)
        vanished: list[str] = []
        finished = len(rows) < page
        for row in rows:
            if row["deleted_at_ms"] is None:
                outcome = session.offer(Dispatch("steer", public_message(row), row["channel_id"]))
                if outcome != OFFER_OK:
                    self.counters.incr("dispatch_refused")
                    finished = outcome == OFFER_CLOSED
                    break
                self.counters.incr("steered")
            else:
                vanished.append(row["id"])
            session.owed_after = (row["channel_id"], row["channel_seq"])
        if vanished:
            with self.link.strict_write() as tx:
                for message_id in vanished:
                    owed_store.clear_owed(tx, session.agent_id, message_id)
        return finished

    def sweep_all_live(self) -> None:
        """Put every live session through its sweep again (after an overrun)."""
        for session in list(self.live.values()):
            session.phase = PHASE_CURSOR
            session.owed_after = ("", 0)
            try:
                self.sweep(session)
            except Exception as exc:  # noqa: BLE001
                self.link.failed("sweep failed", exc, resweep=True, session_id=session.session_id)
