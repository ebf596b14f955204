"""``tidings.client``: a small Python client for agents (docs/api.md §3.6, "Agent sessions").

Connect an agent in a few lines::

    from tidings.client import Agent

    agent = Agent("http://127.0.0.1:7860", token="tdg_...")

    @agent.on_message
    def handle(event):                   # event.kind is "deliver" or "steer"
        agent.post(event.channel_id, f"got {event.text}")

    agent.run()                          # blocks; Ctrl-C stops cleanly

What it does for you:

* **The session stream.** ``run()`` opens ``GET /api/v1/session`` (server-sent events) and
  reads it on the calling thread; handlers run on that thread, one at a time, in stream
  order. No thread is started (``run_in_thread()`` is there when you want one).
* **Reconnects.** A dropped connection, a server restart, a 5xx or a network error is
  retried with exponential backoff and jitter (``Backoff``), forever unless
  ``give_up_after`` seconds pass without a session. The server's ``end`` event with
  reason ``replaced`` (another connection of the same agent took over) stops ``run()``
  rather than fighting that connection, unless ``on_replaced="reconnect"``. A bad token
  (401/403) raises ``AuthError`` at once, never an endless retry.
* **At-least-once, deduplicated.** The server may send a message again (after a reconnect,
  a lost ack, a restart; docs/api.md §7.2); the message id is the dedup key. The ids of handled
  messages are kept in a bounded LRU that survives reconnects, so a duplicate is not handed
  to your handler again, but it IS acked again, so a lost ack cannot strand the server's
  cursor.
* **Ack after the handler.** A message is acked only after the handler returned. If the
  handler raises, the error is logged, the message is not acked and not marked handled: the
  server sends it again at the agent's next session (``agent.reconnect()`` asks for that
  now). An ack that fails on the network is retried at the next ack and at the next session.
* **Turn state.** ``working`` is reported when a handler starts, ``ready`` when nothing
  else is waiting in what was received (the server holds an agent's own posts while its
  session is live and routes them at ``ready``, so replies go out then). A ``post()`` made
  outside a handler reports ``ready`` itself so it is routed at once. ``set_state()`` is
  there too; ``auto_state=False`` leaves the state entirely to you.
* **Helpers.** ``post`` (idempotent: a retried post reuses its ``client_request_id``),
  ``read``, ``owed``, ``ack``, ``channels``, ``me``.

Sleeping (backoff) and the clock are injectable (``sleep=``, ``clock=``, ``rng=``), so
tests never sleep for real.
"""

from __future__ import annotations

import json
import logging
import random
import re
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = [
    "Agent",
    "APIError",
    "AuthError",
    "Backoff",
    "ClientError",
    "Event",
    "NotFoundError",
    "ServerUnavailable",
    "SSEParser",
    "SSEEvent",
]

log = logging.getLogger("tidings.client")


