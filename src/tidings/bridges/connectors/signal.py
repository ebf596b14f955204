"""``tidings bridge signal``: a two-way connector between a signal-cli daemon and the hub.

Transports (``--rpc``): ``tcp://HOST:PORT`` speaks the daemon's newline-delimited JSON-RPC
on one socket (requests, responses and ``receive`` notifications interleaved);
``http://HOST:PORT`` posts requests to ``/api/v1/rpc`` and reads notifications from the
``/api/v1/events`` server-sent events.

Inbound: every ``receive`` notification becomes one ``signal.jsonrpc`` frame whose
dedupe key is a hash of the notification, kept in a bounded memory queue (a full queue
stops reading the daemon) and appended to the hub, retried until the hub answers 202. A
400 (a frame the hub will never take) is counted and dropped. signal-cli has acknowledged
the message to Signal before we read it, so from the socket on delivery is at most once:
the queue is where a crash of this process can lose frames.

Outbound: the bridge's outbox is pulled (long-poll) and sent in order with ONE request in
flight (signal-cli loses pipelined sends): ``send`` (``groupId`` or ``recipient``,
``quoteTimestamp``/``quoteAuthor`` for a reply, ``editTimestamp`` for an edit),
``sendReaction``, ``remoteDelete``. The result's ``timestamp`` is reported as the item's
remote id. A rate limit (error -5 or a ``RATE_LIMIT_FAILURE`` result) holds every send for
at least ``retryAfterSeconds`` and reports the item retryable with that delay; a network
failure (-3, ``NETWORK_FAILURE``) is retryable with the hub's backoff;
``UNREGISTERED_FAILURE``, ``IDENTITY_FAILURE`` (or -4) and an unknown account fail the item
with that cause. A send is at least once: a crash between the daemon's answer and the
report sends it again after restart, and echo suppression keeps the duplicate out of the
channel.

The daemon connection is re-made with backoff; one line is printed per connect and
disconnect. ``--receive-mode manual`` subscribes with ``subscribeReceive`` on every
connect. Counters are published to the hub (``/api/status`` -> ``bridges``).
"""

from __future__ import annotations

import hashlib
import json
import queue
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import httpx
import structlog

from ...clock import SYSTEM_CLOCK, Clock
from ...counters import Counters
from ...faults import Faults
from ..outbox import kill_point

log = structlog.get_logger("tidings.bridge.signal")

CODEC = "signal.jsonrpc"
KILL_AFTER_SEND = "bridge.kill_after_send"
TYPING_REFRESH_MS = 10_000
USER_ERROR, IO_ERROR, UNTRUSTED_KEY_ERROR, RATELIMIT_ERROR = -1, -3, -4, -5
INVALID_PARAMS, METHOD_NOT_FOUND = -32602, -32601
PERMANENT_RESULTS = ("UNREGISTERED_FAILURE", "IDENTITY_FAILURE", "INVALID_PRE_KEY_FAILURE")
COUNTER_NAMES = (
    "connects", "disconnects", "notifications", "frames_appended", "frames_refused", "hub_retries",
    "sends", "sent", "send_retries", "send_failed", "rate_limited", "rpc_errors", "typing_sent",
)


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.data = code, message, data


class Disconnected(Exception):
    """The daemon connection is gone (the request may or may not have been sent)."""


class Fatal(Exception):
    """A condition retrying cannot fix (the account is not registered with the daemon)."""


