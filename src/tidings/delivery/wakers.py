"""Wakers: nudge an offline agent to come back, off the delivery path.

A wake is a latency improvement, never a guarantee: the durable state (the agent's cursor,
its owed mentions) is what the agent's next session is swept from, whether or not a wake
worked. So wakes are best-effort and must never hold up delivery.

**Wakes never run on the consumer loop:** waking inline there would stall every delivery
behind a slow wake's round trip. Here the
consumer only calls ``WakeDispatcher.request``, which checks the per-agent coalescing
window and appends to a bounded queue; a few worker threads run the actual wakes. A wake
that hangs blocks one worker until its timeout, never the consumer. Requests are
coalesced per agent: at most one per agent per ``coalesce_ms`` of clock time (default
5 s). When the queue is full a request is dropped and counted (the agent's durable state
is unaffected).

Two built-in kinds, from the agent's ``wake`` setting:
* ``{"webhook": url}``: POST ``{"agent_id", "reason"}`` with a timeout; 2xx is success;
* ``{"command": [argv...]}``: spawned with ``TIDINGS_AGENT_ID`` (and ``TIDINGS_WAKE_REASON``)
  in its environment, detached, never waited for by anyone on the delivery path (finished
  children are reaped by the worker on later wakes).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import httpx
import structlog

from ..clock import Clock
from ..counters import Counters

log = structlog.get_logger("tidings.delivery")


class Waker(Protocol):
    def wake(self, agent_id: str, config: dict[str, Any] | None, reason: str) -> bool | None:
        """Wake the agent. True: done; False: tried and failed; None: nothing configured."""


class SystemWaker:
    """The production waker: webhook POST or detached command, per the agent's setting."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self._http: httpx.Client | None = None
        self._children: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()

    def wake(self, agent_id: str, config: dict[str, Any] | None, reason: str) -> bool | None:
        if not config:
            return None
        if "webhook" in config:
            return self._webhook(config["webhook"], agent_id, reason)
        if "command" in config:
            return self._command(config["command"], agent_id, reason)
        return None

    def _webhook(self, url: str, agent_id: str, reason: str) -> bool:
        with self._lock:
            if self._http is None:
                self._http = httpx.Client(timeout=self.timeout_s)
            client = self._http
        response = client.post(url, json={"agent_id": agent_id, "reason": reason})
        return 200 <= response.status_code < 300

    def _command(self, argv: list[str], agent_id: str, reason: str) -> bool:
        env = {**os.environ, "TIDINGS_AGENT_ID": agent_id, "TIDINGS_WAKE_REASON": reason}
        child = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        with self._lock:
            self._children = [c for c in self._children if c.poll() is None]
            self._children.append(child)
        return True

    def close(self) -> None:
        with self._lock:
            if self._http is not None:
                self._http.close()
                self._http = None


class WakeRequests(Protocol):
    """Where the consumer's wake requests go: the ``WakeDispatcher``, or (cluster) the
    leader's through ``engine._LeaderWakes``."""

    def request(self, agent_id: str, wake_json: str | None, reason: str) -> object: ...


class WakeDispatcher:
    """Coalesces wake requests per agent and runs them on worker threads (or ``run_pending``
    in synchronous mode)."""

    def __init__(
        self,
        waker: Waker,
        *,
        clock: Clock,
        counters: Counters,
        is_live: Callable[[str], bool],
        coalesce_ms: int = 5_000,
        threads: int = 2,
        queue_max: int = 4096,
        threaded: bool = True,
    ) -> None:
        self.waker = waker
        self.clock = clock
        self.counters = counters
        self.is_live = is_live
        self.coalesce_ms = coalesce_ms
        self.threads = threads
        self.queue_max = queue_max
        self.threaded = threaded
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque[tuple[str, str | None, str]] = deque()
        self._last: dict[str, int] = {}
        self._workers: list[threading.Thread] = []
        self._stopping = False
        self._running = 0

    # -- the consumer's side: never blocks ---------------------------------------------------
    def request(self, agent_id: str, wake_json: str | None, reason: str) -> bool:
        """Queue a wake unless one was queued for this agent within the window."""
        now = self.clock.now_ms()
        with self._lock:
            last = self._last.get(agent_id)
            if last is not None and now - last < self.coalesce_ms:
                coalesced = True
            elif len(self._queue) >= self.queue_max:
                self.counters.incr("wakes_dropped")
                return False
            else:
                coalesced = False
                self._last[agent_id] = now
                if len(self._last) > 65_536:  # forget agents whose window has long passed
                    self._last = {a: t for a, t in self._last.items() if now - t < self.coalesce_ms}
                self._queue.append((agent_id, wake_json, reason))
                self._cond.notify_all()
        if coalesced:
            self.counters.incr("wakes_coalesced")
            return False
        return True

    # -- running wakes ---------------------------------------------------------------------
    def _run_one(self, agent_id: str, wake_json: str | None, reason: str) -> None:
        bound = log.bind(agent_id=agent_id, reason=reason)
        if self.is_live(agent_id):
            self.counters.incr("wakes_skipped")
            return
        try:
            config = json.loads(wake_json) if wake_json else None
            outcome = self.waker.wake(agent_id, config, reason)
        except Exception as exc:  # noqa: BLE001 - a broken waker is counted, never raised
            self.counters.incr("wake_failures")
            bound.warning("wake failed", error=repr(exc))
            return
        if outcome is None:
            self.counters.incr("wakes_skipped")
        elif outcome:
            self.counters.incr("woken")
            bound.info("agent woken")
        else:
            self.counters.incr("wake_failures")
            bound.warning("wake refused")

    def run_pending(self) -> int:
        """Run every queued wake on the calling thread (synchronous mode)."""
        done = 0
        while True:
            with self._lock:
                if not self._queue:
                    return done
                item = self._queue.popleft()
            self._run_one(*item)
            done += 1

    def pending(self) -> int:
        with self._lock:
            return len(self._queue) + self._running

    def _worker(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                item = self._queue.popleft()
                self._running += 1
            try:
                self._run_one(*item)
            finally:
                with self._lock:
                    self._running -= 1
                    self._cond.notify_all()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        with self._lock:
            return self._cond.wait_for(lambda: not self._queue and self._running == 0, timeout)

    def start(self) -> None:
        if not self.threaded or self._workers:
            return
        for i in range(self.threads):
            t = threading.Thread(target=self._worker, name=f"tidings-waker-{i}", daemon=True)
            t.start()
            self._workers.append(t)

    def stop(self, timeout: float = 2.0) -> None:
        with self._lock:
            self._stopping = True
            self._cond.notify_all()
        for t in self._workers:
            t.join(timeout)  # a hung webhook is bounded by its own timeout; daemon otherwise
        self._workers = []
        close = getattr(self.waker, "close", None)
        if close is not None:
            close()
