"""Prometheus metrics (``GET /metrics``) and the latency histograms behind them.

Two kinds of figures, kept apart on purpose (``tidings status`` says which is which):

* **durable** — read from the store at each scrape, true for any process that looks:
  ``tidings_ingest_backlog`` (frames not yet processed), ``tidings_ingest_quarantined``,
  ``tidings_delivery_owed`` (owed mentions not acked), per bridge where it applies;
* **process** — live only in the running hub and reset by a restart: the ingest and
  delivery counters of ``/api/status`` (``tidings_ingest_<name>_total``,
  ``tidings_delivery_<name>_total``), live sessions, and two latency histograms:
  ``tidings_post_to_dispatch_seconds`` (a message's commit time to its push to an agent)
  and ``tidings_frame_apply_seconds`` (decode and project one frame).

The histograms are process-wide (the engines observe into them without knowing about
HTTP); the rest is collected per app from its runtime at scrape time.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

P = ParamSpec("P")
R = TypeVar("R")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_REGISTRY = CollectorRegistry(auto_describe=True)
POST_TO_DISPATCH = Histogram(
    "tidings_post_to_dispatch_seconds",
    "From a message's commit to its push to an agent session (deliver or steer).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=LATENCY_REGISTRY,
)
FRAME_APPLY = Histogram(
    "tidings_frame_apply_seconds",
    "Decoding and projecting one bridge frame.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
    registry=LATENCY_REGISTRY,
)


def dispatched(message: dict[str, Any]) -> None:
    """A message was pushed to a session: observe commit -> now (wall clock, never < 0)."""
    at = message.get("at_unix_ms")
    if isinstance(at, int):
        POST_TO_DISPATCH.observe(max(0.0, time.time() - at / 1000.0))


def timed_frame_apply(fn: Callable[P, R]) -> Callable[P, R]:
    """Wrap the one "apply one frame" function: its duration goes to ``FRAME_APPLY``."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            FRAME_APPLY.observe(time.perf_counter() - started)

    return wrapper


def durable_figures(store: Any) -> dict[str, Any]:
    """The figures the store holds (true for any process): backlog, quarantined, owed."""
    from .store import figures

    with store.read() as tx:
        return figures.durable(tx)


class RuntimeCollector:
    """Collects a runtime's figures at scrape time (durable ones from its store)."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Any]:
        status = self.runtime.status()
        ingest = status.get("ingest", {})
        delivery = status.get("delivery", {})
        durable = durable_figures(self.runtime.store)
        g = GaugeMetricFamily("tidings_ingest_backlog", "Frames not yet processed (durable).", labels=["bridge_id"])
        for bridge_id, n in sorted(durable["backlog"].items()):
            g.add_metric([bridge_id], n)
        yield g
        g = GaugeMetricFamily("tidings_ingest_quarantined", "Quarantined frames (durable).", labels=["bridge_id"])
        for bridge_id, n in sorted(durable["quarantined"].items()):
            g.add_metric([bridge_id], n)
        yield g
        yield GaugeMetricFamily("tidings_delivery_owed", "Owed mentions not acked yet (durable).", value=durable["owed"])
        per_bridge = ingest.get("per_bridge", {}) or {}
        names = sorted({name for counters in per_bridge.values() for name in counters})
        for name in names:
            c = CounterMetricFamily(f"tidings_ingest_{name}", f"Ingest counter {name} (this process).",
                                    labels=["bridge_id"])
            for bridge_id, counters in sorted(per_bridge.items()):
                if isinstance(counters.get(name), int):
                    c.add_metric([bridge_id], counters[name])
            yield c
        gauges = {"live_sessions", "held_now", "processed_bus_seq"}
        for name, value in sorted(delivery.items()):
            if not isinstance(value, int):
                continue
            if name in gauges:
                yield GaugeMetricFamily(f"tidings_delivery_{name}", f"Delivery {name} (this process).", value=value)
            else:
                yield CounterMetricFamily(f"tidings_delivery_{name}", f"Delivery counter {name} (this process).",
                                          value=value)
        for name, value in sorted(status.get("search_index", {}).items()):  # SQLite only
            yield CounterMetricFamily(f"tidings_search_index_{name}",
                                      f"Search index background pass {name} (this process).", value=value)
        checkpoints = status.get("checkpoints")
        if checkpoints is not None:  # SQLite only (D128)
            for name in ("runs", "busy", "failures"):
                yield CounterMetricFamily(f"tidings_sqlite_checkpoint_{name}",
                                          f"WAL checkpoints beside the writer: {name} (this process).",
                                          value=checkpoints[name])
            yield GaugeMetricFamily("tidings_sqlite_wal_pages", "Pages the WAL held at the last checkpoint.",
                                    value=checkpoints["wal_pages"])
        bus = status.get("bus", {})
        yield GaugeMetricFamily("tidings_bus_head_seq", "The bus head (this process).", value=bus.get("head_seq", 0))


def exposition(runtime: Any) -> bytes:
    """The Prometheus text for ``runtime``: its figures, then the latency histograms."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RuntimeCollector(runtime))
    return generate_latest(registry) + generate_latest(LATENCY_REGISTRY)


def serve_metrics(runtime: Any, sock: Any) -> Any:
    """``--metrics-bind``: serve ``GET /metrics`` (no token) on an already bound socket, on
    a daemon thread; the returned server's ``shutdown()`` stops it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404)
                return
            body = exposition(runtime)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(sock.getsockname()[:2], Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="tidings-metrics", daemon=True).start()
    return server
