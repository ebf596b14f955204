"""Cluster bookkeeping: node rows with a heartbeat, and one session row per live agent.

A node (one ``tidings serve`` process on PostgreSQL) registers itself at start and moves
its ``heartbeat_at_ms`` every few seconds. ``cluster_sessions`` holds at most one row per
agent, the session that is live for it anywhere in the cluster: a connect on any node
overwrites the row (the replace), a stream's end deletes only its own row. An agent is
live when its row names a node whose heartbeat is fresh; the leader reaps nodes whose
heartbeat went stale, their session rows with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .engine import Tx
from .sql import Stmt

#: The one notification channel of a cluster (payloads: ``cluster.events``).
CHANNEL = "tidings_cluster"

REGISTER_NODE = Stmt(
    "INSERT INTO cluster_nodes (node_id, address, started_at_ms, heartbeat_at_ms) "
    "VALUES (:node_id, :address, :now, :now) "
    "ON CONFLICT (node_id) DO UPDATE SET heartbeat_at_ms = excluded.heartbeat_at_ms",
    name="register_node",
)
HEARTBEAT = Stmt(
    "UPDATE cluster_nodes SET heartbeat_at_ms = :now WHERE node_id = :node_id", name="node_heartbeat"
)
NODES = Stmt(
    "SELECT n.node_id, n.address, n.started_at_ms, n.heartbeat_at_ms, "
    "(SELECT count(*) FROM cluster_sessions s WHERE s.node_id = n.node_id) AS sessions "
    "FROM cluster_nodes n ORDER BY n.started_at_ms, n.node_id",
    name="cluster_nodes",
)
SESSIONS = Stmt(
    "SELECT s.agent_id, s.session_id, s.node_id FROM cluster_sessions s", name="cluster_sessions"
)
CLAIM_SESSION = Stmt(
    "INSERT INTO cluster_sessions (agent_id, session_id, node_id, started_at_ms) "
    "VALUES (:agent_id, :session_id, :node_id, :now) "
    "ON CONFLICT (agent_id) DO UPDATE SET session_id = excluded.session_id, "
    "node_id = excluded.node_id, started_at_ms = excluded.started_at_ms",
    name="claim_session",
)
CLAIM_OF = Stmt("SELECT session_id FROM cluster_sessions WHERE agent_id = :agent_id", name="claim_of")
RELEASE_SESSION = Stmt(
    "DELETE FROM cluster_sessions WHERE session_id = :session_id", name="release_session"
)
RELEASE_NODE_SESSIONS = Stmt(
    "DELETE FROM cluster_sessions WHERE node_id = :node_id", name="release_node_sessions"
)
STALE_NODES = Stmt(
    "SELECT node_id FROM cluster_nodes WHERE heartbeat_at_ms < :cutoff ORDER BY node_id", name="stale_nodes"
)
NODE_SESSIONS = Stmt(
    "SELECT agent_id, session_id FROM cluster_sessions WHERE node_id = :node_id ORDER BY agent_id",
    name="node_sessions",
)
END_AGENT_SESSION = Stmt(
    "UPDATE agent_sessions SET ended_at_ms = :now, end_reason = :reason "
    "WHERE session_id = :session_id AND ended_at_ms IS NULL",
    name="end_agent_session",
)
DELETE_NODE = Stmt("DELETE FROM cluster_nodes WHERE node_id = :node_id", name="delete_node")
OWES_ANY = Stmt(
    "SELECT 1 FROM owed_mentions WHERE agent_id = :agent_id AND acked_at_ms IS NULL LIMIT 1", name="owes_any"
)
WAKE_CONFIG = Stmt("SELECT wake_json FROM accounts WHERE id = :agent_id AND kind = 'agent'", name="wake_config")
#: The leader's advisory lock key (one bigint under 2**32, so ``pg_locks.objid`` shows it).
LEADER_LOCK_KEY = 0x54444753
LEADER = Stmt(
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.classid = 0 AND l.objid = :key AND l.objsubid = 1 AND l.granted",
    name="cluster_leader",
)
BOOTSTRAP_LOCK = Stmt("SELECT pg_advisory_xact_lock(7466133012)", name="bootstrap_lock")
NOTIFY = Stmt("SELECT pg_notify(:channel, :payload)", name="cluster_notify")


@dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: str
    address: str
    started_at_ms: int
    heartbeat_at_ms: int
    sessions: int


def register(tx: Tx, node_id: str, address: str, now: int) -> None:
    tx.execute(REGISTER_NODE, {"node_id": node_id, "address": address, "now": now}).close()


def heartbeat(tx: Tx, node_id: str, now: int) -> bool:
    """Move the node's heartbeat; False when its row is gone (the leader reaped it)."""
    return tx.rowcount(HEARTBEAT, {"node_id": node_id, "now": now}) == 1


