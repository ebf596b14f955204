"""The cluster section of ``/api/status`` and ``tidings status`` (PostgreSQL only): every
node with its start, last heartbeat and sessions held, and which node leads (read from
``pg_locks``: the holder of the leader lock, not a node's own claim)."""

from __future__ import annotations

from typing import Any

from ..store import nodes as nodes_store


def cluster_status(runtime: Any) -> dict[str, Any]:
    node = getattr(runtime, "cluster", None)
    with runtime.store.read() as tx:
        rows = nodes_store.nodes(tx)
        leader = nodes_store.leader(tx)
    out = nodes_store.as_dicts(rows)
    for row in out:
        row["leader"] = row["node_id"] == leader
    return {
        "this_node": None if node is None else node.status(),
        "leader": leader,
        "nodes": out,
    }