# ======================================================================================
# Transports
# ======================================================================================
class TcpTransport:
    """Newline-delimited JSON-RPC on one TCP socket. ``request`` is serialised by the
    caller (one in flight); a reader thread routes responses by id and notifications to
    ``on_notification`` (which may block: that is the bounded queue's back-pressure)."""

    def __init__(self, host: str, port: int, on_notification: Callable[[dict], None]) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.on_notification = on_notification
        self.dead = threading.Event()
        self._lock = threading.Lock()
        self._waiting: dict[int, list] = {}
        self._reader = threading.Thread(target=self._read, name="signal-rpc-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            with self.sock.makefile("rb") as stream:
                for line in stream:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        log.warning("signal-cli sent a line that is not JSON", line=line[:200])
                        continue
                    self._route(msg)
        except OSError:
            pass
        finally:
            self.dead.set()
            with self._lock:
                for slot in self._waiting.values():
                    slot[1].set()

    def _route(self, msg: Any) -> None:
        if not isinstance(msg, dict):
            return
        if "method" in msg and "id" not in msg:
            self.on_notification(msg)
            return
        with self._lock:
            slot = self._waiting.get(msg.get("id"))
        if slot is not None:
            slot[0] = msg
            slot[1].set()

    def request(self, request_id: int, method: str, params: dict[str, Any] | None, timeout: float) -> Any:
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": request_id}
        if params:
            body["params"] = params
        slot: list = [None, threading.Event()]
        with self._lock:
            self._waiting[request_id] = slot
        try:
            if self.dead.is_set():
                raise Disconnected("not connected")
            try:
                self.sock.sendall(json.dumps(body, separators=(",", ":")).encode() + b"\n")
            except OSError as exc:
                raise Disconnected(str(exc)) from None
            if not slot[1].wait(timeout) or slot[0] is None:
                raise Disconnected("no response (connection lost or timed out)")
            return _result(slot[0])
        finally:
            with self._lock:
                self._waiting.pop(request_id, None)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.dead.set()


class HttpTransport:
    """signal-cli's HTTP mode: ``POST /api/v1/rpc`` for requests, ``GET /api/v1/events``
    (server-sent events, ``event:receive`` with the bare ``{envelope, account}``) for
    notifications, wrapped here into the socket's ``receive`` notification shape."""

    def __init__(self, base: str, account: str, on_notification: Callable[[dict], None]) -> None:
        self.base = base.rstrip("/")
        self.http = httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0))
        self.on_notification = on_notification
        self.dead = threading.Event()
        self.http.get(self.base + "/api/v1/check").raise_for_status()
        self._events_ready = threading.Event()
        self._reader = threading.Thread(target=self._events, args=(account,), name="signal-sse", daemon=True)
        self._reader.start()
        self._events_ready.wait(2)  # a multi-account daemon with no account may answer late

    def _events(self, account: str) -> None:
        try:
            params = {"account": account} if account else None
            with self.http.stream("GET", self.base + "/api/v1/events", params=params,
                                  timeout=httpx.Timeout(None, connect=10.0)) as resp:
                resp.raise_for_status()
                self._events_ready.set()
                event, data = "", []
                for line in resp.iter_lines():
                    if line == "":
                        if data and event in ("", "receive"):
                            try:
                                params_obj = json.loads("\n".join(data))
                            except ValueError:
                                params_obj = None
                            if isinstance(params_obj, dict):
                                self.on_notification({"jsonrpc": "2.0", "method": "receive", "params": params_obj})
                        event, data = "", []
                    elif line.startswith(":"):
                        continue
                    elif line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].lstrip(" ") if line[5:6] == " " else line[5:])
        except (httpx.HTTPError, OSError, RuntimeError):
            pass
        finally:
            self._events_ready.set()
            self.dead.set()

    def request(self, request_id: int, method: str, params: dict[str, Any] | None, timeout: float) -> Any:
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": request_id}
        if params:
            body["params"] = params
        try:  # each request stands alone: it does not need the events stream
            resp = self.http.post(self.base + "/api/v1/rpc", json=body, timeout=timeout)
        except (httpx.HTTPError, OSError) as exc:
            raise Disconnected(str(exc)) from None
        try:
            msg = resp.json()
        except ValueError:
            raise RpcError(resp.status_code, f"HTTP {resp.status_code} without a JSON-RPC body") from None
        return _result(msg)

    def close(self) -> None:
        self.dead.set()
        self.http.close()


def _result(msg: dict[str, Any]) -> Any:
    err = msg.get("error")
    if err is not None:
        if not isinstance(err, dict):
            raise RpcError(-32603, str(err))
        raise RpcError(int(err.get("code", -32603)), str(err.get("message", "")), err.get("data"))
    return msg.get("result")


# ======================================================================================
# What a send becomes
# ======================================================================================
def split_remote_id(remote_id: str, account: str) -> tuple[str, int]:
    """``<author>:<timestamp>`` (a Signal message id) -> (author address, timestamp);
    ``self`` is our own account. A bare timestamp (what a connector reports) is ours."""
    author, _, ts = remote_id.rpartition(":")
    if not author or author == "self":
        author = account
    return author, int(ts)


