"""One node of a cluster: membership, heartbeat, the LISTEN connection, the leader lock.

Invariants (each pinned by a test in ``tests/cluster/``):

* **Events.** A post's notification is queued with ``pg_notify`` inside the post's own
  transaction (``notify_posted``), so every node learns of it exactly when it commits.
  Each node keeps one dedicated LISTEN connection whose notifications feed its bus as
  ``RemotePosted``; a node ignores its own (its in-process publish already covered them).
* **A lost listener is an overrun.** When the LISTEN connection breaks, the node
  reconnects, then overruns its bus subscribers (the consumer re-sweeps every live session
  and, on the leader, runs the recovery scan) and re-checks which of its sessions were
  replaced meanwhile.
* **Owed rows reach the session's node.** The statement that records owed mentions also
  notifies their agents (``owed_hints``); a node holding one's session steers the rows its
  start sweep could not see, each at most once a session (D123).
* **Shared liveness.** ``cluster_sessions`` holds one row per agent: a connect on any node
  overwrites it and notifies, and any other node holding a session for that agent ends it
  with reason ``replaced`` once the row says so (the last committed claim wins). An agent
  is live elsewhere when its row names another node whose heartbeat (or latest
  notification) is younger than ``dead_after_ms``.
* **One leader.** The node holding a session-level advisory lock on its own connection
  leads: it reaps nodes whose heartbeat went stale (their sessions end with reason
  ``node_dead``, their agents with owed mentions are woken), runs the recovery scan, and
  runs every wake of the cluster (other nodes forward wake requests to it), so one
  coalescing window covers the whole cluster and no agent is woken twice for one mention.
  The lock dies with its connection, so another node takes over at its next heartbeat.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import structlog

from ..faults import Faults
from ..hub.events import MessagePosted
from ..ids import new_id
from ..store import nodes as nodes_store
from ..store.engine import Tx
from . import events

log = structlog.get_logger("tidings.cluster")

LEADER_LOCK_KEY = nodes_store.LEADER_LOCK_KEY

#: Fault points: skip the post notification (negative control of cross-node routing);
#: skip the owed hint (negative control of D123); every node acts as leader (negative
#: control of the leader lock); the listener's connection breaks once (the overrun leg).
NOTIFY_OFF_FAULT = "cluster.notify_off"
OWED_HINT_OFF_FAULT = "cluster.owed_hint_off"
LEADER_LOCK_OFF_FAULT = "cluster.leader_lock_off"
LISTENER_DROP_FAULT = "cluster.listener_drop"

@dataclass
class ClusterOptions:
    heartbeat_ms: int = 2_000
    dead_after_ms: int = 10_000
    address: str = ""

    @classmethod
    def from_env(cls, address: str = "") -> ClusterOptions:
        opts = cls(address=address)
        if raw := os.environ.get("TIDINGS_HEARTBEAT_MS"):
            opts.heartbeat_ms = int(raw)
        if raw := os.environ.get("TIDINGS_DEAD_AFTER_MS"):
            opts.dead_after_ms = int(raw)
        if opts.heartbeat_ms <= 0 or opts.dead_after_ms <= opts.heartbeat_ms:
            raise ValueError("the heartbeat must be positive and shorter than the dead-after interval")
        return opts


def pg_dsn(url: str) -> str:
    """A libpq URL from a ``--db`` PostgreSQL URL."""
    scheme, rest = url.split("://", 1)
    return "postgresql://" + rest if "+" in scheme or scheme == "postgres" else url


class ClusterNode:
    def __init__(self, runtime: Any, options: ClusterOptions | None = None) -> None:
        self.runtime = runtime
        self.store = runtime.store
        self.bus = runtime.bus
        self.clock = runtime.clock
        self.faults: Faults = runtime.faults
        self.options = options or ClusterOptions.from_env()
        self.node_id = new_id("node")
        self.started_at_ms = 0
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # guards the view and the claims in flight
        self._sessions: dict[str, tuple[str, str]] = {}  # agent -> (session_id, node_id)
        self._seen: dict[str, int] = {}  # node -> last sign of life (ms, this node's clock)
        self._claiming: set[str] = set()
        self._leader_conn: Any = None
        self._leader = False
        self.leader_since_ms: int | None = None
        self.reconnects = 0
        self.reaped = 0
        self.forwarded_wakes = 0

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Register, start listening (returns once LISTEN is in place), then heartbeat."""
        self.started_at_ms = self.clock.now_ms()
        with self.store.write() as tx:
            nodes_store.register(tx, self.node_id, self.options.address, self.started_at_ms)
        self._spawn(self._listen_loop, "tidings-cluster-listen")
        if not self._listening.wait(15.0):
            raise RuntimeError("the cluster listener could not LISTEN within 15 s")
        self._tick()
        self._spawn(self._heartbeat_loop, "tidings-cluster-heartbeat")
        log.info("node started", node_id=self.node_id, address=self.options.address)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5.0)
        self._threads.clear()
        try:
            with self.store.write() as tx:
                nodes_store.release_node_sessions(tx, self.node_id)
                tx.execute(nodes_store.DELETE_NODE, {"node_id": self.node_id}).close()
        except Exception as exc:  # noqa: BLE001 - the leader reaps a node that left no trace
            log.warning("node row not removed", node_id=self.node_id, error=repr(exc))
        self._drop_leader_conn()
        log.info("node stopped", node_id=self.node_id)

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    # -- what the rest of the hub asks -------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        if self.faults.armed(LEADER_LOCK_OFF_FAULT):
            return True
        return self._leader

    def remote_live(self, agent_id: str) -> bool:
        """True when the agent's one session is on another node that is alive."""
        with self._lock:
            entry = self._sessions.get(agent_id)
            if entry is None or entry[1] == self.node_id:
                return False
            seen = self._seen.get(entry[1])
        return seen is not None and self.clock.now_ms() - seen <= self.options.dead_after_ms

    def session_node(self, agent_id: str) -> str | None:
        with self._lock:
            entry = self._sessions.get(agent_id)
        return None if entry is None else entry[1]

    def scan_grace_ms(self) -> int:
        """The recovery scan leaves younger unrouted rows to the node that posted them."""
        return self.options.dead_after_ms

    # -- the post hook (inside the post transaction) ---------------------------------------
    def notify_posted(self, tx: Tx, event: MessagePosted) -> None:
        if self.faults.fire(NOTIFY_OFF_FAULT):
            return
        nodes_store.notify(tx, events.encode_posted(self.node_id, event))

    def posted_notify_params(self) -> dict[str, str] | None:
        """What a post that commits in one statement needs to send ``notify_posted``'s
        notification itself (``messages.INSERT_NEXT_MESSAGE_ALONE_NOTIFY``); None when the
        ``cluster.notify_off`` fault drops it."""
        if self.faults.fire(NOTIFY_OFF_FAULT):
            return None
        return {"notify_channel": nodes_store.CHANNEL, "notify_kind": str(events.POSTED), "notify_node": self.node_id}

    def owed_hints(self, agent_ids: list[str]) -> list[str]:
        """The notifications that go out with owed rows recorded for ``agent_ids``
        (``owed.record_and_mark``), so that the node holding an agent's session steers them
        (D123); none when the ``cluster.owed_hint_off`` fault drops them."""
        if not agent_ids or self.faults.fire(OWED_HINT_OFF_FAULT):
            return []
        return events.encode_owed(self.node_id, agent_ids)

    def notify_settled(self, agent_id: str) -> None:
        """The author settled here: the other nodes fan out what they held for it."""
        try:
            with self.store.write() as tx:
                nodes_store.notify(tx, events.encode_settled(self.node_id, agent_id))
        except Exception as exc:  # noqa: BLE001 - their view refresh releases it later
            log.warning("settle not announced", agent_id=agent_id, error=repr(exc))

    # -- sessions ------------------------------------------------------------------------
    def connect(self, registry: Any, agent_id: str) -> Any:
        """Open a local session and make it the agent's one session in the cluster."""
        with self._lock:
            self._claiming.add(agent_id)
            session = registry.connect(agent_id)
        try:
            with self.store.write() as tx:
                nodes_store.claim_session(tx, agent_id, session.session_id, self.node_id, self.clock.now_ms())
                nodes_store.notify(
                    tx, events.encode_session(events.SESSION_CLAIMED, self.node_id, agent_id, session.session_id)
                )
            with self._lock:
                self._sessions[agent_id] = (session.session_id, self.node_id)
        finally:
            with self._lock:
                self._claiming.discard(agent_id)
        return session

    def disconnect(self, session: Any) -> None:
        with self._lock:
            if self._sessions.get(session.agent_id, ("",))[0] == session.session_id:
                del self._sessions[session.agent_id]
        try:
            with self.store.write() as tx:
                nodes_store.release_session(tx, session.session_id)
                nodes_store.notify(
                    tx,
                    events.encode_session(events.SESSION_ENDED, self.node_id, session.agent_id, session.session_id),
                )
        except Exception as exc:  # noqa: BLE001 - the row dies with the node at worst
            log.warning("session row not released", session_id=session.session_id, error=repr(exc))

    def _replace_if_claimed_elsewhere(self, agent_id: str) -> None:
        """End this node's session of ``agent_id`` when the cluster row names another one."""
        registry = self.runtime.delivery.registry
        with self._lock:
            if agent_id in self._claiming:
                return  # our own claim commits after the other one: ours wins
            local = registry.for_agent(agent_id)
            if local is None:
                return
            with self.store.read() as tx:
                claimed = nodes_store.claim_of(tx, agent_id)
            if claimed is None or claimed == local.session_id:
                return
            registry.disconnect(local, "replaced")
        log.info("session replaced by another node", agent_id=agent_id, session_id=local.session_id)

    # -- wakes: the leader runs them all -------------------------------------------------------
    def request_wake(self, wakers: Any, agent_id: str, wake_json: str | None, reason: str) -> None:
        if self.is_leader:
            wakers.request(agent_id, wake_json, reason)
            return
        try:
            with self.store.write() as tx:
                nodes_store.notify(tx, events.encode_wake(self.node_id, agent_id, reason))
            self.forwarded_wakes += 1
        except Exception as exc:  # noqa: BLE001 - a wake is best effort
            log.warning("wake not forwarded to the leader", agent_id=agent_id, error=repr(exc))

    def _wake_here(self, agent_id: str, reason: str) -> None:
        with self.store.read() as tx:
            wake_json = nodes_store.wake_config(tx, agent_id)
        self.runtime.delivery.wakers.request(agent_id, wake_json, reason)

    # -- the listener -------------------------------------------------------------------------
    def _listen_loop(self) -> None:
        import psycopg

        first = True
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    pg_dsn(self.store.url), autocommit=True, connect_timeout=5, application_name=self.node_id
                ) as conn:
                    conn.execute(f"LISTEN {nodes_store.CHANNEL}")
                    if not first:
                        self._after_listener_loss()
                    first = False
                    self._listening.set()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.25):
                            self._on_notification(note.payload)
                        if self.faults.fire(LISTENER_DROP_FAULT):
                            raise psycopg.OperationalError("fault: cluster.listener_drop")
            except Exception as exc:  # noqa: BLE001 - reconnect; the loss counts as an overrun
                if self._stop.is_set():
                    return
                self.reconnects += 1
                log.warning("cluster listener lost; reconnecting", node_id=self.node_id, error=repr(exc))
                self._stop.wait(0.2)

    def _after_listener_loss(self) -> None:
        """Notifications may have been missed: overrun the bus (re-sweep, scan), refresh
        the view, and end local sessions another node claimed meanwhile."""
        self.bus.overrun_all()
        try:
            self._refresh()
            delivery = self.runtime.delivery
            for agent_id in list(self._local_agents(delivery)):
                self._replace_if_claimed_elsewhere(agent_id)
        except Exception as exc:  # noqa: BLE001 - the next heartbeat refreshes again
            log.warning("resync after listener loss failed", error=repr(exc))
        log.warning("cluster listener reconnected: overrun handled", node_id=self.node_id)

    @staticmethod
    def _local_agents(delivery: Any) -> list[str]:
        registry = delivery.registry
        with registry._lock:  # the registry's own lock: a consistent list of its agents
            return list(registry._by_agent)

    def _on_notification(self, payload: str) -> None:
        data = events.decode(payload)
        if data is None:
            return
        sender = data["n"]
        if sender == self.node_id:
            return
        with self._lock:
            self._seen[sender] = self.clock.now_ms()
        kind = data["k"]
        try:
            if kind == events.POSTED:
                self.bus.publish(events.posted_from(data))
            elif kind == events.SESSION_CLAIMED:
                with self._lock:
                    self._sessions[data["a"]] = (data["x"], sender)
                self._replace_if_claimed_elsewhere(data["a"])
            elif kind == events.SESSION_ENDED:
                with self._lock:
                    if self._sessions.get(data["a"], ("",))[0] == data["x"]:
                        del self._sessions[data["a"]]
                self.bus.publish(events.AuthorSettled(data["a"]))
            elif kind == events.SETTLED:
                self.bus.publish(events.AuthorSettled(data["a"]))
            elif kind == events.OWED:
                owed = events.owed_from(data)
                here = tuple(a for a in owed.agent_ids if self.runtime.delivery.registry.is_live(a))
                if here:
                    self.bus.publish(events.OwedRecorded(here))
            elif kind == events.WAKE and self.is_leader:
                self._wake_here(data["a"], data["r"])
        except Exception as exc:  # noqa: BLE001 - a bad hint never stops the listener
            log.warning("cluster notification not handled", kind=kind, error=repr(exc))

    # -- the heartbeat and the leader -----------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        interval = self.options.heartbeat_ms / 1000.0
        while not self._stop.wait(interval):
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 - try again next beat
                log.warning("heartbeat failed", node_id=self.node_id, error=repr(exc))

    def _tick(self) -> None:
        now = self.clock.now_ms()
        with self.store.write() as tx:
            alive = nodes_store.heartbeat(tx, self.node_id, now)
            if not alive:
                nodes_store.register(tx, self.node_id, self.options.address, now)
        if not alive:
            # The leader took us for dead and ended our sessions: end them here too.
            log.warning("this node was reaped as dead; ending its sessions", node_id=self.node_id)
            self.runtime.delivery.registry.close_all("node_dead")
        self._refresh()
        was_leader = self.is_leader
        self._try_lead()
        if self.is_leader:
            if not was_leader:
                self.leader_since_ms = self.clock.now_ms()
                log.info("this node leads the cluster", node_id=self.node_id)
                self.runtime.delivery.consumer.request_scan()
            self._reap(now)

    def _refresh(self) -> None:
        with self.store.read() as tx:
            rows = nodes_store.nodes(tx)
            sessions = nodes_store.sessions(tx)
        with self._lock:
            for row in rows:
                self._seen[row.node_id] = max(self._seen.get(row.node_id, 0), row.heartbeat_at_ms)
            known = {row.node_id for row in rows}
            for node_id in list(self._seen):
                if node_id not in known and node_id != self.node_id:
                    del self._seen[node_id]
            fresh = {a: (s, n) for a, s, n in sessions}
            for agent_id, (session_id, node_id) in fresh.items():
                if agent_id not in self._claiming:
                    self._sessions[agent_id] = (session_id, node_id)
            gone = []
            for agent_id, (_session_id, node_id) in list(self._sessions.items()):
                if agent_id not in fresh and agent_id not in self._claiming:
                    del self._sessions[agent_id]
                    if node_id != self.node_id:
                        gone.append(agent_id)
        for agent_id in gone:  # a session that ended unseen (its node died): release its holds
            self.bus.publish(events.AuthorSettled(agent_id))

    def _try_lead(self) -> None:
        import psycopg

        conn = self._leader_conn
        try:
            if conn is None:
                conn = psycopg.connect(
                    pg_dsn(self.store.url), autocommit=True, connect_timeout=5, application_name=self.node_id
                )
                self._leader_conn = conn
            if self._leader:
                conn.execute("SELECT 1").fetchone()  # the lock lives exactly as long as this link
            else:
                self._leader = bool(conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK_KEY,)).fetchone()[0])
        except Exception as exc:  # noqa: BLE001 - lost link: lost lock
            if self._leader:
                log.warning("leader lock lost", node_id=self.node_id, error=repr(exc))
            self._leader = False
            self._drop_leader_conn()

    def _drop_leader_conn(self) -> None:
        conn, self._leader_conn = self._leader_conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass

    def _reap(self, now: int) -> None:
        """Leader: forget nodes whose heartbeat is older than ``dead_after_ms``; wake their
        agents that are owed mentions (they are offline everywhere now)."""
        cutoff = now - self.options.dead_after_ms
        with self.store.read() as tx:
            stale = [n for n in nodes_store.stale_nodes(tx, cutoff) if n != self.node_id]
        for node_id in stale:
            with self.store.write() as tx:
                agents = nodes_store.reap_node(tx, node_id, now)
            self.reaped += 1
            log.warning("dead node reaped", node_id=node_id, dead_node=node_id, sessions=len(agents))
            for agent_id in agents:
                with self.store.read() as tx:
                    owes = nodes_store.owes_any(tx, agent_id)
                if owes and not self.remote_live(agent_id) and not self.runtime.delivery.registry.is_live(agent_id):
                    self._wake_here(agent_id, "mention")
        if stale:
            self._refresh()

    # -- status -------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "leader": self.is_leader,
            "heartbeat_ms": self.options.heartbeat_ms,
            "dead_after_ms": self.options.dead_after_ms,
            "listener_reconnects": self.reconnects,
            "nodes_reaped": self.reaped,
            "wakes_forwarded": self.forwarded_wakes,
        }


def attach(runtime: Any, address: str = "") -> ClusterNode:
    """Make ``runtime`` a cluster node: the post hook, the delivery hooks, the log field."""
    from .. import logs

    node = ClusterNode(runtime, ClusterOptions.from_env(address))
    runtime.posting.notify_in_tx = node.notify_posted
    runtime.posting.notify_in_statement = node.posted_notify_params
    runtime.delivery.attach_cluster(node)
    if runtime.ingest is not None:
        runtime.ingest.worker.across_nodes = True
    scan_ms = os.environ.get("TIDINGS_SCAN_INTERVAL_MS")
    if scan_ms:
        runtime.delivery.consumer.options.scan_interval_ms = int(scan_ms)
    logs.bind_process(node_id=node.node_id)
    return node