class _RequestsAtDebug(logging.Filter):
    """httpx logs every request at INFO; an agent's log at INFO holds only connects,
    disconnects and errors, so request lines are demoted to DEBUG (failures stay)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and str(record.msg).startswith("HTTP Request"):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG) or logging.getLogger().isEnabledFor(
                logging.DEBUG
            )
        return True


_REQUEST_FILTER = _RequestsAtDebug()


def _quiet_request_logs() -> None:
    for name in ("httpx", "httpcore"):
        logger = logging.getLogger(name)
        if _REQUEST_FILTER not in logger.filters:
            logger.addFilter(_REQUEST_FILTER)

STATES = ("working", "ready", "stopped")
_RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


# ==========================================================================================
# Errors
# ==========================================================================================
class ClientError(Exception):
    """Base class of every error this client raises."""


class APIError(ClientError):
    """The server answered with an error (docs/api.md §3.1 envelope ``{"error": {code, message}}``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class AuthError(APIError):
    """401 (no or bad token) or 403 (a token that may not do this, e.g. not an agent's)."""


class NotFoundError(APIError):
    """404: unknown, or not visible to this agent."""


class ServerUnavailable(ClientError):
    """The server could not be reached (or kept failing) for longer than allowed."""


def _error_from(response: httpx.Response) -> APIError:
    code, message = f"http_{response.status_code}", ""
    try:
        body = response.json()
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            code = str(err.get("code") or code)
            message = str(err.get("message") or "")
    except (ValueError, UnicodeDecodeError):
        message = response.text[:200]
    if response.status_code in (401, 403):
        cls: type[APIError] = AuthError
    elif response.status_code == 404:
        cls = NotFoundError
    else:
        cls = APIError
    return cls(response.status_code, code, message or response.reason_phrase)


# ==========================================================================================
# Events
# ==========================================================================================
@dataclass(frozen=True, slots=True)
class Event:
    """One ``deliver`` or ``steer`` handed to the handler.

    ``kind`` is ``"deliver"`` (a message in a channel the agent follows) or ``"steer"`` (the
    agent was @mentioned, live or while it was away); ``message`` is the API's
    ``Message`` object; ``mentions_you`` is the server's ``mentions_you`` flag.
    """

    kind: str
    message: dict[str, Any]
    channel_id: str
    session_id: str | None = None
    mentions_you: bool = False

    @property
    def message_id(self) -> str:
        return self.message["id"]

    @property
    def text(self) -> str:
        return self.message.get("text") or ""

    @property
    def author_id(self) -> str | None:
        return self.message.get("author_account_id")

    @property
    def seq(self) -> int | None:
        return self.message.get("seq")

    @property
    def is_steer(self) -> bool:
        return self.kind == "steer"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One parsed server-sent event: its ``event:`` name and its ``data:`` lines joined."""

    event: str
    data: str


_LINE_END = re.compile(rb"\r\n|\r|\n")


class SSEParser:
    """An incremental ``text/event-stream`` parser (WHATWG rules: any of CRLF/CR/LF ends a
    line, ``:`` starts a comment, a blank line dispatches, a missing name is ``message``).

    ``feed(chunk)`` returns the events completed by that chunk; ``partial`` tells whether
    an event has started but not finished."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []
        self._started = False
        self.comments = 0

    @property
    def partial(self) -> bool:
        return bool(self._buffer) or self._started

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        buffer = self._buffer + chunk
        out: list[SSEEvent] = []
        start = 0
        for match in _LINE_END.finditer(buffer):
            if match.group() == b"\r" and match.end() == len(buffer):
                break  # a CR at the very end may be the first half of a CRLF
            self._line(buffer[start : match.start()].decode("utf-8", errors="replace"), out)
            start = match.end()
        self._buffer = buffer[start:]
        return out

    def _line(self, line: str, out: list[SSEEvent]) -> None:
        if line == "":
            if self._started:
                out.append(SSEEvent(self._event or "message", "\n".join(self._data)))
            self._event, self._data, self._started = "", [], False
            return
        if line.startswith(":"):
            self.comments += 1
            return
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
            self._started = True
        elif name == "data":
            self._data.append(value)
            self._started = True
        # "id" and "retry" are not used by Tidings; unknown fields are ignored (spec).


# ==========================================================================================
# Backoff and the handled-id LRU
# ==========================================================================================
@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with "equal jitter": attempt ``n`` waits a uniformly random time
    in ``[c * (1 - jitter), c]`` with ``c = min(cap, base * factor ** n)``. So the wait
    always grows with failures (never below half the ceiling by default) and a fleet of
    agents knocked off by one restart does not come back in lockstep."""

    base: float = 0.5
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.5

    def ceiling(self, attempt: int) -> float:
        return min(self.cap, self.base * self.factor ** min(attempt, 64))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        ceiling = self.ceiling(attempt)
        draw = (rng or random).random()
        return ceiling * (1.0 - self.jitter) + ceiling * self.jitter * draw


class _Seen:
    """A bounded LRU of message ids (insertion refreshes recency)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("dedupe capacity must be at least 1")
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, message_id: str) -> bool:
        return message_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, message_id: str) -> None:
        self._ids[message_id] = None
        self._ids.move_to_end(message_id)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def touch(self, message_id: str) -> None:
        if message_id in self._ids:
            self._ids.move_to_end(message_id)