def request_for(item: dict[str, Any], account: str) -> tuple[str, dict[str, Any]]:
    """The JSON-RPC method and params that carry one outbox item."""
    params: dict[str, Any] = {"account": account} if account else {}
    remote = item["remote_conversation_id"]
    if remote.startswith("signal-group:"):
        params["groupId"] = remote[len("signal-group:"):]
    elif remote.startswith("signal:"):
        params["recipient"] = [remote[len("signal:"):]]
    else:
        raise ValueError(f"not a Signal conversation: {remote!r}")
    kind = item["kind"]
    target = item.get("target_remote_id")
    if kind in ("send", "reply", "edit"):
        params["message"] = item["text"]
        if kind == "reply" and target:
            params["quoteAuthor"], params["quoteTimestamp"] = split_remote_id(target, account)
        if kind == "edit" and target:
            params["editTimestamp"] = split_remote_id(target, account)[1]
        return "send", params
    if kind == "react":
        params["emoji"] = item["emoji"]
        params["targetAuthor"], params["targetTimestamp"] = split_remote_id(target, account)
        return "sendReaction", params
    if kind == "delete":
        params["targetTimestamp"] = split_remote_id(target, account)[1]
        return "remoteDelete", params
    raise ValueError(f"unknown outbox kind {kind!r}")


@dataclass
class Outcome:
    """How one send ended: ``sent`` with a remote id, or a retryable/permanent failure."""

    state: str
    remote_id: str | None = None
    cause: str | None = None
    retryable: bool = False
    retry_after_ms: int | None = None

    def report(self) -> dict[str, Any]:
        if self.state == "sent":
            return {"state": "sent", "remote_id": self.remote_id}
        body: dict[str, Any] = {"state": "failed", "cause": self.cause, "retryable": self.retryable}
        if self.retry_after_ms is not None:
            body["retry_after_ms"] = self.retry_after_ms
        return body


def classify(result: Any = None, error: RpcError | None = None) -> Outcome:
    """A send's answer -> Outcome. Per-recipient result types decide when present (a send
    with at least one SUCCESS is sent); the error code otherwise."""
    response = result
    if error is not None and isinstance(error.data, dict):
        response = error.data.get("response", response)
    results = response.get("results") if isinstance(response, dict) else None
    types = [r.get("type") for r in results if isinstance(r, dict)] if isinstance(results, list) else []
    timestamp = response.get("timestamp") if isinstance(response, dict) else None
    if error is None and (not types or "SUCCESS" in types) and timestamp is not None:
        return Outcome("sent", remote_id=str(timestamp))
    if "SUCCESS" in types and timestamp is not None:
        return Outcome("sent", remote_id=str(timestamp))
    if "RATE_LIMIT_FAILURE" in types or (error is not None and error.code == RATELIMIT_ERROR):
        seconds = [r.get("retryAfterSeconds") for r in results or [] if isinstance(r, dict)]
        seconds = [s for s in seconds if isinstance(s, int) and s >= 0]
        return Outcome("failed", cause="RATE_LIMIT_FAILURE", retryable=True,
                       retry_after_ms=max(seconds) * 1000 if seconds else None)
    for permanent in PERMANENT_RESULTS:
        if permanent in types:
            return Outcome("failed", cause=permanent)
    if error is not None and error.code == UNTRUSTED_KEY_ERROR:
        return Outcome("failed", cause="IDENTITY_FAILURE")
    if "NETWORK_FAILURE" in types or (error is not None and error.code == IO_ERROR):
        return Outcome("failed", cause="NETWORK_FAILURE", retryable=True)
    if error is not None and error.code == INVALID_PARAMS:
        return Outcome("failed", cause=f"refused by signal-cli: {error.message}"[:500])
    if error is not None:
        return Outcome("failed", cause=f"signal-cli error {error.code}: {error.message}"[:500], retryable=True)
    return Outcome("failed", cause="signal-cli answered without a timestamp", retryable=True)