def nodes(tx: Tx) -> list[NodeRow]:
    return [NodeRow(r[0], r[1], int(r[2]), int(r[3]), int(r[4])) for r in tx.all(NODES)]


def sessions(tx: Tx) -> list[tuple[str, str, str]]:
    """Every (agent_id, session_id, node_id) of the cluster."""
    return [(r[0], r[1], r[2]) for r in tx.all(SESSIONS)]


def claim_session(tx: Tx, agent_id: str, session_id: str, node_id: str, now: int) -> None:
    """Make ``session_id`` (on ``node_id``) the agent's one live session in the cluster."""
    tx.execute(
        CLAIM_SESSION, {"agent_id": agent_id, "session_id": session_id, "node_id": node_id, "now": now}
    ).close()


def claim_of(tx: Tx, agent_id: str) -> str | None:
    """The session id the cluster holds live for the agent, if any."""
    row = tx.one(CLAIM_OF, {"agent_id": agent_id})
    return None if row is None else row[0]


def release_session(tx: Tx, session_id: str) -> None:
    """Forget a session that ended; a newer session of the same agent keeps its row."""
    tx.execute(RELEASE_SESSION, {"session_id": session_id}).close()


def release_node_sessions(tx: Tx, node_id: str) -> None:
    tx.execute(RELEASE_NODE_SESSIONS, {"node_id": node_id}).close()


def stale_nodes(tx: Tx, cutoff_ms: int) -> list[str]:
    return [r[0] for r in tx.all(STALE_NODES, {"cutoff": cutoff_ms})]


def reap_node(tx: Tx, node_id: str, now: int) -> list[str]:
    """Forget a dead node: end its sessions (reason ``node_dead``), delete its rows; returns
    the agents whose session it held."""
    rows = tx.all(NODE_SESSIONS, {"node_id": node_id})
    for _agent_id, session_id in rows:
        tx.execute(END_AGENT_SESSION, {"session_id": session_id, "reason": "node_dead", "now": now}).close()
    tx.execute(RELEASE_NODE_SESSIONS, {"node_id": node_id}).close()
    tx.execute(DELETE_NODE, {"node_id": node_id}).close()
    return [r[0] for r in rows]


def owes_any(tx: Tx, agent_id: str) -> bool:
    return tx.one(OWES_ANY, {"agent_id": agent_id}) is not None


def wake_config(tx: Tx, agent_id: str) -> str | None:
    row = tx.one(WAKE_CONFIG, {"agent_id": agent_id})
    return None if row is None else row[0]


def leader(tx: Tx) -> str | None:
    """PostgreSQL: the node id (its lock connection's application name) holding the leader
    lock right now, read from ``pg_locks``; None when no node leads."""
    row = tx.one(LEADER, {"key": LEADER_LOCK_KEY})
    return None if row is None or not row[0] else row[0]


def serialize_bootstrap(tx: Tx) -> None:
    """PostgreSQL: nodes starting together on a new database create the system account and
    the admin token one after the other (a transaction-scoped lock)."""
    if tx.dialect == "postgresql":
        tx.execute(BOOTSTRAP_LOCK).close()


def notify(tx: Tx, payload: str) -> None:
    """Queue a notification on the cluster channel; PostgreSQL sends it at this
    transaction's commit, and never if it rolls back."""
    tx.execute(NOTIFY, {"channel": CHANNEL, "payload": payload}).close()


def as_dicts(rows: list[NodeRow]) -> list[dict[str, Any]]:
    return [
        {
            "node_id": r.node_id,
            "address": r.address,
            "started_at_ms": r.started_at_ms,
            "heartbeat_at_ms": r.heartbeat_at_ms,
            "sessions": r.sessions,
        }
        for r in rows
    ]
