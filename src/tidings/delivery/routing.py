"""Routing: the author split, held messages, fan-out and the ONE mention pass.

``Router`` decides who gets a posted message. A human author's message (or one by an agent
with no live session) is re-read from the store and fanned out now; a live agent author's
message is held under its session and fanned out at the session's settle edge
(``fire_held``), re-read so a later ``PATCH`` counts. ``fan_out`` first runs
``route_mentions_for`` (shared with the recovery scan), then delivers to the sweep set minus
the author and minus every mentioned agent (a mentioned agent gets the steer only). A live
recipient gets a pushed dispatch; an offline one is woken (after the unit's flush).

The router is handed the consumer's connection (``Link``), its counters, the live-session
view (``live``: agent id -> session, changed only at edges) and the held messages, and it
records its durable decisions into the shared ``Unit``.

Cluster (``link.cluster`` set, PostgreSQL, several nodes; ``cluster/node.py``): a post
another node took arrives with its ``node_id`` and only dispatches to this node's sessions
(``fan_out_here_only``); a post whose author's session is on another node is held here
until that node announces the settle (``release_remote`` on ``AuthorSettled``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from .. import metrics
from ..cluster.events import RemotePosted
from ..counters import Counters
from ..faults import Faults
from ..hub.channels import public_message
from ..hub.events import MessagePosted
from ..store import delivery as delivery_store
from ..store.roster import RosterCache
from ..store.sweep import ChannelAgent
from .link import Link
from .mentions import mention_handles, resolve_mentioned
from .options import ConsumerOptions
from .sessions import OFFER_FULL, OFFER_OK, PHASE_CURSOR, Dispatch, Session, coalesced_wakes
from .unit import Unit

log = structlog.get_logger("tidings.delivery")

#: Fault points: one routing pass fails; one batched read of the live path fails (each
#: message is then read alone).
ROUTE_FAULT = "delivery.route_error"
BATCH_READ_FAULT = "delivery.batch_read_error"
#: ``held`` key prefix (cluster): messages held here for an author whose session is on
#: another node, released by that node's settle (``AuthorSettled``).
REMOTE_HOLD = "remote:"


@dataclass(frozen=True, slots=True)
class RouteOutcome:
    """What one mention pass decided: who was mentioned, and whether the pass ran."""

    mentioned: frozenset[str]
    ok: bool


@dataclass(slots=True)
class Reads:
    """One batched read: the rows of ``asked`` (absent = no such row) and the agent members
    of every channel those rows are in."""

    asked: frozenset[str]
    rows: dict[str, dict[str, Any]]
    members: dict[str, list[ChannelAgent]]


class Router:
    """Hold, fan out and route mentions; see the module docstring."""

    def __init__(
        self,
        *,
        link: Link,
        counters: Counters,
        faults: Faults,
        live: dict[str, Session],
        held: dict[str, list[str]],
        held_ids: set[str],
        unit: Unit,
        options: ConsumerOptions,
        steered_here: dict[str, set[str]],
        dialect: str,
    ) -> None:
        self.link = link
        self.counters = counters
        self.faults = faults
        self.live = live
        self.held = held
        self.held_ids = held_ids
        self.unit = unit
        self.options = options
        #: The rosters of channels fanned out to, kept while the roster epoch holds (D108).
        keep = options.roster_cache if options.roster_cache is not None else dialect == "postgresql"
        self.roster = RosterCache() if keep else None
        #: Cluster: session id -> every mention steered to it, live (``steer``) or by its
        #: owed sweep (shared with the sweeper): never steered twice (D123).
        self.steered_here = steered_here

    # -- bus events ------------------------------------------------------------------------
    def handle_posted(self, events: Iterable[MessagePosted]) -> None:
        """Handle posted messages in order, as if one by one, with ONE read for all of them.

        The author split is decided from ``live``, which changes only at edges and edges
        never run inside a batch, so which messages will fan out (rather than be held) is
        known up front: their rows and the agents of their channels are read together
        (``read_batch``), then each event is handled in order from that read. A message
        whose read is missing from it (the batched read failed) is read alone, as before.
        """
        events = list(events)
        fanning = [e for e in events if e.author_id not in self.live]
        reads = self.read_batch([e.message_id for e in fanning], [e.channel_id for e in fanning])
        for payload in events:
            try:
                with coalesced_wakes():
                    self.on_posted(payload, reads)
            except Exception as exc:  # noqa: BLE001 - never crash the consumer
                self.link.failed("posted message not processed; the recovery scan will route it", exc,
                                 counter="route_failures", resweep=True, message_id=payload.message_id)

    def on_posted(self, event: MessagePosted, reads: Reads | None = None) -> None:
        author_session = self.live.get(event.author_id)
        if author_session is not None:
            self.hold(author_session, event.message_id)
            return
        cluster = self.link.cluster
        if cluster is not None and cluster.remote_live(event.author_id):
            # Cluster: the author's session is on another node; that node settles it.
            self.hold_remote(event.author_id, event.message_id)
            return
        row, members = self.read_message(event.message_id, reads)
        if row is not None:
            if cluster is not None and isinstance(event, RemotePosted) and event.node_id:
                self.fan_out_here_only(row, members)  # another node posted it: it routes
            else:
                self.fan_out(row, members)

    def fan_out_here_only(self, row: dict[str, Any], members: list[ChannelAgent]) -> None:
        """Cluster: steer and deliver to this node's sessions only; the durable effects
        (owed rows, the mark, wakes) belong to the node that posted the message. A session
        whose owed sweep already steered the message is left out (no duplicate)."""
        unit, live = self.unit, self.live
        self.unit = Unit()
        swept = [sid for sid, ids in self.steered_here.items() if row["id"] in ids]
        if swept:
            self.live = {a: s for a, s in live.items() if s.session_id not in swept}
        try:
            self.fan_out(dict(row, mentions_routed_at=None), members)
        finally:
            self.unit, self.live = unit, live

    def hold_remote(self, author_id: str, message_id: str) -> None:
        self.held.setdefault(REMOTE_HOLD + author_id, []).append(message_id)
        self.held_ids.add(message_id)
        self.counters.incr("held")

    def release_remote(self, author_id: str) -> None:
        """Cluster: the author settled on its node (or its session is gone): fan out what
        was held here for it, in post order, to this node's sessions only."""
        ids = self.held.pop(REMOTE_HOLD + author_id, None)
        if not ids:
            return
        self.held_ids.difference_update(ids)
        reads = self.read_batch(ids)
        for message_id in ids:
            row, members = self.read_message(message_id, reads)
            if row is not None:
                self.counters.incr("settled")
                with coalesced_wakes():
                    self.fan_out_here_only(row, members)

    def hold(self, session: Session, message_id: str) -> None:
        self.held.setdefault(session.session_id, []).append(message_id)
        self.held_ids.add(message_id)
        self.counters.incr("held")
        log.debug("message held until its author settles", message_id=message_id, session_id=session.session_id)

    def fire_held(self, session_id: str, agent_id: str = "") -> None:
        """The settle edge: fan out the session's held messages in post order, re-read
        (a page of ``event_batch`` ids per batched read)."""
        ids = self.held.pop(session_id, None)
        if not ids:
            return
        if self.link.cluster is not None:  # the other nodes release what they held for this author
            self.link.cluster.notify_settled(agent_id)
        self.held_ids.difference_update(ids)  # none is held any more, whatever happens next
        page = max(1, self.options.event_batch)
        for start in range(0, len(ids), page):
            chunk = ids[start:start + page]
            reads = self.read_batch(chunk)
            for message_id in chunk:
                try:
                    row, members = self.read_message(message_id, reads)
                except Exception as exc:  # noqa: BLE001 - stays NULL; the scan routes it
                    self.link.failed("held message not re-read at settle", exc,
                                     counter="route_failures", resweep=True, message_id=message_id)
                    continue
                if row is not None:
                    self.counters.incr("settled")
                    with coalesced_wakes():
                        self.fan_out(row, members)

    # -- reads -----------------------------------------------------------------------------
    def read_batch(self, message_ids: list[str], channel_ids: list[str] | None = None) -> Reads | None:
        """The current rows of these messages and the agents of their channels: one
        statement when ``channel_ids`` (from the posted events) is given, else two; in
        autocommit on PostgreSQL (no BEGIN/ROLLBACK round trips; each statement sees what
        it would inside a READ COMMITTED transaction) and in one snapshot on SQLite. None
        when there is nothing to read or the read failed: the caller then reads each
        message alone."""
        if not message_ids:
            return None
        try:
            if self.faults.fire(BATCH_READ_FAULT):
                raise RuntimeError("fault: delivery.batch_read_error")
            with self.link.db.autocommit_read() as tx:
                rows, members = delivery_store.messages_with_agents(tx, message_ids, channel_ids, self.roster)
        except Exception as exc:  # noqa: BLE001 - each message is read alone instead
            self.link.failed("batched read failed; reading each message alone", exc,
                             level="warning", messages=len(message_ids))
            return None
        return Reads(frozenset(message_ids), rows, members)

    def read_message(
        self, message_id: str, reads: Reads | None = None
    ) -> tuple[dict[str, Any] | None, list[ChannelAgent]]:
        """The current row and its channel's agents: from ``reads`` when it covers the
        message, else read now."""
        if reads is not None and message_id in reads.asked:
            row = reads.rows.get(message_id)
            if row is None:
                return None, []
            members = reads.members.get(row["channel_id"])
            if members is not None:
                return row, members
        with self.link.db.autocommit_read() as tx:
            rows, members_of = delivery_store.messages_with_agents(tx, [message_id])
        row = rows.get(message_id)
        if row is None:
            return None, []
        return row, members_of.get(row["channel_id"], [])

    # -- fan-out and the mention pass ------------------------------------------------------
    def fan_out(self, row: dict[str, Any], members: list[ChannelAgent]) -> None:
        """Route mentions, then deliver to the sweep set minus author and mentioned."""
        if row.get("deleted_at_ms") is not None:
            self.unit.mark(row)
            return
        author = row["author_account_id"]
        message = public_message(row)
        handles = mention_handles(row["blocks"])
        if row.get("mentions_routed_at") is None:
            mentioned = self.route_mentions_for(row, members, message=message, handles=handles).mentioned
        else:  # the scan already ran this pass; keep steer-only precedence without re-steering
            mentioned = frozenset(a.id for a in resolve_mentioned(handles, members, author))
        for agent in members:
            if agent.id == author or not agent.in_sweep or agent.id in mentioned:
                continue
            session = self.live.get(agent.id)
            if session is None:
                self.unit.wake(agent, "message")
            else:
                self.deliver(session, message)

    def route_mentions_for(
        self,
        row: dict[str, Any],
        members: list[ChannelAgent] | tuple[()],
        *,
        message: dict[str, Any] | None = None,
        handles: list[str] | None = None,
    ) -> RouteOutcome:
        """The one mention pass, shared by the live path and the recovery scan.

        For each mentioned agent member (author excluded): outside the sweep set -> an owed
        row, live or not (its cursor will never carry the message, so the row is what
        survives a refused steer or a session that dies before acking; the ack clears it);
        then live -> steer; offline (or refused because the session is gone) -> wake. An
        offline agent inside the sweep set is woken only: its cursor carries the message.
        On success the message is queued for marking together with its owed rows; on
        failure nothing durable is queued and the message stays NULL for the next scan.
        """
        message_id = row["id"]
        if handles is None:
            handles = mention_handles(row["blocks"])
        targets = resolve_mentioned(handles, members, row["author_account_id"]) if handles else []
        mentioned = frozenset(a.id for a in targets)
        if self.faults.fire(ROUTE_FAULT):
            self.counters.incr("route_failures")
            log.warning("mention pass failed; left for the recovery scan", message_id=message_id)
            if self.options.mark_on_route_failure:
                self.unit.mark(row)
            return RouteOutcome(mentioned, False)
        if targets:
            if message is None:
                message = public_message(row)
            channel_id = row["channel_id"]
            for agent in targets:
                session = self.live.get(agent.id)
                if not agent.in_sweep and (session is None or self.options.owe_live_gap):
                    self.unit.owe(message_id, agent.id, channel_id)
                if session is not None and self.steer(session, message, in_sweep=agent.in_sweep):
                    continue
                if session is None or session.closed:
                    self.unit.wake(agent, "mention")
        self.unit.mark(row)
        return RouteOutcome(mentioned, True)

    # -- dispatch --------------------------------------------------------------------------
    def deliver(self, session: Session, message: dict[str, Any]) -> None:
        if session.phase == PHASE_CURSOR:
            # The session is catching up on its cursors: the sweep reads this message
            # from the store in order, so pushing it now would only overtake the sweep.
            self.counters.incr("deliver_deferred")
            return
        if message["seq"] <= session.floors.get(message["channel_id"], -1):
            # Already swept to this session (a post that committed just before its start
            # sweep read the channel and was published after the session started).
            self.counters.incr("deliver_deduped")
            return
        outcome = session.offer(Dispatch("deliver", message, message["channel_id"]))
        if outcome == OFFER_OK:
            self.counters.incr("delivered")
            metrics.dispatched(message)
            note_sent(session, message)
        else:
            self.refused(session, outcome, message)

    def steer(self, session: Session, message: dict[str, Any], *, in_sweep: bool = False) -> bool:
        if in_sweep:
            # The cursor sweep carries this message and steers it in order (D54): while it
            # catches up, or once it has passed this seq, a live push would be a duplicate.
            if session.phase == PHASE_CURSOR:
                self.counters.incr("steer_deferred")
                return True
            if message["seq"] <= session.floors.get(message["channel_id"], -1):
                self.counters.incr("steer_deduped")
                return True
        outcome = session.offer(Dispatch("steer", message, message["channel_id"], True))
        if outcome == OFFER_OK:
            self.counters.incr("steered")
            metrics.dispatched(message)
            note_sent(session, message)
            if self.link.cluster is not None:
                self.steered_here.setdefault(session.session_id, set()).add(message["id"])
            return True
        self.refused(session, outcome, message)
        return False

    def refused(self, session: Session, outcome: str, message: dict[str, Any]) -> None:
        self.counters.incr("dispatch_refused")
        log.info(
            "dispatch refused",
            session_id=session.session_id,
            agent_id=session.agent_id,
            message_id=message["id"],
            outcome=outcome,
        )
        if outcome == OFFER_FULL:
            catch_up(session)


def note_sent(session: Session, message: dict[str, Any]) -> None:
    """Advance the session's sweep floor when a live push is the next seq in line."""
    channel_id = message["channel_id"]
    floor = session.floors.get(channel_id)
    if floor is not None and message["seq"] == floor + 1:
        session.floors[channel_id] = floor + 1


def catch_up(session: Session) -> None:
    """A full queue: sweep the session again (cursors, then owed) once it drains."""
    if session.phase != PHASE_CURSOR:
        session.phase = PHASE_CURSOR
        session.owed_after = ("", 0)
    session.want_refill()
