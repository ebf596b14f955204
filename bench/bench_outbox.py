"""Two-way bridges: post→network latency and outbox drain throughput (issue 13).

The real hub (``Runtime`` with its engines, the HTTP app under uvicorn on a loopback port),
the real connector (``tidings.bridges.connectors.signal.SignalConnector``, TCP transport) and
the suite's protocol-faithful fake signal-cli daemon (``tests/signal_daemon.py``), all in this
process. A person posts into a channel linked to a Signal group.

* latency: posts from an open loop at ``--rate`` per second (post i is due at
  ``start + i/rate``); each is timed from the moment ``Posting.post`` is called to the moment
  the daemon reads its ``send`` request. p50/p99/max in ms.
* drain: ``--backlog`` posts are queued while no connector runs; then one connector starts
  and the time until the daemon has read every send gives items/s (one request in flight,
  each answered, each reported).

    uv run python bench/bench_outbox.py [--backend sqlite|postgres|both] [--rate 50] [--seconds 10]
                                        [--backlog 1000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import uvicorn  # noqa: E402

from bridgekit import link_signal_family  # noqa: E402
from signal_daemon import FakeSignalDaemon  # noqa: E402
from tidings.api import create_app  # noqa: E402
from tidings.bridges.connectors.signal import Options, SignalConnector  # noqa: E402
from tidings.hub import accounts as accounts_hub  # noqa: E402
from tidings.hub import channels as channels_hub  # noqa: E402
from tidings.hub.tokens import Principal  # noqa: E402
from tidings.runtime import Runtime  # noqa: E402

ACCOUNT = "+14155550100"


class Server:
    def __init__(self, app) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def scene(url: str):
    rt = Runtime(url)
    alice = accounts_hub.create_account(rt.store, kind="human", handle="alice")
    ch = channels_hub.create_channel(rt.store, Principal("account", alice.id, kind="human"), name="family",
                                     members=[])["id"]
    bridge, _ = link_signal_family(rt, alice.id, ch)
    return rt, alice, ch, bridge


def stamped_daemon() -> tuple[FakeSignalDaemon, dict[str, float]]:
    daemon = FakeSignalDaemon(ACCOUNT, echo=False)
    seen: dict[str, float] = {}
    inner = daemon.answer

    def answer(req, conn):
        if isinstance(req, dict) and req.get("method") == "send":
            seen.setdefault(req["params"]["message"], time.perf_counter())
        return inner(req, conn)

    daemon.answer = answer
    return daemon.start(), seen


def connector(server: Server, daemon: FakeSignalDaemon, bridge) -> SignalConnector:
    return SignalConnector(Options(rpc=daemon.tcp_url, account=ACCOUNT, url=server.url, token=bridge["token"],
                                   pull_wait_ms=5_000, say=lambda line: None)).start()


def wait_until(predicate, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def latency(url: str, rate: float, seconds: float) -> dict:
    rt, alice, ch, bridge = scene(url)
    daemon, seen = stamped_daemon()
    with Server(create_app(rt, manage_runtime=True)) as server:
        c = connector(server, daemon, bridge)
        assert daemon.wait_listeners(1, 30)
        n = int(rate * seconds)
        posted: dict[str, float] = {}
        start = time.perf_counter()
        for i in range(n):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            text = f"bench {i}"
            posted[text] = time.perf_counter()
            rt.posting.post(author_id=alice.id, channel_id=ch, text=text)
        ok = wait_until(lambda: len(seen) >= n, 60)
        c.stop()
    daemon.kill()
    lat = [(seen[t] - posted[t]) * 1000 for t in posted if t in seen]
    return {"posts": n, "rate_per_s": rate, "arrived": len(lat), "complete": ok,
            "p50_ms": round(pct(lat, 50), 1), "p99_ms": round(pct(lat, 99), 1), "max_ms": round(max(lat), 1),
            "mean_ms": round(statistics.fmean(lat), 1)}


def drain(url: str, backlog: int) -> dict:
    rt, alice, ch, bridge = scene(url)
    daemon, seen = stamped_daemon()
    for i in range(backlog):
        rt.posting.post(author_id=alice.id, channel_id=ch, text=f"backlog {i}")
    with Server(create_app(rt, manage_runtime=True)) as server:
        t0 = time.perf_counter()
        c = connector(server, daemon, bridge)
        ok = wait_until(lambda: len(seen) >= backlog, 300)
        elapsed = time.perf_counter() - t0
        c.stop()
    daemon.kill()
    return {"items": backlog, "seconds": round(elapsed, 2), "items_per_s": round(backlog / elapsed, 1),
            "complete": ok, "pipelined": daemon.pipelined}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="sqlite", choices=["sqlite", "postgres", "both"])
    parser.add_argument("--pg", default=os.environ.get("TIDINGS_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--rate", type=float, default=50)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--backlog", type=int, default=1000)
    parser.add_argument("--json")
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    results: dict = {"load_at_start": os.getloadavg()[0]}
    for backend in backends:
        for what in ("latency", "drain"):
            if backend == "sqlite":
                url = str(Path(tempfile.mkdtemp(prefix="tidings-outbox-")) / f"{what}.db")
            else:
                url = fresh_pg(args.pg, f"tidings_bench_outbox_{what}")
            out = latency(url, args.rate, args.seconds) if what == "latency" else drain(url, args.backlog)
            results[f"{backend}.{what}"] = out
            print(backend, what, json.dumps(out), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def fresh_pg(admin_url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + "/" + name


if __name__ == "__main__":
    main()
