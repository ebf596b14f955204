"""The delivery consumer: one thread turns bus events and session edges into dispatches.

Everything that decides who gets what runs here, on one thread, in one order: bus events
(``MessagePosted``; everything else is ignored) and session edges (start, end, state,
refill). A test drives the same object synchronously: ``pump()`` processes everything
pending right now and returns; the thread is a thin loop that calls ``pump()`` and then
waits for the next event, edge or timer.

The author decides the path of a posted message:

* human author (or an agent with no live session): re-read the row from the store and
  ``fan_out`` now;
* agent author with a live session: *hold* the id under that session, in post order, and
  ``fan_out`` each held message at the session's settle edge (state ``ready``/``stopped``,
  or the session's end), re-read from the store so a later ``PATCH`` counts.

``fan_out`` first runs ``route_mentions_for`` (the ONE mention pass, shared with the
recovery scan), then delivers to the sweep set minus the author and minus every mentioned
agent (a mentioned agent gets the steer only). A live recipient gets a pushed dispatch; an
offline one is woken.

Durability: the owed rows a pass decides and the ``mentions_routed_at`` marks are written
together, in one transaction per batch of handled events (``_flush``), and the wakes are
requested only after that commit (durable first, then wake). A message is marked only when
its pass ran AND that commit succeeded; otherwise it stays NULL and the next recovery scan
(at start, after an overrun, every ``scan_interval_ms``) routes it again.

Cost per batch (the bus events one ``pump`` drains, up to ``event_batch``): the rows of
every message that fans out and the agents of their channels are read together (two
statements, whatever the batch size), each event is then handled in order from that read,
and the flush is one statement. On PostgreSQL the consumer's own connection reads and
flushes in autocommit (no BEGIN/COMMIT/ROLLBACK round trips) and its session commits
without waiting for the WAL flush, which only the flush relies on (D16): every other write
on it (session rows, stale sessions, owed rows of deleted messages) puts the server's
default back for its transaction (``_strict_write``). A reader's wake-up is one
``call_soon_threadsafe`` per event loop per message (``sessions.coalesced_wakes``).
The consumer thread may hold a flush back for ``flush_delay_ms`` (wall time) so that
events arriving close together share one commit; the routing decided so far is always
flushed before an edge and before a scan, and ``wait_idle`` waits for the flush (the
published progress covers only flushed events). Steers and delivers are queued when each
event is handled, never held back.

Fixed reference flaws (spec §4.6, README differences), each with its test:

* O1 -- a mention of an agent outside its sweep set is recorded as owed whether the agent
  is live or not, and only its ack clears it. So a refused steer (queue full, session
  gone), or one the agent never got to act on before its session died, is steered again
  at the next start (or in the session's catch-up); the reference dropped all three.
  ``owe_live_gap=False`` restores the flaw (owed rows for offline agents only).
* O2 / difference 3 -- a session's end is a settle edge, so messages held by an author
  whose stream died fire at once; after a restart nothing is held and the start scan owns
  them. ``settle_on_end=False`` restores the flaw.
* O3 -- liveness is the session registry itself: a session is live exactly while its SSE
  stream is open, so a woken agent that connects is always swept.
* O4 / difference 2 -- a failed pass leaves the message NULL; ``mark_on_route_failure=True``
  restores the reference's "mark anyway".
* O5 / difference 4 -- wakes run on the waker's own threads (``wakers.WakeDispatcher``).

Why the reference's "re-check liveness after recording the owed row" is not needed here:
liveness, as this thread sees it, changes only when this thread processes a start edge,
and a start edge runs the owed sweep from the store after every earlier flush. A session
that connects while a mention is being routed therefore either is live before the pass
(steer) or starts after the owed row committed (its owed sweep steers it); it cannot fall
between the two.

Cluster (``self.cluster`` set, PostgreSQL, several nodes; ``cluster/node.py``): a post
another node took arrives as ``RemotePosted`` and only dispatches to this node's sessions
(``_fan_out_here_only``); a post whose author's session is on another node is held here
until that node announces the settle (``AuthorSettled``); only the leader scans, and it
leaves rows younger than the dead-after interval to the node that posted them.

Ordering: an edge remembers the bus head when it was submitted, and the consumer handles
every bus event up to that head before the edge. So a ``ready`` sent after an agent's post
returned always finds that post held, and a session's start sweep runs before any live
dispatch to it. Live delivers queue behind the sweep on the session's queue; while a
session is catching up on its cursors, live delivers to it are left to the sweep (which
reads them from the store in order) instead of overtaking it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import structlog

from .. import metrics
from ..bus import Bus, Stamped, Subscription
from ..clock import Clock
from ..cluster.events import AuthorSettled
from ..counters import Counters
from ..faults import Faults
from ..hub.channels import public_message
from ..hub.events import AskAnswered, MessagePosted, PinsChanged
from ..store import accounts as accounts_store
from ..store import cursors as cursors_store
from ..store import delivery as delivery_store
from ..store.delivery import ChannelAgent
from ..store.engine import Dedicated, Store
from . import asks as answer_delivery
from . import pins as pin_sweep
from .mentions import mention_handles, mentions_agent, resolve_mentioned
from .sessions import (
    OFFER_CLOSED,
    OFFER_FULL,
    OFFER_OK,
    PHASE_ANSWERS,
    PHASE_CURSOR,
    PHASE_LIVE,
    PHASE_OWED,
    PHASE_PINS,
    Dispatch,
    Session,
    coalesced_wakes,
)
from .wakers import WakeDispatcher

log = structlog.get_logger("tidings.delivery")

#: Fault points (tests and demos): one routing pass fails; one scan batch read fails;
#: one flush (owed rows + marks) fails; one batched read of the live path fails (each
#: message is then read alone).
ROUTE_FAULT = "delivery.route_error"
SCAN_READ_FAULT = "delivery.scan_read_error"
FLUSH_FAULT = "delivery.flush_error"
BATCH_READ_FAULT = "delivery.batch_read_error"

#: ``_next_event`` found the subscription overrun: the caller handles what it collected,
#: then the overrun.
_OVERRUN = object()

SETTLE_STATES = frozenset({"ready", "stopped"})
#: ``held`` key prefix (cluster): messages held here for an author whose session is on
#: another node, released by that node's settle (``AuthorSettled``).
REMOTE_HOLD = "remote:"


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
    # Negative controls: each restores one reference flaw so a test can show it bites.
    owe_live_gap: bool = True
    settle_on_end: bool = True
    mark_on_route_failure: bool = False


@dataclass(frozen=True, slots=True)
class RouteOutcome:
    """What one mention pass decided: who was mentioned, and whether the pass ran."""

    mentioned: frozenset[str]
    ok: bool


@dataclass(slots=True)
class Edge:
    kind: str  # "start" | "end" | "state" | "refill"
    session: Session
    arg: Any
    bus_seq: int


@dataclass
class _Unit:
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


@dataclass(slots=True)
class _Reads:
    """One batched read: the rows of ``asked`` (absent = no such row) and the agent members
    of every channel those rows are in."""

    asked: frozenset[str]
    rows: dict[str, dict[str, Any]]
    members: dict[str, list[ChannelAgent]]


class Consumer:
    """The single-threaded core of delivery; see the module docstring."""

    def __init__(
        self,
        *,
        store: Store,
        bus: Bus,
        clock: Clock,
        faults: Faults,
        counters: Counters,
        wakers: WakeDispatcher,
        options: ConsumerOptions,
    ) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        self.faults = faults
        self.counters = counters
        self.wakers = wakers
        self.options = options
        # Consumer-thread state.
        self.live: dict[str, Session] = {}
        self.held: dict[str, list[str]] = {}
        self.held_ids: set[str] = set()
        self._events: deque[Stamped] = deque()
        self._sub: Subscription | None = None
        self._db: Dedicated | None = None
        self._unit = _Unit()
        self._handled_seq = 0
        self._durable_seq = 0  # every event up to it handled AND its effects flushed
        self._pending_since: float | None = None  # monotonic time the unit got its first item
        self._edges_finished = 0
        self._next_scan_at: int | None = None
        self._resweep_live = False
        self._bus_closed = False
        self._extra_work = 0
        # Shared with other threads.
        self._edges: deque[Edge] = deque()
        self._edges_lock = threading.Lock()
        self._submitted = 0
        self._cond = threading.Condition()
        self.processed_seq = 0
        self.edges_done = 0
        self.opened = False
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poke: asyncio.Event | None = None
        #: Test hook: called after each flush that recorded owed rows (O-9 race test).
        self.after_owed_recorded: Callable[[], None] | None = None
        #: Cluster (PostgreSQL, several nodes): set by ``cluster.ClusterNode``; None = one process.
        self.cluster: Any = None
        self._owed_steered: dict[str, set[str]] = {}  # cluster: session id -> owed ids it swept

    # ======================================================================================
    # Edges from other threads
    # ======================================================================================
    def submit(self, kind: str, session: Session, arg: Any = None) -> None:
        """Queue a session edge; thread-safe, never blocks."""
        edge = Edge(kind, session, arg, self.bus.head_seq)
        with self._edges_lock:
            self._edges.append(edge)
            self._submitted += 1
        self.wake_loop()

    def wake_loop(self) -> None:
        """Wake the consumer thread's wait (thread-safe; a no-op in synchronous mode)."""
        loop, poke = self._loop, self._poke
        if loop is not None and poke is not None:
            try:
                loop.call_soon_threadsafe(poke.set)
            except RuntimeError:  # the loop already finished
                pass

    def _peek_edge(self) -> Edge | None:
        with self._edges_lock:
            return self._edges[0] if self._edges else None

    def _pop_edge(self) -> None:
        with self._edges_lock:
            self._edges.popleft()

    # ======================================================================================
    # Lifecycle
    # ======================================================================================
    def open(self) -> None:
        """Subscribe, close sessions a crashed process left open, run the start scan, then
        queue the replay (handled by ``pump`` before any live event)."""
        if self.opened:
            return
        self._db = self.store.dedicated(pg_settings=delivery_store.CONSUMER_PG_SETTINGS)
        self._sub = self.bus.subscribe(0)
        try:
            if self.cluster is None:  # in a cluster the leader ends a dead node's sessions
                with self._strict_write() as tx:
                    delivery_store.end_stale_sessions(tx, self.clock.now_ms())
        except Exception as exc:  # noqa: BLE001 - bookkeeping only
            log.warning("could not close stale session rows", error=repr(exc))
            self._recover_db()
        if self._scan_allowed():
            self.scan()
        self._events.extend(self._sub.replay)
        self._sub.replay = []
        if self.options.scan_interval_ms > 0:
            self._next_scan_at = self.clock.now_ms() + self.options.scan_interval_ms
        self.opened = True
        self._publish_progress()

    def close(self) -> None:
        try:
            self._flush()
        finally:
            if self._sub is not None:
                self._sub.cancel()
            if self._db is not None:
                self._db.close()
                self._db = None

    def request_stop(self) -> None:
        self._stopping = True
        self.wake_loop()

    # ======================================================================================
    # The pump: everything pending, now, in order
    # ======================================================================================
    def pump(self, *, defer_flush: bool = False) -> int:
        """Process every pending event and edge (and a due periodic scan); return how much
        work was done. Never blocks waiting for more.

        The routing decided for the events is flushed before every edge and every scan
        (a start's owed sweep and the scan read what the passes before them decided) and
        at the end; with ``defer_flush`` (the consumer thread) the end flush waits until
        ``_flush_due``, so events arriving close together share one commit.
        """
        if not self.opened:
            self.open()
        total = 0
        while True:
            progressed = 0
            edge = self._peek_edge()
            handled, exhausted = self._drain_events(None if edge is None else edge.bus_seq)
            progressed += handled
            if edge is not None and exhausted:
                self._pop_edge()
                self._flush()
                self._process_edge(edge)
                self._flush()
                self._edges_finished += 1
                progressed += 1
            if self._scan_due():
                self._periodic()
                progressed += 1
            if not defer_flush or self._flush_due():
                self._flush()
            self._publish_progress()
            total += progressed
            if not progressed:
                return total

    def _flush_due(self) -> bool:
        unit = self._unit
        if unit.empty():
            return False
        if len(unit.marks) + len(unit.owed) >= self.options.event_batch:
            return True
        since = self._pending_since
        return since is None or (time.monotonic() - since) * 1000.0 >= self.options.flush_delay_ms

    def _flush_wait_s(self) -> float | None:
        """Seconds until a held-back flush is due (None: nothing held back)."""
        if self._unit.empty() or self._pending_since is None:
            return None
        due = self._pending_since + self.options.flush_delay_ms / 1000.0
        return max(0.0, due - time.monotonic())

    def _drain_events(self, upto: int | None) -> tuple[int, bool]:
        """Handle up to one batch of bus events with seq <= ``upto``; (work, exhausted).

        The events are taken first and then handled together (``_handle_batch``: one read
        for all their rows). An overrun found while taking them ends the batch: what was
        taken is handled first, then the overrun, then the batch goes on from the fresh
        subscription, the same order as handling the events one by one.
        """
        handled = 0
        exhausted = False
        self._extra_work = 0
        while True:
            batch: list[Stamped] = []
            overrun = False
            while handled + len(batch) < self.options.event_batch:
                event = self._next_event()
                if event is _OVERRUN:
                    overrun = True
                    break
                if event is None:
                    exhausted = True
                    break
                assert isinstance(event, Stamped)
                if upto is not None and event.seq > upto:
                    self._events.appendleft(event)
                    exhausted = True
                    break
                batch.append(event)
            self._handle_batch(batch)
            handled += len(batch)
            if not overrun:
                break
            self._handle_overrun()
            self._extra_work += 1
        if self._pending_since is None and not self._unit.empty():
            self._pending_since = time.monotonic()
        return handled + self._extra_work, exhausted

    def _next_event(self) -> object:
        if self._events:
            return self._events.popleft()
        sub = self._sub
        if sub is None or self._bus_closed:
            return None
        event = sub.get_nowait()
        if event is not None:
            return event
        if sub.closed:
            event = sub.get_nowait()  # anything buffered before the close comes first
            if event is not None:
                return event
            if not sub.lagged:
                self._bus_closed = True
                return None
            return _OVERRUN  # the caller handles it, then takes the events published since
        return None

    def handle(self, event: Stamped) -> None:
        """Handle one bus event (public for tests; ``pump`` is the normal entry)."""
        self._handle_batch([event])
        self._flush()
        self._publish_progress()

    def _handle_batch(self, events: list[Stamped]) -> None:
        """Handle bus events in order, as if one by one, with ONE read for all of them.

        The author split is decided from ``live``, which changes only at edges and edges
        never run inside a batch, so which messages will fan out (rather than be held) is
        known up front: their rows and the agents of their channels are read together
        (``_read_batch``), then each event is handled in order from that read. A message
        whose read is missing from it (the batched read failed) is read alone, as before.
        """
        wanted = [
            e.payload.message_id
            for e in events
            if isinstance(e.payload, MessagePosted) and e.payload.author_id not in self.live
        ]
        reads = self._read_batch(wanted)
        for event in events:
            payload = event.payload
            if isinstance(payload, AuthorSettled):
                self._release_remote(payload.agent_id)
            elif isinstance(payload, MessagePosted):
                try:
                    with coalesced_wakes():
                        self._on_posted(payload, reads)
                except Exception as exc:  # noqa: BLE001 - never crash the consumer
                    self.counters.incr("route_failures")
                    self._resweep_live = True
                    log.error(
                        "posted message not processed; the recovery scan will route it",
                        message_id=payload.message_id,
                        error=repr(exc),
                    )
                    self._recover_db()
            elif isinstance(payload, (PinsChanged, AskAnswered)):
                self._on_pin_or_answer(payload)
            if event.seq > self._handled_seq:
                self._handled_seq = event.seq

    def _on_pin_or_answer(self, payload: PinsChanged | AskAnswered) -> None:
        """A pin change (live ``pin`` notices) or an answered ask (the asker's answer)."""
        try:
            if isinstance(payload, PinsChanged):
                pin_sweep.on_pins_changed(self, payload)
            else:
                answer_delivery.on_answered(self, payload)
        except Exception as exc:  # noqa: BLE001 - the recovery scan dispatches answers
            log.error("pin or answer event not processed", event=repr(payload), error=repr(exc))
            self._recover_db()

    # ======================================================================================
    # Posted messages: the author split, hold, fan-out, the mention pass
    # ======================================================================================
    def _on_posted(self, event: MessagePosted, reads: _Reads | None = None) -> None:
        author_session = self.live.get(event.author_id)
        if author_session is not None:
            self._hold(author_session, event.message_id)
            return
        if self.cluster is not None and self.cluster.remote_live(event.author_id):
            # Cluster: the author's session is on another node; that node settles it.
            self._hold_remote(event.author_id, event.message_id)
            return
        row, members = self._read_message(event.message_id, reads)
        if row is not None:
            if self.cluster is not None and getattr(event, "node_id", ""):
                self._fan_out_here_only(row, members)  # another node posted it: it routes
            else:
                self._fan_out(row, members)

    def _fan_out_here_only(self, row: dict[str, Any], members: list[ChannelAgent]) -> None:
        """Cluster: steer and deliver to this node's sessions only; the durable effects
        (owed rows, the mark, wakes) belong to the node that posted the message. A session
        whose owed sweep already steered the message is left out (no duplicate)."""
        unit, live = self._unit, self.live
        self._unit = _Unit()
        swept = [sid for sid, ids in self._owed_steered.items() if row["id"] in ids]
        if swept:
            self.live = {a: s for a, s in live.items() if s.session_id not in swept}
        try:
            self._fan_out(dict(row, mentions_routed_at=None), members)
        finally:
            self._unit, self.live = unit, live

    def _hold_remote(self, author_id: str, message_id: str) -> None:
        self.held.setdefault(REMOTE_HOLD + author_id, []).append(message_id)
        self.held_ids.add(message_id)
        self.counters.incr("held")

    def _release_remote(self, author_id: str) -> None:
        """Cluster: the author settled on its node (or its session is gone): fan out what
        was held here for it, in post order, to this node's sessions only."""
        ids = self.held.pop(REMOTE_HOLD + author_id, None)
        if not ids:
            return
        self.held_ids.difference_update(ids)
        reads = self._read_batch(ids)
        for message_id in ids:
            row, members = self._read_message(message_id, reads)
            if row is not None:
                self.counters.incr("settled")
                with coalesced_wakes():
                    self._fan_out_here_only(row, members)

    def _hold(self, session: Session, message_id: str) -> None:
        self.held.setdefault(session.session_id, []).append(message_id)
        self.held_ids.add(message_id)
        self.counters.incr("held")
        log.debug("message held until its author settles", message_id=message_id, session_id=session.session_id)

    def _read_batch(self, message_ids: list[str]) -> _Reads | None:
        """The current rows of these messages and the agents of their channels: two
        statements, in autocommit on PostgreSQL (no BEGIN/ROLLBACK round trips; each
        statement sees what it would inside a READ COMMITTED transaction) and in one
        snapshot on SQLite. None when there is nothing to read or the read failed: the
        caller then reads each message alone."""
        if not message_ids:
            return None
        assert self._db is not None
        try:
            if self.faults.fire(BATCH_READ_FAULT):
                raise RuntimeError("fault: delivery.batch_read_error")
            with self._db.autocommit_read() as tx:
                rows, members = delivery_store.messages_with_agents(tx, message_ids)
        except Exception as exc:  # noqa: BLE001 - each message is read alone instead
            log.warning("batched read failed; reading each message alone", messages=len(message_ids),
                        error=repr(exc))
            self._recover_db()
            return None
        return _Reads(frozenset(message_ids), rows, members)

    def _read_message(
        self, message_id: str, reads: _Reads | None = None
    ) -> tuple[dict[str, Any] | None, list[ChannelAgent]]:
        """The current row and its channel's agents: from ``reads`` when it covers the
        message, else read now."""
        assert self._db is not None
        if reads is not None and message_id in reads.asked:
            row = reads.rows.get(message_id)
            if row is None:
                return None, []
            members = reads.members.get(row["channel_id"])
            if members is not None:
                return row, members
        with self._db.autocommit_read() as tx:
            rows, members = delivery_store.messages_with_agents(tx, [message_id])
        row = rows.get(message_id)
        if row is None:
            return None, []
        return row, members.get(row["channel_id"], [])

    def _fan_out(self, row: dict[str, Any], members: list[ChannelAgent]) -> None:
        """Route mentions, then deliver to the sweep set minus author and mentioned."""
        message_id = row["id"]
        if row.get("deleted_at_ms") is not None:
            self._unit.mark(row)
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
                self._unit.wake(agent, "message")
            else:
                self._deliver(session, message)

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
                self._unit.mark(row)
            return RouteOutcome(mentioned, False)
        if targets:
            if message is None:
                message = public_message(row)
            channel_id = row["channel_id"]
            for agent in targets:
                session = self.live.get(agent.id)
                if not agent.in_sweep and (session is None or self.options.owe_live_gap):
                    self._unit.owe(message_id, agent.id, channel_id)
                if session is not None and self._steer(session, message, in_sweep=agent.in_sweep):
                    continue
                if session is None or session.closed:
                    self._unit.wake(agent, "mention")
        self._unit.mark(row)
        return RouteOutcome(mentioned, True)

    # ======================================================================================
    # Dispatch
    # ======================================================================================
    def _deliver(self, session: Session, message: dict[str, Any]) -> None:
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
            self._note_sent(session, message)
        else:
            self._refused(session, outcome, message)

    def _steer(self, session: Session, message: dict[str, Any], *, in_sweep: bool = False) -> bool:
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
            self._note_sent(session, message)
            return True
        self._refused(session, outcome, message)
        return False

    @staticmethod
    def _note_sent(session: Session, message: dict[str, Any]) -> None:
        """Advance the session's sweep floor when a live push is the next seq in line."""
        channel_id = message["channel_id"]
        floor = session.floors.get(channel_id)
        if floor is not None and message["seq"] == floor + 1:
            session.floors[channel_id] = floor + 1

    def _refused(self, session: Session, outcome: str, message: dict[str, Any]) -> None:
        self.counters.incr("dispatch_refused")
        log.info(
            "dispatch refused",
            session_id=session.session_id,
            agent_id=session.agent_id,
            message_id=message["id"],
            outcome=outcome,
        )
        if outcome == OFFER_FULL:
            self._catch_up(session)

    def _catch_up(self, session: Session) -> None:
        """A full queue: sweep the session again (cursors, then owed) once it drains."""
        if session.phase != PHASE_CURSOR:
            session.phase = PHASE_CURSOR
            session.owed_after = ("", 0)
        session.want_refill()

    # ======================================================================================
    # Session edges and sweeps
    # ======================================================================================
    def _process_edge(self, edge: Edge) -> None:
        session = edge.session
        try:
            if edge.kind == "start":
                self._start(session)
            elif edge.kind == "end":
                self._end(session, edge.arg)
            elif edge.kind == "state":
                self._state(session, edge.arg)
            elif edge.kind == "refill":
                self._sweep(session)
        except Exception as exc:  # noqa: BLE001 - never crash the consumer
            self._resweep_live = True
            log.error("session edge failed", kind=edge.kind, session_id=session.session_id, error=repr(exc))
            self._recover_db()

    def _strict_write(self) -> Any:
        """A write transaction on the consumer's connection that commits with the server's
        default durability (the connection's own setting is for the routing flush only)."""
        assert self._db is not None
        return _strict(self._db)

    def _session_row(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._db is not None
        try:
            with self._strict_write() as tx:
                fn(tx, *args)
        except Exception as exc:  # noqa: BLE001 - session rows are bookkeeping
            log.warning("session row not written", error=repr(exc))
            self._recover_db()

    def _start(self, session: Session) -> None:
        self._session_row(delivery_store.insert_session, session.session_id, session.agent_id, self.clock.now_ms())
        if session.closed:
            return  # ended before it started; its end edge follows
        self.live[session.agent_id] = session
        self.counters.incr("sessions_started")
        log.info("session started", session_id=session.session_id, agent_id=session.agent_id)
        session.phase = PHASE_CURSOR
        session.floors = {}
        session.owed_after = ("", 0)
        pin_sweep.begin(self, session)
        self._sweep(session)

    def _end(self, session: Session, reason: str) -> None:
        if self.live.get(session.agent_id) is session:
            del self.live[session.agent_id]
        self._owed_steered.pop(session.session_id, None)
        self.counters.incr("sessions_ended")
        log.info("session ended", session_id=session.session_id, agent_id=session.agent_id, reason=reason)
        if self.options.settle_on_end:
            self._fire_held(session.session_id, session.agent_id)
        self._session_row(delivery_store.end_session, session.session_id, reason or "closed", self.clock.now_ms())

    def _state(self, session: Session, state: str) -> None:
        self._session_row(delivery_store.set_session_state, session.session_id, state)
        if state in SETTLE_STATES:
            self._fire_held(session.session_id, session.agent_id)

    def _fire_held(self, session_id: str, agent_id: str = "") -> None:
        """The settle edge: fan out the session's held messages in post order, re-read
        (a page of ``event_batch`` ids per batched read)."""
        ids = self.held.pop(session_id, None)
        if not ids:
            return
        if self.cluster is not None:  # the other nodes release what they held for this author
            self.cluster.notify_settled(agent_id)
        self.held_ids.difference_update(ids)  # none is held any more, whatever happens next
        page = max(1, self.options.event_batch)
        for start in range(0, len(ids), page):
            chunk = ids[start:start + page]
            reads = self._read_batch(chunk)
            for message_id in chunk:
                try:
                    row, members = self._read_message(message_id, reads)
                except Exception as exc:  # noqa: BLE001 - stays NULL; the scan routes it
                    self.counters.incr("route_failures")
                    self._resweep_live = True
                    log.error("held message not re-read at settle", message_id=message_id, error=repr(exc))
                    self._recover_db()
                    continue
                if row is not None:
                    self.counters.incr("settled")
                    with coalesced_wakes():
                        self._fan_out(row, members)

    def _sweep(self, session: Session) -> None:
        """One step of a session's sweep: a page of cursors, the start's pins
        (``pins.py``), a page of owed mentions, then the owed answers (``asks.py``)."""
        if self.live.get(session.agent_id) is not session or session.closed:
            return
        if session.phase == PHASE_CURSOR:
            if not self._cursor_page(session):
                session.want_refill()
                return
            session.phase = PHASE_PINS
        if session.phase == PHASE_PINS:
            if not pin_sweep.sweep_pins(self, session):
                session.want_refill()
                return
            session.phase = PHASE_OWED
        if session.phase == PHASE_OWED:
            if not self._owed_page(session):
                session.want_refill()
                return
            session.phase = PHASE_ANSWERS
        if session.phase == PHASE_ANSWERS:
            if not answer_delivery.sweep_answers(self, session):
                session.want_refill()
                return
            session.phase = PHASE_LIVE

    def _cursor_page(self, session: Session) -> bool:
        """Deliver up to one page of what the agent's cursors say is undelivered.

        True when the sweep reached the head of every sweep-set channel (or the session is
        gone); False when there may be more, or the queue is full.
        """
        assert self._db is not None
        agent_id = session.agent_id
        budget = self.options.sweep_page
        me: ChannelAgent | None = None
        with self._db.read() as tx:
            for cur in delivery_store.sweep_cursors(tx, agent_id):
                channel_id = cur.channel_id
                floor = max(cur.acked_seq, session.floors.get(channel_id, 0))
                session.floors[channel_id] = floor
                rows = delivery_store.channel_page_for(tx, agent_id, channel_id, floor, budget)
                for row in rows:
                    seq = row["channel_seq"]
                    if seq not in cur.above and row["deleted_at_ms"] is None:
                        if me is None:
                            me = self._recipient(tx, agent_id)
                        dispatch = self._catch_up_dispatch(row, me)
                        outcome = pin_sweep.offer_swept(session, dispatch)
                        if outcome != OFFER_OK:
                            self.counters.incr("dispatch_refused")
                            return outcome == OFFER_CLOSED
                        self.counters.incr("steered" if dispatch.kind == "steer" else "delivered")
                    session.floors[channel_id] = seq
                budget -= len(rows)
                if budget <= 0:
                    return False
        return True

    @staticmethod
    def _recipient(tx: Any, agent_id: str) -> ChannelAgent:
        """The sweeping agent as mention resolution sees it (a member of its sweep set)."""
        account = accounts_store.account(tx, agent_id)
        return ChannelAgent(agent_id, account["handle"] if account else "", None, True)

    @staticmethod
    def _catch_up_dispatch(row: dict[str, Any], me: ChannelAgent) -> Dispatch:
        """A cursor-swept message: a steer when it mentions the agent (the one grammar), a
        deliver otherwise, so catch-up keeps the steer-only rule of live sessions (D54)."""
        mentioned = mentions_agent(mention_handles(row["blocks"]), me, row["author_account_id"])
        return Dispatch("steer" if mentioned else "deliver", public_message(row), row["channel_id"], mentioned)

    def _owed_page(self, session: Session) -> bool:
        """Steer up to one page of the agent's owed mentions; owed rows of deleted
        messages are cleared instead (they would be re-logged at every start). A row the
        cursor sweep of this session already dispatched (a sweep-set channel, above the
        cursor's acked seq, at or below the sweep's floor) is not steered twice (D54)."""
        assert self._db is not None
        after_channel, after_seq = session.owed_after
        page = self.options.sweep_page
        with self._db.read() as tx:
            rows = cursors_store.owed_page(tx, session.agent_id, after_channel, after_seq, page)
            acked = {c.channel_id: c.acked_seq for c in delivery_store.sweep_cursors(tx, session.agent_id)} if rows else {}
        vanished: list[str] = []
        finished = len(rows) < page
        for row in rows:
            channel_id, seq = row["channel_id"], row["channel_seq"]
            if row["deleted_at_ms"] is not None:
                vanished.append(row["id"])
            elif channel_id in acked and acked[channel_id] < seq <= session.floors.get(channel_id, -1):
                self.counters.incr("steer_deduped")
            else:
                outcome = session.offer(Dispatch("steer", public_message(row), row["channel_id"], True))
                if outcome != OFFER_OK:
                    self.counters.incr("dispatch_refused")
                    finished = outcome == OFFER_CLOSED
                    break
                self.counters.incr("steered")
                if self.cluster is not None:
                    self._owed_steered.setdefault(session.session_id, set()).add(row["id"])
            session.owed_after = (row["channel_id"], row["channel_seq"])
        if vanished:
            with self._strict_write() as tx:
                for message_id in vanished:
                    cursors_store.clear_owed(tx, session.agent_id, message_id)
        return finished

    def sweep_all_live(self) -> None:
        """Put every live session through its sweep again (after an overrun)."""
        for session in list(self.live.values()):
            session.phase = PHASE_CURSOR
            session.owed_after = ("", 0)
            try:
                self._sweep(session)
            except Exception as exc:  # noqa: BLE001
                self._resweep_live = True
                log.error("sweep failed", session_id=session.session_id, error=repr(exc))
                self._recover_db()

    # ======================================================================================
    # Recovery: overrun, scan, periodic
    # ======================================================================================
    def _handle_overrun(self) -> None:
        """Re-subscribe FIRST (so live covers everything from now on), then sweep every
        live session and scan; the fresh replay is not drained (the store is the truth)."""
        fresh = self.bus.subscribe(0)
        old, self._sub = self._sub, fresh
        if old is not None:
            old.cancel()
        fresh.replay = []
        if fresh.head_seq > self._handled_seq:
            self._handled_seq = fresh.head_seq
        self.counters.incr("overruns_handled")
        log.warning("bus overrun: re-subscribed; sweeping live sessions, then scanning")
        self._flush()
        self.sweep_all_live()
        if self._scan_allowed():
            self.scan()

    def scan(self) -> int:
        """The recovery scan (RIG-2490): route every committed message whose mention pass
        never completed. Returns how many messages it marked.

        Ascending global seq, in batches, with a floor that lives only in this call (never
        persisted: a row that commits late below it is simply found by the next scan).
        A message held right now is skipped (its settle edge owns it). A per-message failure
        leaves that message NULL and the scan goes on; a failed batch read ends this scan.
        Memory is one batch plus one member list per channel in that batch.
        """
        assert self._db is not None
        self._flush()  # the scan must see the marks of every pass already decided
        self.counters.incr("scans")
        floor = 0
        marked = 0
        skipped = 0
        batch = self.options.scan_batch
        while True:
            try:
                if self.faults.fire(SCAN_READ_FAULT):
                    raise RuntimeError("fault: delivery.scan_read_error")
                with self._db.read() as tx:
                    rows = delivery_store.unrouted_page(tx, floor, batch)
            except Exception as exc:  # noqa: BLE001 - the scan never crashes the consumer
                self.counters.incr("scan_failures")
                log.error("recovery scan: batch read failed; this scan ends here", after_seq=floor, error=repr(exc))
                self._recover_db()
                break
            members_of: dict[str, list[ChannelAgent]] = {}
            for row in rows:
                floor = row["seq"]
                message_id = row["id"]
                if message_id in self.held_ids or (
                    self.cluster is not None and row["at_unix_ms"] > self.clock.now_ms() - self.cluster.scan_grace_ms()
                ):  # held here; or (cluster) young enough that the posting node routes it
                    skipped += 1
                    continue
                if row["deleted_at_ms"] is not None:
                    self._unit.mark(row)
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
                            with self._db.read() as tx:
                                cached = delivery_store.channel_agents(tx, channel_id)
                        except Exception as exc:  # noqa: BLE001 - this message stays NULL
                            self.counters.incr("route_failures")
                            log.error("recovery scan: members not read", message_id=message_id, error=repr(exc))
                            self._recover_db()
                            continue
                        members_of[channel_id] = cached
                    members = cached
                self.route_mentions_for(row, members, handles=handles)
            marked += self._flush()
            if len(rows) < batch:
                break
        self.counters.incr("scan_recovered", marked)
        self._scan_answers()
        if marked or skipped:
            log.info("recovery scan done", marked=marked, skipped_held=skipped)
        return marked

    def _scan_answers(self) -> None:
        try:
            answer_delivery.scan_undispatched(self)
        except Exception as exc:  # noqa: BLE001 - the next scan tries again
            self.counters.incr("scan_failures")
            log.error("recovery scan: answers not dispatched", error=repr(exc))
            self._recover_db()

    def _scan_allowed(self) -> bool:
        """The recovery scan runs in one process, or on the cluster's leader only."""
        return self.options.scan_enabled and (self.cluster is None or self.cluster.is_leader)

    def request_scan(self) -> None:
        """Run the periodic scan at the next pump (thread-safe; a new cluster leader)."""
        if self.options.scan_interval_ms > 0:
            self._next_scan_at = self.clock.now_ms()
            self.wake_loop()

    def _scan_due(self) -> bool:
        return self._next_scan_at is not None and self.clock.now_ms() >= self._next_scan_at

    def _periodic(self) -> None:
        """The clock's recovery point: a NULL left by a failed pass does not wait for a
        restart or an overrun (the Zulip "hard disconnect" lesson)."""
        self._next_scan_at = self.clock.now_ms() + self.options.scan_interval_ms
        recovered = self.scan() if self._scan_allowed() else 0
        if self._resweep_live or recovered:
            # A message the scan had to route is one whose event this consumer never
            # handled (a dropped publish, another process's post): its live subscribers
            # have not had it pushed either, and their cursor sweep is what pushes it.
            self._resweep_live = False
            self.sweep_all_live()

    # ======================================================================================
    # Flush: owed rows and marks in one commit, then the wakes
    # ======================================================================================
    def _flush(self) -> int:
        """Commit the pending owed rows and marks; returns the number of rows marked.

        If the batch fails, each message is retried alone so one bad message cannot keep
        the others unmarked; whatever still fails stays NULL for the next scan.
        """
        unit = self._unit
        self._pending_since = None
        self._durable_seq = self._handled_seq
        if unit.empty():
            return 0
        self._unit = _Unit()
        marked = 0
        try:
            marked = self._write(list(unit.marks.values()), unit.owed)
        except Exception as exc:  # noqa: BLE001
            self.counters.incr("flush_failures")
            self._recover_db()
            ids = list(dict.fromkeys([*unit.marks, *unit.owed]))
            if len(ids) > 1:
                for message_id in ids:
                    try:
                        marked += self._write(
                            [unit.marks[message_id]] if message_id in unit.marks else [],
                            {message_id: unit.owed.get(message_id, [])},
                        )
                    except Exception as one_exc:  # noqa: BLE001
                        self.counters.incr("flush_failures")
                        log.error("routing not committed; left for the recovery scan", message_id=message_id,
                                  error=repr(one_exc))
                        self._recover_db()
            else:
                log.error("routing not committed; left for the recovery scan", message_ids=ids, error=repr(exc))
        for agent_id, (wake_json, reason) in unit.wakes.items():
            self.wakers.request(agent_id, wake_json, reason)
        return marked

    def _write(self, marks: list[int], owed: dict[str, list[tuple[str, str]]]) -> int:
        assert self._db is not None
        now = self.clock.now_ms()
        rows = [(agent_id, message_id, channel_id) for message_id, pairs in owed.items() for agent_id, channel_id in pairs]
        # One statement on PostgreSQL, in autocommit on a connection whose commits do not
        # wait for the WAL flush: safe, a lost commit loses marks and owed rows together
        # and leaves the messages NULL for the scan (D16).
        with self._db.autocommit_write() as tx:
            if self.faults.fire(FLUSH_FAULT):
                raise RuntimeError("fault: delivery.flush_error")
            recorded, marked = delivery_store.record_and_mark(tx, rows, marks, now)
        if recorded:
            self.counters.incr("owed_recorded", recorded)
            hook = self.after_owed_recorded
            if hook is not None:
                hook()
        return marked

    def _recover_db(self) -> None:
        """Replace the dedicated connection if it broke (a lost PostgreSQL link)."""
        db = self._db
        if db is None:
            return
        conn = db.dbapi
        if getattr(conn, "broken", False) or getattr(conn, "closed", False) is True:
            try:
                db.reconnect()
            except Exception as exc:  # noqa: BLE001 - the next use retries
                log.error("could not reconnect", error=repr(exc))

    # ======================================================================================
    # Observability and the thread
    # ======================================================================================
    def _publish_progress(self) -> None:
        seq = self._handled_seq if self._unit.empty() else self._durable_seq
        with self._cond:
            self.processed_seq = seq
            self.edges_done = self._edges_finished
            self._cond.notify_all()

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Block until everything published and submitted before this call is processed
        and its durable effects committed. Raises TimeoutError."""
        target_seq = self.bus.head_seq
        with self._edges_lock:
            target_edges = self._submitted
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self.opened
                and self.edges_done >= target_edges
                and (self.processed_seq >= target_seq or self._bus_closed),
                timeout,
            )
        if not ok:
            raise TimeoutError(
                f"delivery consumer not idle after {timeout}s: processed bus seq {self.processed_seq} of "
                f"{target_seq}, edges {self.edges_done} of {target_edges}"
            )

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Wait until ``predicate()`` holds, re-checked after every pump round."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def run(self) -> None:
        """The thread body: pump, then wait for an event, an edge or the timer."""
        try:
            asyncio.run(self._main())
        except Exception as exc:  # noqa: BLE001 - last resort; should never happen
            log.critical("delivery consumer stopped by an unexpected error", error=repr(exc), exc_info=exc)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._poke = asyncio.Event()
        self.clock.add_listener(self.wake_loop)
        try:
            while not self.opened and not self._stopping:
                try:
                    self.open()
                except Exception as exc:  # noqa: BLE001 - e.g. the database is not up yet
                    log.error("delivery consumer could not start; retrying", error=repr(exc))
                    await asyncio.sleep(1.0)
            while not self._stopping:
                self.pump(defer_flush=True)
                if self._stopping:
                    break
                if self._events or self._peek_edge() is not None:
                    continue
                await self._wait()
            self.pump()  # the session ends queued by shutdown settle their held messages
        finally:
            self.clock.remove_listener(self.wake_loop)
            self._loop = None
            self._poke = None
            self.close()

    async def _wait(self) -> None:
        assert self._poke is not None
        timeout = None
        if self._next_scan_at is not None:
            timeout = max(0.0, (self._next_scan_at - self.clock.now_ms()) / 1000.0)
        flush_in = self._flush_wait_s()
        if flush_in is not None:
            timeout = flush_in if timeout is None else min(timeout, flush_in)
        poke = asyncio.ensure_future(self._poke.wait())
        waiters = {poke}
        getter = None
        if self._sub is not None and not self._bus_closed:
            getter = asyncio.ensure_future(self._sub.aget())
            waiters.add(getter)
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        self._poke.clear()
        if getter is not None:
            if getter.done():
                event = getter.result()
                if event is not None:
                    self._events.append(event)
            else:
                getter.cancel()
        if not poke.done():
            poke.cancel()


@contextlib.contextmanager
def _strict(db: Dedicated) -> Iterator[Any]:
    with db.write() as tx:
        delivery_store.strict_commit(tx)
        yield tx
