"""The background pass that keeps the SQLite search index caught up (``store.search_index``).

One thread in the running hub (``Runtime`` starts it on SQLite only). It runs a pass when
it starts (whatever a crash or another process left queued), then whenever a commit that
queued indexed text wakes it (``search_index.SIGNAL``), after waiting ``delay_ms`` so the
changes of many commits go into one FTS5 commit, and at least every ``idle_ms`` (writes
by another process wake nobody here). A pass is ``search_index.catch_up_all``: one write
transaction per batch, so a failure rolls its batch back and the next pass retries it.

The pass is an optimisation of search latency and of the ingest path's cost, never a
correctness condition: every search catches up first on its own.

Counters (``status()``, in ``GET /api/status`` as ``search_index``): ``passes``,
``indexed`` (queued changes consumed), ``failures``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog

from ..store import search_index
from ..store.engine import Store
from ..wakeups import WakeSignal

log = structlog.get_logger("tidings.search_indexer")

DELAY_MS = 50
IDLE_MS = 1_000


class SearchIndexer:
    def __init__(
        self,
        store: Store,
        *,
        delay_ms: int = DELAY_MS,
        idle_ms: int = IDLE_MS,
        signal: WakeSignal = search_index.SIGNAL,
    ) -> None:
        self.store = store
        self.delay_s = delay_ms / 1000
        self.idle_s = idle_ms / 1000
        self.signal = signal
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self.passes = 0
        self.indexed = 0
        self.failures = 0

    def start(self) -> None:
        if self._thread is not None or self.store.dialect != "sqlite":
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="tidings-search-indexer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.signal.bump()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=10)

    def run_once(self) -> int:
        """One pass: index everything pending; the queued changes consumed."""
        try:
            n = search_index.catch_up_all(self.store)
        except Exception as exc:  # noqa: BLE001 - the thread must live; the batch stays queued
            with self._cond:
                self.failures += 1
                self.passes += 1
                self._cond.notify_all()
            log.warning("search index catch-up failed", error=repr(exc))
            return 0
        with self._cond:
            self.passes += 1
            self.indexed += n
            self._cond.notify_all()
        return n

    def wait_for(self, condition: Callable[[SearchIndexer], bool], timeout: float) -> bool:
        """Block until ``condition(self)`` holds after a pass (tests, tools); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: condition(self), timeout)

    def status(self) -> dict[str, Any]:
        with self._cond:
            return {"passes": self.passes, "indexed": self.indexed, "failures": self.failures}

    def _run(self) -> None:
        seen = self.signal.generation()
        self.run_once()
        while not self._stop.is_set():
            now = self.signal.wait(seen, self.idle_s)
            if self._stop.is_set():
                return
            if now != seen and self.delay_s > 0 and self._stop.wait(self.delay_s):
                return
            seen = self.signal.generation()
            self.run_once()
