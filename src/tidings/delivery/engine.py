"""``Delivery``: the delivery engine as the runtime and the HTTP edge see it.

Built by ``Runtime`` (construction has no side effects: no thread, no subscription, no
query), started by ``Runtime.start()`` and stopped by ``Runtime.stop()`` before the bus
closes. It composes:

* ``Consumer`` -- the single-threaded core (``consumer.py``);
* ``SessionRegistry`` -- live sessions and their queues (``sessions.py``);
* ``WakeDispatcher`` -- coalesced wakes off the delivery path (``wakers.py``).

And it answers the transport: ``connect``/``disconnect`` (the SSE stream's lifetime),
``set_state`` (settle edges), ``ack`` and ``owed``.

``threaded=False`` builds the same engine without threads: ``start()`` opens the consumer
(start scan, replay queued) and ``pump()`` then processes everything pending on the
caller's thread, wakes included. Tests use it to be deterministic by construction.

Acks are per agent, not per session: an ack is valid after the
session that saw the message has ended, is idempotent, clears the owed mention even when
the agent has no cursor in that channel, and answers 404 for an unknown message or one in
a channel the agent neither belongs to nor is owed.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, fields
from typing import Any

import structlog

from ..counters import Counters
from ..errors import BadRequest, NotFound
from ..hub import asks as asks_hub
from ..hub.tokens import Principal
from ..store import accounts as accounts_store
from ..store import cursors as cursors_store
from ..store import owed as owed_store
from .consumer import Consumer, ConsumerOptions
from .sessions import EdgeKind, Session, SessionRegistry
from .wakers import SystemWaker, WakeDispatcher, Waker

log = structlog.get_logger("tidings.delivery")

COUNTERS = (
    "delivered",
    "steered",
    "owed_recorded",
    "owed_cleared",
    "woken",
    "held",
    "settled",
    "scan_recovered",
    "acks",
    "wake_failures",
    "wakes_coalesced",
    "wakes_skipped",
    "wakes_dropped",
    "dispatch_refused",
    "deliver_deferred",
    "deliver_deduped",
    "steer_deferred",
    "steer_deduped",
    "route_failures",
    "flush_failures",
    "scans",
    "scan_failures",
    "overruns_handled",
    "sessions_started",
    "sessions_ended",
    "pins_delivered",
    "pin_notices",
    "answers_sent",
    "answer_wakes",
    "answers_recovered",
    "answers_acked",
)

STATES = ("working", "ready", "stopped")


@dataclass
class DeliveryOptions(ConsumerOptions):
    threaded: bool = True
    session_capacity: int = 1024
    session_low_water: int = 128
    wake_coalesce_ms: int = 5_000
    wake_threads: int = 2
    keepalive_s: float = 15.0


class Delivery:
    def __init__(
        self,
        runtime: Any,
        options: DeliveryOptions | None = None,
        *,
        waker: Waker | None = None,
        **overrides: Any,
    ) -> None:
        opts = options or DeliveryOptions()
        if overrides:
            opts = DeliveryOptions(**{**asdict(opts), **overrides})
        self.options = opts
        self.runtime = runtime
        self.store = runtime.store
        self.bus = runtime.bus
        self.clock = runtime.clock
        self.counters = Counters(COUNTERS)
        self.waker = waker if waker is not None else SystemWaker()
        self.wakers = WakeDispatcher(
            self.waker,
            clock=self.clock,
            counters=self.counters,
            is_live=self._is_live,
            coalesce_ms=opts.wake_coalesce_ms,
            threads=opts.wake_threads,
            threaded=opts.threaded,
        )
        consumer_opts = ConsumerOptions(**{f.name: getattr(opts, f.name) for f in fields(ConsumerOptions)})
        self.consumer = Consumer(
            store=self.store,
            bus=self.bus,
            clock=self.clock,
            faults=runtime.faults,
            counters=self.counters,
            wakers=self.wakers,
            options=consumer_opts,
        )
        self.registry = SessionRegistry(
            self.consumer.submit, capacity=opts.session_capacity, low_water=opts.session_low_water
        )
        self._thread: threading.Thread | None = None
        self.started = False
        self.cluster: Any = None

    def attach_cluster(self, cluster: Any) -> None:
        """Cluster mode (before ``start``): liveness, sessions, routing and wakes span
        the nodes (``cluster.node.ClusterNode``)."""
        self.cluster = cluster
        self.consumer.attach_cluster(cluster, _LeaderWakes(cluster, self.wakers))

    def _is_live(self, agent_id: str) -> bool:
        if self.cluster is not None and self.cluster.remote_live(agent_id):
            return True
        return self.registry.is_live(agent_id)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        if self.started:
            return
        self.started = True
        self.wakers.start()
        if self.options.threaded:
            self._thread = threading.Thread(target=self.consumer.run, name="tidings-delivery", daemon=True)
            self._thread.start()
        else:
            self.consumer.open()

    def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        self.registry.close_all("shutdown")
        if self._thread is not None:
            self.consumer.request_stop()
            self._thread.join(timeout=10.0)
            if self._thread.is_alive():
                log.error("delivery consumer did not stop within 10 s")
            self._thread = None
        else:
            self.consumer.pump()
            self.wakers.run_pending()
            self.consumer.close()
        self.wakers.stop()

    # -- synchronous driving and observation ----------------------------------------------
    def pump(self) -> int:
        """Synchronous mode: process everything pending (events, edges, wakes) now."""
        total = 0
        while True:
            n = self.consumer.pump() + self.wakers.run_pending()
            total += n
            if not n:
                return total

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Threaded mode: wait until everything published or submitted before the call
        was processed (durable effects committed); wakes are requested by then."""
        self.consumer.wait_idle(timeout)

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = self.counters.snapshot()
        out["live_sessions"] = self.registry.count()
        out["held_now"] = len(self.consumer.held_ids)
        out["processed_bus_seq"] = self.consumer.processed_seq
        roster = self.consumer.router.roster  # its totals, as counters (D108)
        out["rosters_cached"] = roster.hits if roster is not None else 0
        out["rosters_read"] = roster.misses if roster is not None else 0
        return out

    # -- the transport's calls -------------------------------------------------------------
    def connect(self, agent_id: str) -> Session:
        """Open a session for an agent (replacing its live one); the consumer sweeps it."""
        if self.cluster is not None:
            session: Session = self.cluster.connect(self.registry, agent_id)
            return session
        return self.registry.connect(agent_id)

    def disconnect(self, session: Session, reason: str = "closed") -> bool:
        ended = self.registry.disconnect(session, reason)
        if self.cluster is not None:
            self.cluster.disconnect(session)
        return ended

    def set_state(self, agent_id: str, session_id: Any, state: Any) -> None:
        if state not in STATES:
            raise BadRequest('state must be "working", "ready" or "stopped"', code="bad_state")
        session = self.registry.get(session_id) if isinstance(session_id, str) else None
        if session is None or session.agent_id != agent_id:
            raise NotFound("unknown session", code="unknown_session")
        self.consumer.submit(EdgeKind.STATE, session, state)

    def ack(self, agent_id: str, message_id: Any, ask_id: Any = None) -> dict[str, Any]:
        if ask_id is not None:  # an owed answer (hub/asks.py), not a message
            answer = asks_hub.ack_answer(self.store, agent_id, message_id, ask_id)
            self.counters.incr("answers_acked", int(answer["answer_cleared"]))
            return answer
        if not isinstance(message_id, str) or not message_id:
            raise BadRequest("message_id (a string) is required", code="bad_message_id")
        with self.store.write() as tx:
            result = cursors_store.ack(tx, agent_id, message_id, self.clock.now_ms())
        if result is None:
            raise NotFound("unknown message", code="unknown_message")
        self.counters.incr("acks")
        if result.owed_cleared:
            self.counters.incr("owed_cleared")
        log.debug("ack", agent_id=agent_id, message_id=message_id, moved=result.cursor_moved)
        return {"acked": True, "message_id": message_id, "owed_cleared": result.owed_cleared}

    def owed(self, viewer: Principal, agent_id: Any) -> list[dict[str, Any]]:
        """The agent's owed mentions, for the admin, the agent itself or its owner."""
        if not isinstance(agent_id, str):
            raise NotFound("unknown agent", code="unknown_agent")
        with self.store.read() as tx:
            agent = accounts_store.account(tx, agent_id)
            allowed = agent is not None and agent["kind"] == "agent" and (
                viewer.is_admin or viewer.account_id in (agent_id, agent["owner_id"])
            )
            if not allowed:
                raise NotFound("unknown agent", code="unknown_agent")
            return owed_store.owed_of(tx, agent_id)


class _LeaderWakes:
    """Cluster: the consumer's wake requests go to the leader's dispatcher (one coalescing
    window for the whole cluster); on the leader they are local calls."""

    def __init__(self, cluster: Any, wakers: WakeDispatcher) -> None:
        self.cluster = cluster
        self.wakers = wakers

    def request(self, agent_id: str, wake_json: str | None, reason: str) -> None:
        self.cluster.request_wake(self.wakers, agent_id, wake_json, reason)
