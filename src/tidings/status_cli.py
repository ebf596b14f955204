"""``tidings status``: what a hub is doing, and which figures can be known from where.

* ``--url`` reads a running hub (``GET /api/status`` with the admin token): every figure,
  live, from the process that owns it;
* ``--db`` reads the store only, and says so: backlog, quarantined frames and owed mentions
  are durable (true whoever looks); the ingest and delivery counters, sessions and the bus
  live only inside the running process, so they are not shown as zeros but named as
  "only in a running hub: use --url".
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

PROCESS_ONLY = (
    "ingest counters (imported, projected, quarantined_new, ...), delivery counters "
    "(delivered, steered, ...), live sessions, held posts, the bus head, latency histograms"
)


def from_url(url: str, token: str) -> dict[str, Any]:
    import httpx

    r = httpx.get(url.rstrip("/") + "/api/status", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    if r.status_code != 200:
        try:
            message = r.json()["error"]["message"]
        except Exception:  # noqa: BLE001 - not our envelope
            message = r.text[:200]
        raise RuntimeError(f"{url} answered {r.status_code}: {message}")
    return {"source": "running hub", "url": url, "live": r.json()}


def from_db(db_url: str) -> dict[str, Any]:
    from .metrics import durable_figures
    from .store.engine import Store

    store = Store(db_url)
    try:
        durable = durable_figures(store)
        cluster = _cluster_nodes(store) if store.dialect == "postgresql" else None
    finally:
        store.dispose()
    out: dict[str, Any] = {"source": "database", "durable": durable, "only_in_a_running_hub": PROCESS_ONLY}
    if cluster is not None:
        out["cluster"] = cluster
    return out


def _cluster_nodes(store: Any) -> dict[str, Any]:
    """The cluster's nodes as the store holds them (durable on PostgreSQL: D70-D77)."""
    from .store import nodes as nodes_store

    with store.read() as tx:
        rows = nodes_store.as_dicts(nodes_store.nodes(tx))
        leader = nodes_store.leader(tx)
    for row in rows:
        row["leader"] = row["node_id"] == leader
    return {"leader": leader, "nodes": rows}


def _render_nodes(cluster: dict[str, Any] | None, out: Console) -> None:
    if not cluster:
        return
    table = Table(title="cluster nodes")
    for column in ("node", "address", "started_at_ms", "heartbeat_at_ms", "sessions", "leader"):
        table.add_column(column)
    for node in cluster["nodes"]:
        table.add_row(node["node_id"], node.get("address", ""), str(node["started_at_ms"]),
                      str(node["heartbeat_at_ms"]), str(node["sessions"]), "yes" if node["leader"] else "")
    out.print(table)


def render(data: dict[str, Any], out: Console, as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps(data))
        return
    if data["source"] == "database":
        d = data["durable"]
        table = Table(title="durable figures (from the store; true whoever looks)")
        table.add_column("figure")
        table.add_column("value", justify="right")
        table.add_row("ingest backlog (frames not yet processed)", str(d["backlog_total"]))
        table.add_row("quarantined frames", str(d["quarantined_total"]))
        table.add_row("owed mentions (not acked)", str(d["owed"]))
        for bridge_id, n in sorted(d["backlog"].items()):
            table.add_row(f"  backlog of {bridge_id}", str(n))
        out.print(table)
        out.print(f"Only in a running hub (use --url): {PROCESS_ONLY}.", soft_wrap=True)
        _render_nodes(data.get("cluster"), out)
        return
    live = dict(data["live"])
    cluster = live.pop("cluster", None)
    for section, values in live.items():
        table = Table(title=f"{section} (live, from {data['url']})")
        table.add_column("counter")
        table.add_column("value", justify="right")
        for key, value in _flatten(values):
            table.add_row(key, str(value))
        out.print(table)
    _render_nodes(cluster, out)


def _flatten(values: Any, prefix: str = ""):
    if isinstance(values, dict):
        for key, value in values.items():
            yield from _flatten(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), values