# ======================================================================================
# The hub side
# ======================================================================================
class Hub:
    """The hub's HTTP API as a bridge token sees it."""

    def __init__(self, url: str, token: str, timeout: float = 40.0) -> None:
        self.http = httpx.Client(base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {token}"},
                                 timeout=timeout)

    def bridge_id(self) -> str:
        resp = self.http.get("/api/v1/me")
        resp.raise_for_status()
        bridge = resp.json().get("bridge_id")
        if not bridge:
            raise Fatal("the token is not a bridge token (use the bridge's own token)")
        return bridge

    def append(self, bridge_id: str, frame: dict[str, Any]) -> int:
        return self.http.post(f"/api/v1/bridges/{bridge_id}/frames", json={"frames": [frame]}).status_code

    def pull(self, bridge_id: str, wait_ms: int) -> dict[str, Any]:
        """``{"items": [...], "typing": [...]}``: pending items in order, and where an agent
        is working now."""
        resp = self.http.get(f"/api/v1/bridges/{bridge_id}/outbox", params={"wait_ms": wait_ms})
        resp.raise_for_status()
        return resp.json()

    def report(self, bridge_id: str, item_id: str, body: dict[str, Any]) -> int:
        return self.http.post(f"/api/v1/bridges/{bridge_id}/outbox/{item_id}", json=body).status_code

    def publish(self, bridge_id: str, state: str, counters: dict[str, int]) -> None:
        self.http.post(f"/api/v1/bridges/{bridge_id}/connector", json={"state": state, "counters": counters})

    def close(self) -> None:
        self.http.close()


# ======================================================================================
# The connector
# ======================================================================================
@dataclass
class Options:
    rpc: str
    account: str
    url: str
    token: str
    receive_mode: str = "on-connection"  # or "manual"
    queue_max: int = 1000
    pull_wait_ms: int = 10_000
    rpc_timeout_s: float = 60.0
    reconnect_min_s: float = 0.05
    reconnect_max_s: float = 5.0
    publish_every_s: float = 5.0
    clock: Clock = field(default=SYSTEM_CLOCK)
    say: Callable[[str], None] = print


