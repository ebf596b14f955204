"""Sweeps: what a session is owed from the store, a page at a time.

A session's sweep runs in phases: its cursors first (every sweep-set channel from the
acked mark, skipping what it acked above the mark; a message that mentions the agent is a
steer), then the start's pins (``pins.py``), then its owed mentions, then its owed answers
(``asks.py``), then live.
Each ``sweep`` call does at most one page of each and asks for a refill when there may be
more or the queue is full, so a large backlog never blocks the consumer thread.

The sweeper is handed the consumer's connection (``Link``), its counters, the
live-session view (``live``), the pin and answer parts, and (cluster) the mentions steered
to each session, which its owed sweeps leave out (D123).
"""

from __future__ import annotations

import structlog

from ..counters import Counters
from ..hub.channels import public_message
from ..store import delivery as delivery_store
from ..store import owed as owed_store
from ..store import sweep as sweep_store
from ..store.sweep import ChannelAgent
from .asks import Answers
from .link import Link
from .options import ConsumerOptions
from .pins import Pins, offer_swept
from .recipient import catch_up_dispatch, recipient
from .routing import catch_up
from .sessions import (
    OFFER_CLOSED,
    OFFER_OK,
    PHASE_ANSWERS,
    PHASE_CURSOR,
    PHASE_LIVE,
    PHASE_OWED,
    PHASE_PINS,
    Dispatch,
    Session,
)

log = structlog.get_logger("tidings.delivery")


class Sweeper:
    """Cursor and owed sweeps of live sessions."""

    def __init__(
        self,
        *,
        link: Link,
        counters: Counters,
        live: dict[str, Session],
        options: ConsumerOptions,
        pins: Pins,
        answers: Answers,
        steered_here: dict[str, set[str]],
    ) -> None:
        self.link = link
        self.counters = counters
        self.live = live
        self.options = options
        self.pins = pins
        self.answers = answers
        self.steered_here = steered_here

    def sweep(self, session: Session) -> None:
        """One step of a session's sweep: a page of cursors, the start's pins
        (``pins.py``), a page of owed mentions, then the owed answers (``asks.py``)."""
        if self.live.get(session.agent_id) is not session or session.closed:
            return
        if session.phase == PHASE_CURSOR:
            if not self.cursor_page(session):
                session.want_refill()
                return
            session.phase = PHASE_PINS
        if session.phase == PHASE_PINS:
            if not self.pins.sweep_pins(session):
                session.want_refill()
                return
            session.phase = PHASE_OWED
        if session.phase == PHASE_OWED:
            if not self.owed_page(session):
                session.want_refill()
                return
            session.phase = PHASE_ANSWERS
        if session.phase == PHASE_ANSWERS:
            if not self.answers.sweep_answers(session):
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
        me: ChannelAgent | None = None
        with self.link.db.read() as tx:
            for cur in sweep_store.sweep_cursors(tx, agent_id):
                channel_id = cur.channel_id
                floor = max(cur.acked_seq, session.floors.get(channel_id, 0))
                session.floors[channel_id] = floor
                rows = delivery_store.channel_page_for(tx, agent_id, channel_id, floor, budget)
                for row in rows:
                    seq = row["channel_seq"]
                    if seq not in cur.above and row["deleted_at_ms"] is None:
                        if me is None:
                            me = recipient(tx, agent_id)
                        dispatch = catch_up_dispatch(row, me)
                        outcome = offer_swept(session, dispatch)
                        if outcome != OFFER_OK:
                            self.counters.incr("dispatch_refused")
                            return outcome == OFFER_CLOSED
                        self.counters.incr("steered" if dispatch.kind == "steer" else "delivered")
                    session.floors[channel_id] = seq
                budget -= len(rows)
                if budget <= 0:
                    return False
        return True

    def owed_page(self, session: Session) -> bool:
        """Steer up to one page of the agent's owed mentions; owed rows of deleted
        messages are cleared instead (they would be re-logged at every start). A row the
        cursor sweep of this session already dispatched (a sweep-set channel, above the
        cursor's acked seq, at or below the sweep's floor) is not steered twice (D54), nor,
        in a cluster, a mention already steered to this session (D123)."""
        after_channel, after_seq = session.owed_after
        page = self.options.sweep_page
        steered = self.steered_here.get(session.session_id, ())
        with self.link.db.read() as tx:
            rows = owed_store.owed_page(tx, session.agent_id, after_channel, after_seq, page)
            acked = {c.channel_id: c.acked_seq for c in sweep_store.sweep_cursors(tx, session.agent_id)} if rows else {}
        vanished: list[str] = []
        finished = len(rows) < page
        for row in rows:
            channel_id, seq = row["channel_id"], row["channel_seq"]
            if row["deleted_at_ms"] is not None:
                vanished.append(row["id"])
            elif row["id"] in steered:
                self.counters.incr("steer_deduped")  # (cluster) this session has it already
            elif channel_id in acked and acked[channel_id] < seq <= session.floors.get(channel_id, -1):
                self.counters.incr("steer_deduped")
            else:
                outcome = session.offer(Dispatch("steer", public_message(row), row["channel_id"], True))
                if outcome != OFFER_OK:
                    self.counters.incr("dispatch_refused")
                    finished = outcome == OFFER_CLOSED
                    break
                self.counters.incr("steered")
                if self.link.cluster is not None:
                    self.steered_here.setdefault(session.session_id, set()).add(row["id"])
            session.owed_after = (row["channel_id"], row["channel_seq"])
        if vanished:
            with self.link.strict_write() as tx:
                for message_id in vanished:
                    owed_store.clear_owed(tx, session.agent_id, message_id)
        return finished

    def owed_again(self, agent_ids: tuple[str, ...]) -> None:
        """Cluster: another node recorded owed mentions for these agents (D123). A live
        session here that its start sweep took past the owed phase steers the agent's owed
        rows again from the first, each mention at most once a session (``steered_here``);
        one still before or in that phase reads them from the first when it gets there.
        More than a page, or a full queue: the session catches up from the store."""
        for agent_id in agent_ids:
            session = self.live.get(agent_id)
            if session is None or session.closed:
                continue
            session.owed_after = ("", 0)
            if session.phase in (PHASE_CURSOR, PHASE_PINS, PHASE_OWED):
                continue
            try:
                if not self.owed_page(session):
                    catch_up(session)
            except Exception as exc:  # noqa: BLE001
                self.link.failed("owed sweep failed", exc, resweep=True, session_id=session.session_id)

    def sweep_all_live(self) -> None:
        """Put every live session through its sweep again (after an overrun)."""
        for session in list(self.live.values()):
            session.phase = PHASE_CURSOR
            session.owed_after = ("", 0)
            try:
                self.sweep(session)
            except Exception as exc:  # noqa: BLE001
                self.link.failed("sweep failed", exc, resweep=True, session_id=session.session_id)
