"""Test kit for ``tidings.client``: a hub on a real uvicorn server (restartable on the same
port), a recording handler, an injectable backoff sleeper, and an HTTP transport that
records (and can lose or fail) the client's requests. Nothing here sleeps: every wait is
on a condition with a timeout."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from tidings.api import create_app
from tidings.client import Event
from tidings.runtime import Runtime
from tidings.store import cursors as cursors_store

ADMIN_TOKEN = "tdg_client_admin"
WAIT = 10.0


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Hub:
    """One hub process: a ``Runtime`` over ``db_url`` served by uvicorn on 127.0.0.1.

    ``port=0`` takes a free port; pass an earlier hub's port to restart "the same server".
    The socket listens before the server thread starts, so a client may connect at once.
    ``graceful_timeout`` is how long uvicorn lets open streams run on shutdown before it
    cancels them (what ``tidings serve`` does on Ctrl-C, with 3 s)."""

    def __init__(self, db_url: str, *, port: int = 0, graceful_timeout: float = 0.2) -> None:
        self.db_url = db_url
        self.runtime = Runtime(db_url, admin_token=ADMIN_TOKEN)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(self.runtime, manage_runtime=True),
            lifespan="on",
            log_level="critical",
            timeout_graceful_shutdown=graceful_timeout,
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, name=f"hub-{self.port}", daemon=True
        )
        self.http = httpx.Client(base_url=self.url, timeout=WAIT)

    def __enter__(self) -> Hub:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.http.close()
        self.server.should_exit = True
        self._thread.join(15)
        assert not self._thread.is_alive(), "the hub did not stop"
        self._sock.close()

    # -- the world ---------------------------------------------------------------------------
    def account(self, kind: str, handle: str, **extra: Any) -> dict[str, Any]:
        r = self.http.post("/api/v1/accounts", json={"kind": kind, "handle": handle, **extra}, headers=auth(ADMIN_TOKEN))
        assert r.status_code == 201, r.text
        return r.json()

    def channel(self, token: str, name: str, members: list[str] = (), subscribe: list[str] = ()) -> str:
        r = self.http.post("/api/v1/channels", json={"name": name, "members": list(members)}, headers=auth(token))
        assert r.status_code == 201, r.text
        channel_id = r.json()["id"]
        if subscribe:
            r = self.http.post(
                f"/api/v1/channels/{channel_id}/members", json={"subscribe": list(subscribe)}, headers=auth(token)
            )
            assert r.status_code == 200, r.text
        return channel_id

    def post(self, token: str, channel_id: str, text: str) -> str:
        r = self.http.post(f"/api/v1/channels/{channel_id}/messages", json={"text": text}, headers=auth(token))
        assert r.status_code == 201, r.text
        return r.json()["message"]["id"]

    # -- the server's delivery state -------------------------------------------------------------
    def owed(self, agent_id: str) -> list[str]:
        r = self.http.get(f"/api/v1/agents/{agent_id}/owed", headers=auth(ADMIN_TOKEN))
        assert r.status_code == 200, r.text
        return [o["message_id"] for o in r.json()["owed"]]

    def acked_seq(self, agent_id: str, channel_id: str) -> int:
        with self.runtime.store.read() as tx:
            cursor = cursors_store.cursor(tx, agent_id, channel_id)
        assert cursor is not None
        return cursor.acked_seq

    def delivery(self) -> dict[str, Any]:
        self.runtime.delivery.wait_idle()
        return self.runtime.delivery.status()


def post_into_store(db_url: str, author_id: str, channel_id: str, text: str) -> str:
    """Commit a post straight into the database while no server runs (nothing is published
    to any consumer: the next server's start sweep and scan must find it)."""
    rt = Runtime(db_url, admin_token=ADMIN_TOKEN)
    try:
        row, inserted = rt.posting.post(author_id=author_id, channel_id=channel_id, text=text)
        assert inserted
        return row["id"]
    finally:
        rt.stop()


class Recorder:
    """A handler that records each event as it starts, then runs ``then(event)``."""

    def __init__(self, then: Callable[[Event], Any] | None = None) -> None:
        self.then = then
        self.events: list[Event] = []
        self._cond = threading.Condition()

    def __call__(self, event: Event) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()
        if self.then is not None:
            self.then(event)

    def ids(self) -> list[str]:
        with self._cond:
            return [e.message_id for e in self.events]

    def count(self, message_id: str) -> int:
        return self.ids().count(message_id)

    def wait_for(self, *message_ids: str, times: int = 1, timeout: float = WAIT) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: all([e.message_id for e in self.events].count(m) >= times for m in message_ids), timeout
            )