class SignalConnector:
    def __init__(self, options: Options) -> None:
        self.o = options
        self.clock = options.clock
        self.counters = Counters(COUNTER_NAMES)
        self.faults = Faults.from_env()
        self.inbound: queue.Queue[dict] = queue.Queue(maxsize=max(1, options.queue_max))
        self.stop_event = threading.Event()
        self.connected = threading.Event()
        self.fatal: str | None = None
        self.hub = Hub(options.url, options.token)
        # The long poll has its own client, closed first on stop so Ctrl-C never waits for it.
        self.puller = Hub(options.url, options.token, timeout=options.pull_wait_ms / 1000 + 30)
        self.bridge_id = ""
        self.transport: Any = None
        self._rpc_lock = threading.Lock()  # one request in flight, ever
        self._next_id = 0
        self._send_gate_ms = 0  # no send before this clock time (rate limits)
        self._typing_since: dict[str, int] = {}  # conversation -> when typing was last sent
        self._clock_moved = threading.Event()
        self._threads: list[threading.Thread] = []
        self.state = "starting"

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> SignalConnector:
        self.bridge_id = self.hub.bridge_id()
        self.clock.add_listener(self._clock_moved.set)
        for target, name in ((self._daemon_loop, "signal-daemon"), (self._forward_loop, "signal-forward"),
                             (self._send_loop, "signal-send"), (self._publish_loop, "signal-publish")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        if self.stop_event.is_set():
            return
        self.stop_event.set()
        self._clock_moved.set()
        self.puller.close()
        transport = self.transport
        if transport is not None:
            transport.close()
        self.clock.remove_listener(self._clock_moved.set)
        for t in self._threads:
            t.join(timeout=5)
        self._publish("stopped")
        self.hub.close()

    def run_forever(self) -> int:
        """The CLI's main loop: until Ctrl-C or a fatal condition."""
        self.start()
        try:
            while not self.stop_event.wait(0.5):
                pass
        except KeyboardInterrupt:
            self.o.say("stopping (Ctrl-C)")
        finally:
            self.stop()
        if self.fatal:
            self.o.say(f"error: {self.fatal}")
            return 2
        return 0

    # -- the daemon connection --------------------------------------------------------------
    def _connect(self) -> Any:
        parsed = urlparse(self.o.rpc)
        if parsed.scheme == "tcp":
            return TcpTransport(parsed.hostname or "127.0.0.1", parsed.port or 7583, self._on_notification)
        if parsed.scheme in ("http", "https"):
            return HttpTransport(self.o.rpc, self.o.account, self._on_notification)
        raise Fatal(f"--rpc must be tcp://HOST:PORT or http://HOST:PORT, not {self.o.rpc!r}")

    def _daemon_loop(self) -> None:
        delay = self.o.reconnect_min_s
        checked = False
        while not self.stop_event.is_set():
            try:
                transport = self._connect()
            except Fatal as exc:
                return self._die(str(exc))
            except (OSError, httpx.HTTPError) as exc:
                log.debug("signal-cli not reachable", rpc=self.o.rpc, error=str(exc))
                self.stop_event.wait(delay)
                delay = min(self.o.reconnect_max_s, delay * 2)
                continue
            self.transport = transport
            try:
                if not checked:
                    self._check_account()
                    checked = True
                if self.o.receive_mode == "manual":
                    params = {"account": self.o.account} if self.o.account else None
                    self.call("subscribeReceive", params)
            except Fatal as exc:
                transport.close()
                return self._die(str(exc))
            except (Disconnected, RpcError) as exc:
                transport.close()
                log.warning("signal-cli connection set-up failed", error=str(exc))
                self.stop_event.wait(delay)
                delay = min(self.o.reconnect_max_s, delay * 2)
                continue
            self.counters.incr("connects")
            self.state = "connected"
            self.connected.set()
            self.o.say(f"connected to signal-cli at {self.o.rpc} as {self.o.account or '(single account)'}")
            delay = self.o.reconnect_min_s
            while not transport.dead.wait(0.5):
                if self.stop_event.is_set():
                    break
            self.connected.clear()
            transport.close()
            if self.stop_event.is_set():
                return
            self.counters.incr("disconnects")
            self.state = "disconnected"
            self.o.say(f"disconnected from signal-cli at {self.o.rpc}; reconnecting")

    def _check_account(self) -> None:
        """Refuse to run for an account the daemon does not have (multi-account mode)."""
        if not self.o.account:
            return
        try:
            accounts = self.call("listAccounts", None)
        except RpcError as exc:
            if exc.code == METHOD_NOT_FOUND:
                return  # a single-account daemon: it has exactly its own account
            raise
        numbers = [a.get("number") for a in accounts or [] if isinstance(a, dict)]
        if self.o.account not in numbers:
            raise Fatal(f"signal-cli has no registered account {self.o.account} (its accounts: {numbers}); "
                        "register or link it with signal-cli first")

    def _die(self, reason: str) -> None:
        self.fatal = reason
        self.state = "failed"
        log.error("signal connector stops", reason=reason)
        self.stop_event.set()

    def call(self, method: str, params: dict[str, Any] | None) -> Any:
        """One JSON-RPC request; the lock keeps exactly one in flight."""
        with self._rpc_lock:
            transport = self.transport
            if transport is None:
                raise Disconnected("not connected")
            self._next_id += 1
            return transport.request(self._next_id, method, params, self.o.rpc_timeout_s)

    # -- inbound -----------------------------------------------------------------------------
    def _on_notification(self, msg: dict[str, Any]) -> None:
        if msg.get("method") != "receive":
            return
        self.counters.incr("notifications")
        while not self.stop_event.is_set():
            try:
                self.inbound.put(msg, timeout=0.5)  # full: stop reading the daemon
                return
            except queue.Full:
                continue

    @staticmethod
    def frame_of(msg: dict[str, Any]) -> dict[str, Any]:
        canonical = json.dumps(msg.get("params"), sort_keys=True, separators=(",", ":"))
        key = "sigrx:" + hashlib.sha256(canonical.encode()).hexdigest()[:40]
        return {"codec": CODEC, "codec_version": 1, "dedupe_key": key, "payload": msg}

    def _forward_loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                msg = self.inbound.get(timeout=0.5)
            except queue.Empty:
                continue
            frame = self.frame_of(msg)
            delay = self.o.reconnect_min_s
            while not self.stop_event.is_set():
                try:
                    status = self.hub.append(self.bridge_id, frame)
                except (httpx.HTTPError, OSError):
                    status = 0
                if status == 202:
                    self.counters.incr("frames_appended")
                    break
                if status in (400, 413):
                    self.counters.incr("frames_refused")
                    log.error("the hub refused a frame; dropped", status=status, dedupe_key=frame["dedupe_key"])
                    break
                self.counters.incr("hub_retries")
                self.stop_event.wait(delay)
                delay = min(self.o.reconnect_max_s, delay * 2)

    # -- outbound ----------------------------------------------------------------------------
    def _wait_for_gate(self) -> None:
        """Hold sends until the clock reaches the rate-limit gate (a fake clock wakes us
        when it moves)."""
        while not self.stop_event.is_set():
            remaining = self._send_gate_ms - self.clock.now_ms()
            if remaining <= 0:
                return
            self._clock_moved.clear()
            if self.clock.now_ms() >= self._send_gate_ms:
                return
            self._clock_moved.wait(remaining / 1000 if not self.clock.is_fake else 0.5)

    def _send_loop(self) -> None:
        while not self.stop_event.is_set():
            if not self.connected.wait(0.5):
                continue
            try:
                answer = self.puller.pull(self.bridge_id, self.o.pull_wait_ms)
            except (httpx.HTTPError, OSError, RuntimeError):  # RuntimeError: closed by stop()
                self.stop_event.wait(self.o.reconnect_min_s * 4)
                continue
            self._typing({t["remote_conversation_id"] for t in answer.get("typing", [])})
            for item in answer["items"]:
                if self.stop_event.is_set():
                    return
                outcome = self._send_one(item)
                if outcome is None:
                    break  # disconnected: pull again once reconnected
                self._report(item, outcome)

    def _typing(self, now_working: set[str]) -> None:
        """``sendTyping`` where an agent started working (again every ``TYPING_REFRESH_MS``,
        as Signal's indicator fades), ``stop`` where it settled. Best effort."""
        now = self.clock.now_ms()
        for remote in sorted(now_working):
            if now - self._typing_since.get(remote, -TYPING_REFRESH_MS) >= TYPING_REFRESH_MS:
                if self._typing_call(remote, stop=False):
                    self._typing_since[remote] = now
        for remote in sorted(set(self._typing_since) - now_working):
            self._typing_call(remote, stop=True)
            del self._typing_since[remote]

    def _typing_call(self, remote: str, *, stop: bool) -> bool:
        try:
            _, params = request_for({"kind": "send", "remote_conversation_id": remote, "text": ""}, self.o.account)
        except ValueError:
            return False
        params.pop("message", None)
        if stop:
            params["stop"] = True
        try:
            self.call("sendTyping", params)
        except (RpcError, Disconnected) as exc:
            log.debug("sendTyping not sent", conversation=remote, error=str(exc))
            return False
        self.counters.incr("typing_sent")
        return True

    def _send_one(self, item: dict[str, Any]) -> Outcome | None:
        self._wait_for_gate()
        try:
            method, params = request_for(item, self.o.account)
        except (ValueError, TypeError) as exc:
            return Outcome("failed", cause=f"cannot send: {exc}"[:500])
        self.counters.incr("sends")
        try:
            result = self.call(method, params)
            outcome = classify(result=result)
        except RpcError as exc:
            self.counters.incr("rpc_errors")
            outcome = classify(error=exc)
        except Disconnected:
            return None
        kill_point(self.faults, KILL_AFTER_SEND)  # crash tests: sent, never reported
        if outcome.cause == "RATE_LIMIT_FAILURE":
            self.counters.incr("rate_limited")
            wait = outcome.retry_after_ms if outcome.retry_after_ms is not None else 1_000
            self._send_gate_ms = max(self._send_gate_ms, self.clock.now_ms() + wait)
        return outcome

    def _report(self, item: dict[str, Any], outcome: Outcome) -> None:
        body = outcome.report()
        delay = self.o.reconnect_min_s
        while not self.stop_event.is_set():
            try:
                status = self.hub.report(self.bridge_id, item["id"], body)
            except (httpx.HTTPError, OSError):
                status = 0
            if status in (200, 409, 404):
                break
            self.stop_event.wait(delay)
            delay = min(self.o.reconnect_max_s, delay * 2)
        if outcome.state == "sent":
            self.counters.incr("sent")
        elif outcome.retryable:
            self.counters.incr("send_retries")
        else:
            self.counters.incr("send_failed")
        log.info("outbox item reported", item_id=item["id"], kind=item["kind"], state=outcome.state,
                 remote_id=outcome.remote_id, cause=outcome.cause)

    # -- counters ------------------------------------------------------------------------------
    def _publish(self, state: str | None = None) -> None:
        try:
            self.hub.publish(self.bridge_id, state or self.state, self.counters.snapshot())
        except (httpx.HTTPError, OSError, RuntimeError):
            pass

    def _publish_loop(self) -> None:
        while not self.stop_event.wait(self.o.publish_every_s):
            self._publish()

