"""Cluster benchmark: N real ``tidings serve`` nodes on one fresh PostgreSQL database.

For each cluster size in ``--cluster 1,2,3`` (the 1-node run is the side-by-side baseline
of the same run):

* post→steer p50/p99 at a fixed post rate: the posts go to node 0, the agent's SSE session
  is on the last node (a different node whenever N > 1); latency is from just before the
  POST is sent to the steer's arrival on the stream;
* posts/s accepted: posters on every node as fast as they can for a few seconds;
* time to detect a dead node (N >= 2): kill -9 of a node that does not lead, until the
  leader's ``/api/status`` no longer lists it;
* leader failover (N >= 2): kill -9 of the leader, until another node reports leading.

The cluster intervals are the production defaults unless ``--heartbeat-ms`` /
``--dead-after-ms`` say otherwise; they bound the last two figures.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

import benchlib

ADMIN_TOKEN = "tdg_bench_cluster_admin"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Node:
    def __init__(self, db_url: str, env: dict[str, str], logdir: Path, index: int) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(logdir / f"node{index}.log", "wb")
        self.proc = subprocess.Popen(
            [benchlib.python_executable(), "-c", "from tidings.cli import main; main()", "serve", "--db", db_url,
             "--port", str(self.port)],
            env={**os.environ, "TIDINGS_ADMIN_TOKEN": ADMIN_TOKEN, "TIDINGS_LOG_LEVEL": "WARNING", **env},
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        self.http = httpx.Client(base_url=self.url, timeout=10.0)

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}")
            try:
                if self.http.get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("node not ready")

    def status(self) -> dict[str, Any]:
        return self.http.get("/api/status", headers=ADMIN).json()

    def this(self) -> dict[str, Any]:
        return self.status()["cluster"]["this_node"]

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.http.close()
        self.log.close()


def _steer_reader(url: str, token: str, arrivals: dict[int, float], ready: threading.Event,
                  stop: threading.Event) -> None:
    try:
        _read_steers(url, token, arrivals, ready, stop)
    except httpx.HTTPError:  # the node went away at the end of the run
        pass


def _read_steers(url: str, token: str, arrivals: dict[int, float], ready: threading.Event,
                 stop: threading.Event) -> None:
    with httpx.Client(timeout=httpx.Timeout(10.0, read=None)) as client:
        with client.stream("GET", url + "/api/v1/session", headers={"Authorization": f"Bearer {token}"}) as resp:
            event = None
            for line in resp.iter_lines():
                if stop.is_set():
                    return
                if line.startswith("event:"):
                    event = line[6:].strip()
                    if event == "session":
                        ready.set()
                elif line.startswith("data:") and event == "steer":
                    now = time.perf_counter()
                    text = json.loads(line[5:])["message"]["text"]
                    arrivals[int(text.rsplit("#", 1)[1])] = now


def _post_at_rate(node: Node, token: str, channel: str, rate: float, seconds: float, threads: int,
                  sent: dict[int, float]) -> int:
    total = int(rate * seconds)
    start = time.perf_counter() + 0.2
    lock = threading.Lock()
    errors = [0]

    def worker(k: int) -> None:
        with httpx.Client(base_url=node.url, timeout=10.0) as client:
            for i in range(k, total, threads):
                due = start + i / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                t0 = time.perf_counter()
                with lock:
                    sent[i] = t0
                r = client.post(f"/api/v1/channels/{channel}/messages", json={"text": f"@bot ping #{i}"},
                                headers={"Authorization": f"Bearer {token}"})
                if r.status_code != 201:
                    errors[0] += 1

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return errors[0]


def _throughput(nodes: list[Node], token: str, channel: str, seconds: float, per_node: int) -> float:
    stop_at = time.perf_counter() + seconds
    counts: list[int] = []
    lock = threading.Lock()

    def worker(node: Node) -> None:
        n = 0
        with httpx.Client(base_url=node.url, timeout=10.0) as client:
            while time.perf_counter() < stop_at:
                r = client.post(f"/api/v1/channels/{channel}/messages", json={"text": "load"},
                                headers={"Authorization": f"Bearer {token}"})
                n += r.status_code == 201
        with lock:
            counts.append(n)

    pool = [threading.Thread(target=worker, args=(node,)) for node in nodes for _ in range(per_node)]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def _wait(predicate, timeout: float) -> float | None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        try:
            if predicate():
                return time.perf_counter() - t0
        except (httpx.TransportError, KeyError, ValueError):
            pass
        time.sleep(0.02)
    return None


def run_cluster(size: int, *, dbs: benchlib.Databases, rate: float, seconds: float, heartbeat_ms: int | None,
                dead_after_ms: int | None, throughput_s: float = 5.0) -> dict[str, Any]:
    url = dbs.fresh("postgresql", f"cluster{size}")
    env: dict[str, str] = {}
    if heartbeat_ms:
        env["TIDINGS_HEARTBEAT_MS"] = str(heartbeat_ms)
    if dead_after_ms:
        env["TIDINGS_DEAD_AFTER_MS"] = str(dead_after_ms)
    logdir = Path(tempfile.mkdtemp(prefix="tidings-bench-cluster-"))
    nodes = [Node(url, env, logdir, i) for i in range(size)]
    out: dict[str, Any] = {"nodes": size, "rate": rate, "seconds": seconds, "logs": str(logdir)}
    try:
        for node in nodes:
            node.wait_ready()
        first, last = nodes[0], nodes[-1]
        h = first.http
        alice = h.post("/api/v1/accounts", json={"kind": "human", "handle": "alice"}, headers=ADMIN).json()
        bot = h.post("/api/v1/accounts", json={"kind": "agent", "handle": "bot", "owner": alice["id"]},
                     headers=ADMIN).json()
        ch = h.post("/api/v1/channels", json={"name": "bench", "members": [bot["id"]]},
                    headers={"Authorization": f"Bearer {alice['token']}"}).json()["id"]
        arrivals: dict[int, float] = {}
        sent: dict[int, float] = {}
        ready, stop = threading.Event(), threading.Event()
        reader = threading.Thread(target=_steer_reader, args=(last.url, bot["token"], arrivals, ready, stop),
                                  daemon=True)
        reader.start()
        ready.wait(30)
        _wait(lambda: first.status()["cluster"]["nodes"] and all(
            n["sessions"] == (1 if n["node_id"] == last.this()["node_id"] else 0)
            for n in first.status()["cluster"]["nodes"]), 10)
        errors = _post_at_rate(first, alice["token"], ch, rate, seconds, 8, sent)
        total = int(rate * seconds)
        _wait(lambda: len(arrivals) >= total, 20)
        stop.set()
        lat = [arrivals[i] - sent[i] for i in range(total) if i in arrivals and i in sent]
        out["post_to_steer"] = benchlib.latency_ms(lat)
        out["steers_missing"] = total - len(lat)
        out["post_errors"] = errors
        out["cross_node"] = size > 1
        out["posts_per_s_accepted"] = round(_throughput(nodes, alice["token"], ch, throughput_s, 4), 1)
        if size >= 2:
            leader = next(n for n in nodes if n.this()["leader"])
            victim = next(n for n in nodes if n is not leader)
            victim_id = victim.this()["node_id"]
            victim.kill9()
            out["dead_node_detected_s"] = _wait(
                lambda: victim_id not in {n["node_id"] for n in leader.status()["cluster"]["nodes"]}, 60)
            survivors = [n for n in nodes if n is not victim and n is not leader]
            if survivors:
                leader.kill9()
                out["leader_failover_s"] = _wait(lambda: any(n.this()["leader"] for n in survivors), 60)
        out["heartbeat_ms"] = heartbeat_ms or 2000
        out["dead_after_ms"] = dead_after_ms or 10000
    finally:
        for node in nodes:
            node.stop()
        dbs.drop(url)
    return out