class Sleeper:
    """The injected backoff sleep: records each delay and returns at once (a near-zero
    backoff), unless held: then each call waits until ``allow(n)`` or ``release()``."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._passes: int | None = None  # None: free
        self._cond = threading.Condition()

    def __call__(self, delay: float) -> None:
        with self._cond:
            self.delays.append(delay)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._passes is None or self._passes > 0, WAIT)
            if self._passes:
                self._passes -= 1

    def hold(self) -> None:
        with self._cond:
            self._passes = 0

    def allow(self, n: int) -> None:
        with self._cond:
            self._passes = (self._passes or 0) + n
            self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._passes = None
            self._cond.notify_all()

    def wait_calls(self, n: int, timeout: float = WAIT) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.delays) >= n, timeout)


class Wire(httpx.BaseTransport):
    """A real transport that logs the client's requests once answered: ``(method, path,
    json body)``. While ``lose_acks`` is set, acks never reach the server (the client is told
    200: lost in flight); while ``fail_acks`` is set, acks fail like a broken network."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.log: list[tuple[str, str, Any]] = []
        self.lose_acks = False
        self.fail_acks = False
        self._cond = threading.Condition()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = None
        if request.method == "POST":
            body = json.loads(request.read() or b"null")
        path = request.url.path
        if path == "/api/v1/ack":
            message_id = body["message_id"]
            if self.fail_acks:
                self._record(("POST", "ack-failed", message_id))
                raise httpx.ConnectError("the network ate this ack", request=request)
            if self.lose_acks:
                self._record(("POST", "ack-lost", message_id))
                return httpx.Response(200, json={"acked": True, "message_id": message_id, "owed_cleared": False})
        response = self.inner.handle_request(request)
        if path == "/api/v1/ack":
            self._record(("POST", "ack", body["message_id"]))
        elif path.endswith("/state"):
            self._record(("POST", "state", body["state"]))
        elif request.method == "POST" and path.endswith("/messages"):
            self._record(("POST", "post", body.get("text")))
        elif path == "/api/v1/session":
            self._record(("GET", "session", response.status_code))
        return response

    def _record(self, entry: tuple[str, str, Any]) -> None:
        with self._cond:
            self.log.append(entry)
            self._cond.notify_all()

    def entries(self, what: str) -> list[Any]:
        with self._cond:
            return [e[2] for e in self.log if e[1] == what]

    def wait_for(self, what: str, value: Any, times: int = 1, timeout: float = WAIT) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: sum(1 for e in self.log if e[1] == what and e[2] == value) >= times, timeout
            )

    def close(self) -> None:
        self.inner.close()


@dataclass
class World:
    hub: Hub
    alice: dict[str, Any]  # a human, owner of the agent
    bot: dict[str, Any]  # the agent (its home channel is subscribed: plain posts there are "deliver")
    gap: str  # a channel where bot is a member but not subscribed: "@bot" there is a "steer" with an owed row

    @property
    def home(self) -> str:
        return self.bot["home_channel_id"]


def build_world(hub: Hub) -> World:
    alice = hub.account("human", "alice")
    bot = hub.account("agent", "bot", owner=alice["id"])
    gap = hub.channel(alice["token"], "general", [bot["id"]])
    return World(hub, alice, bot, gap)
