"""The delivery consumer: one thread turns bus events and session edges into dispatches.

Where things live: this module is the ordering loop (edges, pump, overrun, waits);
``routing.py`` the author split, fan-out and mention pass; ``unit.py`` the durability
unit and its flush; ``sweeps.py`` the cursor and owed sweeps; ``scan.py`` the recovery and
periodic scans; ``link.py`` the consumer's connection and its one failure path;
``pins.py`` the start's pins and live pin notices; ``asks.py`` the owed answers.

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
together, in one transaction per batch of handled events (``unit.Flusher``), and the wakes are
requested only after that commit (durable first, then wake). A message is marked only when
its pass ran AND that commit succeeded; otherwise it stays NULL and the next recovery scan
(at start, after an overrun, every ``scan_interval_ms``) routes it again.

Cost per batch (the bus events one ``pump`` drains, up to ``event_batch``): the rows of
every message that fans out and the agents of their channels (named by the events) are
read together (one statement, whatever the batch size), each event is then handled in
order from that read, and the flush is one statement. A channel's agents come from the
router's copy when that statement read the same roster epoch as the copy was read at
(``store/roster.py``, D108), so an unchanged roster is not read again; when every
roster is held, the statement joins nothing at all (D126). On PostgreSQL the consumer's own connection reads and
flushes in autocommit (no BEGIN/COMMIT/ROLLBACK round trips) and its session commits
without waiting for the WAL flush, which only the flush relies on (D16): every other write
on it (session rows, stale sessions, owed rows of deleted messages) puts the server's
default back for its transaction (``Link.strict_write``). A reader's wake-up is one
``call_soon_threadsafe`` per event loop per message (``sessions.coalesced_wakes``).
The consumer thread may hold a flush back for ``flush_delay_ms`` (wall time) so that
events arriving close together share one commit; the routing decided so far is always
flushed before an edge and before a scan, and ``wait_idle`` waits for the flush (the
published progress covers only flushed events). Steers and delivers are queued when each
event is handled, never held back.

Failure cases this loop closes, each with its test:

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

Cluster (``attach_cluster``, PostgreSQL, several nodes; ``cluster/node.py``): a post
another node took arrives as ``RemotePosted`` and only dispatches to this node's sessions
(``Router.fan_out_here_only``); a post whose author's session is on another node is held
here until that node announces the settle (``AuthorSettled``); only the leader scans, and
it leaves rows younger than the dead-after interval to the node that posted them. The
argument above does not cross nodes: the owed row is written by the posting node (or the
leader's scan), whose flush is not ordered with this node's start edges. So that statement
notifies the agents (``OwedRecorded``), handled here in bus order: a session past its owed
sweep steers the agent's owed rows again from the first, leaving out every mention already
steered to it (``steered_here``, D123).

Ordering: an edge remembers the bus head when it was submitted, and the consumer handles
every bus event up to that head before the edge. So a ``ready`` sent after an agent's post
returned always finds that post held, and a session's start sweep runs before any live
dispatch to it. Live delivers queue behind the sweep on the session's queue; while a
session is catching up on its cursors, live delivers to it are left to the sweep (which
reads them from the store in order) instead of overtaking it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from ..bus import Bus, Stamped, Subscription
from ..clock import Clock
from ..cluster.events import AuthorSettled, OwedRecorded
from ..counters import Counters
from ..faults import Faults
from ..hub.events import AskAnswered, MessagePosted, PinsChanged
from ..store import sessions as sessions_store
from ..store.engine import Store
from .asks import Answers
from .link import Link
from .options import ConsumerOptions
from .pins import Pins
from .routing import BATCH_READ_FAULT, ROUTE_FAULT, RouteOutcome, Router
from .scan import SCAN_READ_FAULT, Scanner
from .sessions import PHASE_CURSOR, EdgeKind, Session
from .sweeps import Sweeper
from .unit import FLUSH_FAULT, Flusher, Unit
from .wakers import WakeDispatcher, WakeRequests

log = structlog.get_logger("tidings.delivery")

#: Re-exported so tests and demos arm the fault points from one module.
__all__ = [
    "BATCH_READ_FAULT", "FLUSH_FAULT", "ROUTE_FAULT", "SCAN_READ_FAULT", "Consumer", "ConsumerOptions", "Edge",
    "RouteOutcome",
]

#: ``_next_event`` found the subscription overrun: the caller handles what it collected,
#: then the overrun.
_OVERRUN = object()

SETTLE_STATES = frozenset({"ready", "stopped"})


@dataclass(slots=True)
class Edge:
    kind: EdgeKind
    session: Session
    arg: Any
    bus_seq: int


class Consumer:
    """The single-threaded core of delivery: the ordering loop; see the module docstring.

    Routing (``routing.Router``), the durability unit (``unit``), the sweeps
    (``sweeps.Sweeper``) and the scans (``scan.Scanner``) are parts it owns and hands the
    connection (``link``), the counters and the live-session view explicitly.
    """

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
        self.wakers: WakeRequests = wakers
        self.options = options
        # Consumer-thread state.
        self.live: dict[str, Session] = {}
        self.held: dict[str, list[str]] = {}
        self.held_ids: set[str] = set()
        self.link = Link(counters)
        self._events: deque[Stamped] = deque()
        self._sub: Subscription | None = None
        self._unit = Unit()
        self._handled_seq = 0
        self._durable_seq = 0  # every event up to it handled AND its effects flushed
        self._pending_since: float | None = None  # monotonic time the unit got its first item
        self._edges_finished = 0
        self._next_scan_at: int | None = None
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
        #: Cluster: session id -> every mention steered to it, live or swept (no duplicate).
        self._steered_here: dict[str, set[str]] = {}
        # The parts, each handed what it uses.
        self.router = Router(link=self.link, counters=counters, faults=faults, live=self.live, held=self.held,
                             held_ids=self.held_ids, unit=self._unit, options=options,
                             steered_here=self._steered_here, dialect=store.dialect)
        self.pins = Pins(link=self.link, counters=counters, faults=faults, live=self.live)
        self.answers = Answers(link=self.link, counters=counters, clock=clock, wakers=wakers, live=self.live)
        self.sweeper = Sweeper(link=self.link, counters=counters, live=self.live, options=options, pins=self.pins,
                               answers=self.answers, steered_here=self._steered_here)
        self.flusher = Flusher(link=self.link, clock=clock, faults=faults, counters=counters, wakers=wakers,
                               on_owed_recorded=self._owed_recorded)
        self.scanner = Scanner(link=self.link, counters=counters, faults=faults, held_ids=self.held_ids,
                               unit=self._unit, router=self.router, sweeper=self.sweeper, flush=self._flush,
                               options=options, answers=self.answers, clock=clock)

    @property
    def cluster(self) -> Any:
        """The ``cluster.ClusterNode`` (None = one process)."""
        return self.link.cluster

    def attach_cluster(self, cluster: Any, wakers: WakeRequests) -> None:
        """Cluster mode (before ``open``): routing and scans see the nodes, and every wake
        request goes to ``wakers`` (the leader's dispatcher)."""
        self.link.cluster = cluster
        self.wakers = self.flusher.wakers = self.answers.wakers = wakers

    @property
    def _db(self) -> Any:
        """The consumer's dedicated connection (None when closed)."""
        return self.link.dedicated

    def _strict_write(self) -> Any:
        """A write transaction that commits with the server's default durability."""
        return self.link.strict_write()

    def _owed_recorded(self) -> None:
        hook = self.after_owed_recorded
        if hook is not None:
            hook()

    # ======================================================================================
    # Edges from other threads
    # ======================================================================================
    def submit(self, kind: EdgeKind, session: Session, arg: Any = None) -> None:
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
        self.link.open(self.store)
        self._sub = self.bus.subscribe(0)
        try:
            if self.cluster is None:  # in a cluster the leader ends a dead node's sessions
                with self.link.strict_write() as tx:
                    sessions_store.end_stale_sessions(tx, self.clock.now_ms())
        except Exception as exc:  # noqa: BLE001 - bookkeeping only
            self.link.failed("could not close stale session rows", exc, level="warning")
        if self.scanner.allowed():
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
            self.link.close()

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
        if unit.size() >= self.options.event_batch:
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
        """Handle bus events in order: each run of posted messages goes to
        ``routing.Router.handle_posted`` (one read for all of them); a remote settle, a pin
        change and an answered ask are handled in their place; everything else is ignored."""
        posted: list[MessagePosted] = []
        for event in events:
            payload = event.payload
            if isinstance(payload, MessagePosted):
                posted.append(payload)
            elif isinstance(payload, (AuthorSettled, OwedRecorded, PinsChanged, AskAnswered)):
                if posted:
                    self.router.handle_posted(posted)
                    posted = []
                self._on_other(payload)
        if posted:
            self.router.handle_posted(posted)
        for event in events:
            if event.seq > self._handled_seq:
                self._handled_seq = event.seq

    def _on_other(self, payload: AuthorSettled | OwedRecorded | PinsChanged | AskAnswered) -> None:
        """A remote settle or owed rows another node recorded (cluster), a pin change (live
        ``pin`` notices) or an answered ask (the asker's answer)."""
        if isinstance(payload, AuthorSettled):
            self.router.release_remote(payload.agent_id)
            return
        if isinstance(payload, OwedRecorded):
            self.sweeper.owed_again(payload.agent_ids)
            return
        try:
            if isinstance(payload, PinsChanged):
                self.pins.on_pins_changed(payload)
            else:
                self.answers.on_answered(payload)
        except Exception as exc:  # noqa: BLE001 - the recovery scan dispatches answers
            self.link.failed("pin or answer event not processed", exc, event=repr(payload))

    # ======================================================================================
    # Session edges and sweeps
    # ======================================================================================
    def _process_edge(self, edge: Edge) -> None:
        session = edge.session
        try:
            if edge.kind == EdgeKind.START:
                self._start(session)
            elif edge.kind == EdgeKind.END:
                self._end(session, edge.arg)
            elif edge.kind == EdgeKind.STATE:
                self._state(session, edge.arg)
            elif edge.kind == EdgeKind.REFILL:
                self.sweeper.sweep(session)
        except Exception as exc:  # noqa: BLE001 - never crash the consumer
            self.link.failed("session edge failed", exc, resweep=True, kind=edge.kind, session_id=session.session_id)

    def _session_row(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            with self.link.strict_write() as tx:
                fn(tx, *args)
        except Exception as exc:  # noqa: BLE001 - session rows are bookkeeping
            self.link.failed("session row not written", exc, level="warning")

    def _start(self, session: Session) -> None:
        self._session_row(sessions_store.insert_session, session.session_id, session.agent_id, self.clock.now_ms())
        if session.closed:
            return  # ended before it started; its end edge follows
        self.live[session.agent_id] = session
        self.counters.incr("sessions_started")
        log.info("session started", session_id=session.session_id, agent_id=session.agent_id)
        session.phase = PHASE_CURSOR
        session.floors = {}
        session.owed_after = ("", 0)
        self.pins.begin(session)
        self.sweeper.sweep(session)

    def _end(self, session: Session, reason: str) -> None:
        if self.live.get(session.agent_id) is session:
            del self.live[session.agent_id]
        self._steered_here.pop(session.session_id, None)
        self.counters.incr("sessions_ended")
        log.info("session ended", session_id=session.session_id, agent_id=session.agent_id, reason=reason)
        if self.options.settle_on_end:
            self.router.fire_held(session.session_id, session.agent_id)
        self._session_row(sessions_store.end_session, session.session_id, reason or "closed", self.clock.now_ms())

    def _state(self, session: Session, state: str) -> None:
        self._session_row(sessions_store.set_session_state, session.session_id, state)
        if state in SETTLE_STATES:
            self.router.fire_held(session.session_id, session.agent_id)

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
        self.sweeper.sweep_all_live()
        if self.scanner.allowed():
            self.scan()

    def scan(self) -> int:
        """The recovery scan (``scan.Scanner.scan``); returns how many messages it marked."""
        return self.scanner.scan()

    def request_scan(self) -> None:
        """Run the periodic scan at the next pump (thread-safe; a new cluster leader)."""
        if self.options.scan_interval_ms > 0:
            self._next_scan_at = self.clock.now_ms()
            self.wake_loop()

    def _scan_due(self) -> bool:
        return self._next_scan_at is not None and self.clock.now_ms() >= self._next_scan_at

    def _periodic(self) -> None:
        """The clock's recovery point (``scan.Scanner.periodic``), then the next due time."""
        self._next_scan_at = self.clock.now_ms() + self.options.scan_interval_ms
        self.scanner.periodic()

    # ======================================================================================
    # Flush: owed rows and marks in one commit, then the wakes
    # ======================================================================================
    def _flush(self) -> int:
        """Commit what the passes decided (``unit.Flusher``); returns the number of rows
        marked. The published progress covers the events handled up to here."""
        self._pending_since = None
        self._durable_seq = self._handled_seq
        if self._unit.empty():
            return 0
        return self.flusher.flush(self._unit.take())

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
        waiters: set[asyncio.Future[Any]] = {poke}
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

