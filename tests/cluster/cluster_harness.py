"""A cluster of real ``tidings serve`` subprocesses on one throwaway PostgreSQL database.

Each node is its own process on a free port with short cluster intervals (heartbeat
200 ms, dead after 1 s, leader scan every 500 ms) so failures are detected fast. The
harness talks to the nodes over HTTP and SSE only. Waits are bounded polls of a
condition (``until``) or SSE reads with a timeout; nothing sleeps a fixed time.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from helpers import auth
from live import SSEStream

ADMIN_TOKEN = "tdg_cluster_admin"
ADMIN = auth(ADMIN_TOKEN)
FAST = {
    "TIDINGS_HEARTBEAT_MS": "200",
    "TIDINGS_DEAD_AFTER_MS": "1000",
    "TIDINGS_SCAN_INTERVAL_MS": "500",
}
TIDINGS = Path(sys.executable).with_name("tidings")
PG_ADMIN_URL = os.environ.get("TIDINGS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_admin() -> Any:
    import psycopg

    return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)


def until(predicate: Callable[[], Any], timeout: float = 20.0, every: float = 0.05, what: str = "condition") -> Any:
    """Poll ``predicate`` (an HTTP look at a real process) until it is truthy; bounded."""
    pause = threading.Event()
    deadline = timeout / every
    for _ in range(int(deadline) + 1):
        value = predicate()
        if value:
            return value
        pause.wait(every)
    raise AssertionError(f"{what} not reached within {timeout} s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def create_database() -> str:
    name = f"tidings_cluster_{secrets.token_hex(4)}"
    with _pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"


def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with _pg_admin() as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


class Node:
    """One ``tidings serve`` process."""

    def __init__(self, db_url: str, logdir: Path, name: str, faults: str = "", env: dict[str, str] | None = None):
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = logdir / f"{name}.log"
        full_env = {**os.environ, **FAST, "TIDINGS_ADMIN_TOKEN": ADMIN_TOKEN, "TIDINGS_FAULTS": faults, **(env or {})}
        argv = [str(TIDINGS)] if TIDINGS.exists() else [sys.executable, "-c", "from tidings.cli import main; main()"]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [*argv, "serve", "--db", db_url, "--port", str(self.port)],
            env=full_env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        self.http = httpx.Client(base_url=self.url, timeout=10.0)
        self._node_id: str | None = None

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
        try:
            return self.http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def status(self) -> dict[str, Any]:
        r = self.http.get("/api/status", headers=ADMIN)
        assert r.status_code == 200, r.text
        return r.json()

    @property
    def node_id(self) -> str:
        if self._node_id is None:
            self._node_id = self.status()["cluster"]["this_node"]["node_id"]
        return self._node_id

    def is_leader(self) -> bool:
        return bool(self.status()["cluster"]["this_node"]["leader"])

    def delivery(self) -> dict[str, Any]:
        return self.status()["delivery"]

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
                self.proc.wait(5)
        self.http.close()
        self._log.close()

    # -- the API as a user sees it ------------------------------------------------------
    def account(self, kind: str, handle: str, **extra: Any) -> dict[str, Any]:
        r = self.http.post("/api/v1/accounts", json={"kind": kind, "handle": handle, **extra}, headers=ADMIN)
        assert r.status_code == 201, r.text
        return r.json()

    def channel(self, token: str, name: str, members: list[str] = (), subscribe: list[str] = ()) -> str:
        r = self.http.post("/api/v1/channels", json={"name": name, "members": list(members)}, headers=auth(token))
        assert r.status_code == 201, r.text
        channel_id = r.json()["id"]
        if subscribe:
            r = self.http.post(f"/api/v1/channels/{channel_id}/members", json={"subscribe": list(subscribe)},
                               headers=auth(token))
            assert r.status_code == 200, r.text
        return channel_id

    def post(self, token: str, channel_id: str, text: str) -> str:
        r = self.http.post(f"/api/v1/channels/{channel_id}/messages", json={"text": text}, headers=auth(token))
        assert r.status_code == 201, r.text
        return r.json()["message"]["id"]

    def owed(self, agent_id: str) -> list[str]:
        r = self.http.get(f"/api/v1/agents/{agent_id}/owed", headers=ADMIN)
        assert r.status_code == 200, r.text
        return [m["message_id"] for m in r.json()["owed"]]

    def session(self, token: str) -> Stream:
        return Stream(self, token)


class Stream:
    """An agent's SSE session on one node; ``session_id`` is read from the first event."""

    def __init__(self, node: Node, token: str) -> None:
        self.node = node
        self.token = token
        self.sse = SSEStream(node.url + "/api/v1/session", auth(token))
        self.sse.__enter__()
        event, data = self.sse.next(20)
        assert event == "session", (event, data)
        self.session_id = data["session_id"]

    def next_dispatch(self, timeout: float = 10.0) -> tuple[str, Any]:
        while True:
            event, data = self.sse.next(timeout)
            if event in ("deliver", "steer", "end", "closed"):
                return event, data

    def collect(self, timeout: float) -> list[tuple[str, Any]]:
        """Every event until none arrives for ``timeout`` seconds."""
        out = []
        while True:
            try:
                out.append(self.sse.next(timeout))
            except queue.Empty:
                return out

    def state(self, state: str) -> None:
        r = self.node.http.post(f"/api/v1/session/{self.session_id}/state", json={"state": state},
                                headers=auth(self.token))
        assert r.status_code == 200, r.text

    def ack(self, message_id: str) -> None:
        r = self.node.http.post("/api/v1/ack", json={"message_id": message_id}, headers=auth(self.token))
        assert r.status_code == 200, r.text

    def close(self) -> None:
        self.sse.close()


class Cluster:
    def __init__(self, db_url: str, logdir: Path) -> None:
        self.db_url = db_url
        self.logdir = logdir
        self.nodes: list[Node] = []

    def start(self, count: int, faults: str = "", env: dict[str, str] | None = None) -> list[Node]:
        started = [Node(self.db_url, self.logdir, f"node{len(self.nodes) + i}", faults, env) for i in range(count)]
        self.nodes.extend(started)
        for node in started:
            until(node.ready, 60, what=f"{node.name} ready")
        return started

    def leader(self) -> Node:
        return until(lambda: next((n for n in self.nodes if n.proc.poll() is None and n.is_leader()), None),
                     what="a leader")

    def stop(self) -> None:
        for node in self.nodes:  # all at once, then wait for each
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            node.stop()


class WakeRecorder:
    """A webhook endpoint that records each wake POST as (agent_id, reason)."""

    def __init__(self) -> None:
        self.wakes: queue.Queue[tuple[str, str]] = queue.Queue()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                recorder.wakes.put((body.get("agent_id"), body.get("reason")))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/wake"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def drain(self, timeout: float) -> list[tuple[str, str]]:
        out = []
        while True:
            try:
                out.append(self.wakes.get(timeout=timeout))
            except queue.Empty:
                return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def iter_events(items: list[tuple[str, Any]], kinds: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    for event, data in items:
        if event in kinds:
            yield event, data["message"]["id"]