# ==========================================================================================
# The agent
# ==========================================================================================
Handler = Callable[[Event], Any]


@dataclass(slots=True)
class _Outcome:
    """How one connection ended, as the reconnect loop needs to know it."""

    kind: str  # "ended" (server end event) | "lost" | "requested" | "stopped"
    detail: str = ""
    connected: bool = False  # a session event was received


class Agent:
    """An agent's connection to a Tidings hub. See the module docstring."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        handler: Handler | None = None,
        on_replaced: str = "stop",
        auto_state: bool = True,
        backoff: Backoff | None = None,
        give_up_after: float | None = None,
        dedupe_capacity: int = 10_000,
        read_timeout: float = 60.0,
        request_timeout: float = 10.0,
        request_retries: int = 3,
        sleep: Callable[[float], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """
        ``url``: the hub's base URL. ``token``: the agent's token (``tdg_…``).
        ``on_replaced``: ``"stop"`` (default: ``run()`` returns when another connection of
        this agent replaces this one) or ``"reconnect"``.
        ``give_up_after``: seconds without a session before ``run()`` raises
        ``ServerUnavailable`` (None: retry forever).
        ``read_timeout``: a stream silent for this long (the server sends keep-alives every
        15 s) is treated as dead and reconnected.
        ``sleep``/``clock``/``rng``: injectable for tests (the default sleep returns early
        when ``stop()`` is called).
        ``transport``: an ``httpx`` transport (tests, proxies).
        """
        if on_replaced not in ("stop", "reconnect"):
            raise ValueError('on_replaced must be "stop" or "reconnect"')
        if not isinstance(token, str) or not token:
            raise ValueError("a token is required")
        self.url = url.rstrip("/")
        self.on_replaced = on_replaced
        self.auto_state = auto_state
        self.backoff = backoff or Backoff()
        self.give_up_after = give_up_after
        self.read_timeout = read_timeout
        self.request_retries = max(0, request_retries)
        self._handler = handler
        self._session_hooks: list[Callable[[str], Any]] = []
        self._sleep_fn = sleep
        self._clock = clock
        self._rng = rng or random.Random()
        _quiet_request_logs()
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "tidings-client"},
            timeout=request_timeout,
            transport=transport,
        )
        self._seen = _Seen(dedupe_capacity)
        self._pending_acks: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._reconnect_requested = False
        self._response: httpx.Response | None = None
        self._session_id: str | None = None
        self._in_turn = False
        self._needs_settle = False
        self._reported_state: str | None = None
        self._account_id: str | None = None
        self._running = False
        self._thread: threading.Thread | None = None
        #: Why the last ``run()`` ended: "stopped", "replaced", "interrupted" or None.
        self.end_reason: str | None = None
        #: The exception ``run()`` raised when it ran in ``run_in_thread()``.
        self.error: BaseException | None = None
        #: Counters, for logs and tests.
        self.stats: dict[str, int] = {
            "sessions": 0,
            "handled": 0,
            "duplicates": 0,
            "handler_errors": 0,
            "acks": 0,
            "ack_failures": 0,
            "reconnects": 0,
        }

    # -- registration ------------------------------------------------------------------------
    def on_message(self, fn: Handler) -> Handler:
        """Decorator: ``fn(event)`` is called for every ``deliver`` and ``steer``."""
        self._handler = fn
        return fn

    def on_session(self, fn: Callable[[str], Any]) -> Callable[[str], Any]:
        """Decorator: ``fn(session_id)`` is called each time a session starts."""
        self._session_hooks.append(fn)
        return fn

    # -- properties ----------------------------------------------------------------------------
    @property
    def session_id(self) -> str | None:
        """The live session's id, or None between connections."""
        return self._session_id

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Block until a session is live (True) or ``timeout`` passes (False)."""
        return self._connected.wait(timeout)

    # -- running -------------------------------------------------------------------------------
    def run(self) -> None:
        """Hold the session open and hand messages to the handler until ``stop()``,
        Ctrl-C, or a replacement by another connection (with ``on_replaced="stop"``).

        Raises ``AuthError`` for a bad token, ``APIError`` for another refusal that
        retrying cannot fix, ``ServerUnavailable`` after ``give_up_after``."""
        if self._handler is None:
            raise ClientError("no handler: decorate one with @agent.on_message")
        with self._lock:
            if self._running:
                raise ClientError("this agent is already running")
            self._running = True
        self.end_reason = None
        try:
            self._run_loop()
        except KeyboardInterrupt:
            self.end_reason = "interrupted"
            log.info("interrupted; the session is closed")
        finally:
            self._connected.clear()
            self._stop.clear()  # a stop() applies to the run it interrupted (or the next one)
            with self._lock:
                self._running = False
                self._session_id = None
                self._response = None

    def run_in_thread(self, *, name: str = "tidings-agent") -> threading.Thread:
        """Start ``run()`` on a daemon thread; ``stop()`` ends it, ``wait()`` joins it."""
        self.error = None
        thread = threading.Thread(target=self._run_captured, name=name, daemon=True)
        self._thread = thread
        thread.start()
        return thread

    def _run_captured(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # noqa: BLE001 - handed to wait()
            self.error = exc
            log.error("agent stopped with an error: %r", exc)

    def wait(self, timeout: float | None = None) -> bool:
        """Join the ``run_in_thread()`` thread; re-raise the error ``run()`` raised.
        False when ``timeout`` passed with the thread still running."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                return False
        if self.error is not None:
            raise self.error
        return True

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop ``run()`` (from any thread, a handler or a signal handler). A handler in
        progress finishes and its message is acked; then the stream is closed, which ends
        the session. Joins the ``run_in_thread()`` thread, up to ``timeout``."""
        self._stop.set()
        self._interrupt_stream()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def reconnect(self) -> None:
        """Drop the current stream and open a new session at once (no backoff). The server
        then sends again everything unacked, e.g. messages whose handler raised."""
        with self._lock:
            self._reconnect_requested = True
        self._interrupt_stream()

    def close(self) -> None:
        """Stop and release the HTTP connections."""
        self.stop()
        self._http.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _interrupt_stream(self) -> None:
        """Wake a reader blocked on the socket: shut the socket down under it."""
        with self._lock:
            response = self._response
        if response is None:
            return
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass
        else:  # no socket to shut down (an exotic transport): close the response instead
            try:
                response.close()
            except Exception:  # noqa: BLE001 - best effort from another thread
                pass

    def _sleep(self, seconds: float) -> None:
        if self._sleep_fn is None:
            self._stop.wait(seconds)
        else:
            self._sleep_fn(seconds)

    # -- the reconnect loop ----------------------------------------------------------------------
    def _run_loop(self) -> None:
        attempt = 0
        down_since: float | None = None
        while not self._stop.is_set():
            outcome = self._session_once()
            if self._stop.is_set() or outcome.kind == "stopped":
                self.end_reason = "stopped"
                return
            if outcome.kind == "ended" and outcome.detail == "replaced" and self.on_replaced == "stop":
                log.warning("another connection of this agent replaced this session; stopping")
                self.end_reason = "replaced"
                return
            self.stats["reconnects"] += 1
            if outcome.kind == "requested":
                attempt, down_since = 0, None
                continue
            if outcome.connected:
                attempt, down_since = 0, None
            now = self._clock()
            if down_since is None:
                down_since = now
            elif self.give_up_after is not None and now - down_since >= self.give_up_after:
                raise ServerUnavailable(
                    f"no session for {now - down_since:.1f} s (last: {outcome.detail or outcome.kind})"
                )
            delay = self.backoff.delay(attempt, self._rng)
            attempt += 1
            log.warning("session %s (%s); reconnecting in %.2f s", outcome.kind, outcome.detail, delay)
            self._sleep(delay)
        self.end_reason = "stopped"

    def _session_once(self) -> _Outcome:
        with self._lock:
            self._reconnect_requested = False
        connected = False
        try:
            with self._http.stream(
                "GET",
                "/api/v1/session",
                headers={"Accept": "text/event-stream"},
                timeout=httpx.Timeout(self._http.timeout.connect, read=self.read_timeout),
            ) as response:
                if response.status_code != 200:
                    response.read()
                    error = _error_from(response)
                    if response.status_code in _RETRYABLE_STATUS:
                        return _Outcome("lost", str(error))
                    raise error  # AuthError and other refusals a retry cannot fix
                content_type = response.headers.get("content-type", "")
                if not content_type.startswith("text/event-stream"):
                    raise APIError(200, "not_a_stream", f"{self.url} answered {content_type or 'no content type'}, "
                                   "not text/event-stream: is this a Tidings hub?")
                with self._lock:
                    self._response = response
                if self._stop.is_set():  # stop()/reconnect() just before _response was set
                    return _Outcome("stopped")
                if self._reconnect_requested:
                    return _Outcome("requested")
                parser = SSEParser()
                for chunk in response.iter_bytes():
                    for sse in parser.feed(chunk):
                        outcome = self._on_sse(sse)
                        if outcome is not None:
                            outcome.connected = outcome.connected or connected
                            return outcome
                        connected = connected or self._session_id is not None
                        if self._stop.is_set():
                            return _Outcome("stopped", connected=connected)
                        if self._reconnect_requested:
                            return _Outcome("requested", connected=connected)
                    if not parser.partial:
                        self._settle_if_needed()
                if self._reconnect_requested:
                    return _Outcome("requested", connected=connected)
                return _Outcome("lost", "the server closed the stream", connected=connected)
        except httpx.TransportError as exc:
            if self._stop.is_set():
                return _Outcome("stopped", connected=connected)
            if self._reconnect_requested:
                return _Outcome("requested", connected=connected)
            return _Outcome("lost", f"{type(exc).__name__}: {exc}", connected=connected)
        finally:
            self._connected.clear()
            with self._lock:
                self._response = None
                self._session_id = None
                self._in_turn = False
                self._needs_settle = False

    # -- one event ----------------------------------------------------------------------------
    def _on_sse(self, sse: SSEEvent) -> _Outcome | None:
        try:
            data = json.loads(sse.data) if sse.data else {}
        except ValueError:
            log.error("undecodable %s event ignored: %r", sse.event, sse.data[:200])
            return None
        kind = sse.event if sse.event != "message" else str(data.get("type", "message"))
        if kind == "session":
            self._on_session_started(str(data.get("session_id") or ""))
        elif kind in ("deliver", "steer"):
            self._on_dispatch(kind, data)
        elif kind == "end":
            reason = str(data.get("reason") or "")
            log.info("the server ended the session (%s)", reason)
            return _Outcome("ended", reason, connected=True)
        else:
            log.debug("unknown event %r ignored", kind)
        return None

    def _on_session_started(self, session_id: str) -> None:
        with self._lock:
            self._session_id = session_id or None
            self._reported_state = None
            self._in_turn = False
            self._needs_settle = False
        self.stats["sessions"] += 1
        self._connected.set()
        log.info("session %s started", session_id)
        self._flush_pending_acks()
        for hook in self._session_hooks:
            try:
                hook(session_id)
            except Exception:  # noqa: BLE001 - a hook must not break the session
                log.exception("on_session hook raised")

    def _on_dispatch(self, kind: str, data: dict[str, Any]) -> None:
        message = data.get("message")
        if not isinstance(message, dict) or not isinstance(message.get("id"), str) or not message["id"]:
            log.error("a %s without a message id was ignored (not acked): %r", kind, data)
            return
        message_id = message["id"]
        if message_id in self._seen:
            # At-least-once: handled before, maybe in an earlier session. Not handed to the
            # handler again, but acked again: the first ack may have been lost.
            self._seen.touch(message_id)
            self.stats["duplicates"] += 1
            log.debug("duplicate %s %s re-acked, not handled again", kind, message_id)
            self._ack_quietly(message_id)
            return
        event = Event(kind, message, str(data.get("channel_id") or message.get("channel_id") or ""), self._session_id,
                      data.get("mentions_you") is True)
        self._begin_turn()
        try:
            assert self._handler is not None
            self._handler(event)
        except Exception:  # noqa: BLE001 - the user's code; the message comes back later
            self.stats["handler_errors"] += 1
            log.exception(
                "handler raised on %s %s; left unacked, the server sends it again next session",
                kind,
                message_id,
            )
            return
        self.stats["handled"] += 1
        self._seen.add(message_id)
        self._ack_quietly(message_id)

    # -- turn state ----------------------------------------------------------------------------
    def _begin_turn(self) -> None:
        if not self.auto_state:
            return
        with self._lock:
            self._in_turn = True
            report = self._reported_state != "working"
        if report:
            self._report_state("working")

    def _settle_if_needed(self) -> None:
        """Everything received so far is handled: report ``ready`` if a turn ran or one of
        our posts is waiting for it."""
        if not self.auto_state:
            return
        with self._lock:
            needed = self._in_turn or self._needs_settle
            self._in_turn = False
            self._needs_settle = False
        if needed:
            self._report_state("ready")

    def _after_own_post(self) -> None:
        """The server holds our posts while our session is live, until ``ready``."""
        if not self.auto_state:
            return
        with self._lock:
            if self._session_id is None:
                return  # no live session: the post is routed at once
            if self._in_turn:
                self._needs_settle = True
                return
        self._report_state("ready")

    def set_state(self, state: str) -> bool:
        """Report the turn state (``working``, ``ready`` or ``stopped``) of the live
        session. ``ready``/``stopped`` routes the posts this agent made during its turn.
        False when there is no live session."""
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}")
        return self._report_state(state)

    def _report_state(self, state: str) -> bool:
        with self._lock:
            session_id = self._session_id
        if session_id is None:
            return False
        try:
            self._call("POST", f"/api/v1/session/{session_id}/state", json={"state": state}, retries=0)
        except NotFoundError:
            log.debug("state %s not reported: session %s is gone", state, session_id)
            return False
        except AuthError:
            raise
        except ClientError as exc:
            log.warning("state %s not reported: %s", state, exc)
            return False
        with self._lock:
            if self._session_id == session_id:
                self._reported_state = state
        return True

    # -- acks ------------------------------------------------------------------------------------
    def ack(self, message_id: str) -> dict[str, Any]:
        """Ack a message yourself (``run()`` does it for you after the handler returns)."""
        return self._call("POST", "/api/v1/ack", json={"message_id": message_id})

    def _ack_quietly(self, message_id: str) -> None:
        """Ack from the run loop: a network failure or a 5xx keeps the id for a later retry;
        an AuthError (the token was revoked) stops ``run()``; another refusal is logged."""
        if not self._send_ack(message_id):
            self.stats["ack_failures"] += 1
            with self._lock:
                self._pending_acks[message_id] = None
                while len(self._pending_acks) > self._seen.capacity:
                    self._pending_acks.popitem(last=False)
            return
        with self._lock:
            self._pending_acks.pop(message_id, None)
            retry = bool(self._pending_acks)
        if retry:
            self._flush_pending_acks()

    def _send_ack(self, message_id: str) -> bool:
        """True when the ack is settled (accepted, or refused for good); False to retry."""
        try:
            self._call("POST", "/api/v1/ack", json={"message_id": message_id}, retries=0)
        except AuthError:
            raise
        except APIError as exc:
            if exc.status in _RETRYABLE_STATUS:
                log.warning("ack of %s failed (%s); retried later", message_id, exc)
                return False
            log.warning("ack of %s refused: %s", message_id, exc)
            return True
        except ClientError as exc:
            log.warning("ack of %s failed (%s); retried later", message_id, exc)
            return False
        self.stats["acks"] += 1
        return True

    def _flush_pending_acks(self) -> None:
        with self._lock:
            pending = list(self._pending_acks)
        for message_id in pending:
            if not self._send_ack(message_id):
                return  # still failing: keep the rest for the next try
            with self._lock:
                self._pending_acks.pop(message_id, None)

    # -- helpers -----------------------------------------------------------------------------------
    def post(
        self,
        channel_id: str,
        text: str | None = None,
        *,
        blocks: list[dict[str, Any]] | None = None,
        topic: str | None = None,
        client_request_id: str | None = None,
    ) -> dict[str, Any]:
        """Post into a channel; returns the stored ``Message``. Idempotent: the request
        carries a ``client_request_id`` (a fresh one unless given) and a retry after a
        network error reuses it, so a post is stored once however often it is sent."""
        body: dict[str, Any] = {"client_request_id": client_request_id or f"tdgc_{uuid.uuid4().hex}"}
        if text is not None:
            body["text"] = text
        if blocks is not None:
            body["blocks"] = blocks
        if topic is not None:
            body["topic"] = topic
        result = self._call("POST", f"/api/v1/channels/{channel_id}/messages", json=body)
        self._after_own_post()
        return result["message"]

    def read(self, channel_id: str, after_seq: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Messages of a channel with ``seq > after_seq``, ascending."""
        params: dict[str, Any] = {"after_seq": after_seq}
        if limit is not None:
            params["limit"] = limit
        return self._call("GET", f"/api/v1/channels/{channel_id}/messages", params=params)["messages"]

    def owed(self) -> list[dict[str, Any]]:
        """This agent's owed mentions: ``[{"message_id", "channel_id", "seq"}]``."""
        return self._call("GET", f"/api/v1/agents/{self.account_id}/owed")["owed"]

    def channels(self) -> list[dict[str, Any]]:
        """The channels this agent can see."""
        return self._call("GET", "/api/v1/channels")["channels"]

    def me(self) -> dict[str, Any]:
        """``GET /api/v1/me``: the token's scope and account."""
        return self._call("GET", "/api/v1/me")

    @property
    def account_id(self) -> str:
        """This agent's account id (asked once, then remembered)."""
        if self._account_id is None:
            account = self.me().get("account") or {}
            if not account.get("id"):
                raise AuthError(403, "agent_only", "this token is not an account's token")
            self._account_id = account["id"]
        return self._account_id

    def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        retries: int | None = None,
    ) -> dict[str, Any]:
        """One request with a few retries on network errors and 5xx/429 (backoff through
        the injectable sleep); an error envelope becomes an ``APIError``."""
        tries = 1 + (self.request_retries if retries is None else retries)
        last: ClientError | None = None
        for attempt in range(tries):
            if attempt:
                self._sleep(self.backoff.delay(attempt - 1, self._rng))
            try:
                response = self._http.request(method, path, json=json, params=params)
            except httpx.TransportError as exc:
                last = ServerUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}")
                continue
            if response.status_code < 400:
                return response.json() if response.content else {}
            error = _error_from(response)
            if response.status_code not in _RETRYABLE_STATUS:
                raise error
            last = error
        assert last is not None
        raise last

