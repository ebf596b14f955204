"""SQLite's WAL checkpoints, run beside the writer instead of inside a commit (D128).

A checkpoint copies the pages the WAL holds back into the database file. SQLite runs one
itself in the connection whose commit takes the WAL past ``wal_autocheckpoint`` pages, and
with ``synchronous=NORMAL`` that checkpoint syncs the WAL and the database file: the commit
that happens to cross the line waits milliseconds, while its neighbours take tens of
microseconds. Here the store counts its write commits (``committed``, under the writer
lock) and every ``every`` of them wakes one thread, which runs a ``PASSIVE`` checkpoint on a
connection of its own, kept while the thread lives (a new connection would read the schema
again at each run).

Guarantees:

* **Durability is SQLite's.** A checkpoint moves committed pages from one file to the other;
  it never decides what is committed. A crash during one leaves the WAL, which SQLite
  replays as it does after any crash.
* **A commit never waits for the thread.** ``PASSIVE`` takes neither the writer lock nor a
  reader's: it copies what no reader still needs and returns.
* **The WAL stays bounded.** Every connection keeps SQLite's own automatic checkpoint as a
  backstop at ``BACKSTOP_PAGES`` (``_sqlite_on_connect``). Should the thread fall behind,
  fail or never start, a commit checkpoints as before, only at a larger WAL.
* **A failure is counted and logged, never raised into a commit.** The next wake tries again.
* **The thread is started by the first wake and stopped by ``Store.dispose``.** A store
  that commits fewer than ``every`` times never starts one.

Figures (``status()``): the counters ``runs``, ``busy`` (runs that left pages in the WAL
uncopied, because a reader still needed them or a commit came in meanwhile) and
``failures``, and ``wal_pages``, the pages the WAL held at the last run (since it last
started over).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import structlog

from ..faults import Faults
from ..wakeups import WakeSignal

log = structlog.get_logger("tidings.store")

#: Write commits between two checkpoints of the thread. A lone frame's commit writes about
#: seven pages, so this is about 700 pages, near SQLite's own default of 1,000.
EVERY_COMMITS = 100

#: SQLite's automatic checkpoint on every connection: the backstop, in WAL pages (16 MiB
#: at 4 KiB a page). Four times SQLite's default, so the thread does nearly all the work.
BACKSTOP_PAGES = 4000

#: Fault point: the thread's checkpoint fails.
FAULT_CHECKPOINT = "store.checkpoint"


class Checkpointer:
    """The checkpoint thread of one SQLite store (``Store.checkpointer``)."""

    def __init__(self, path: str, faults: Faults, every: int = EVERY_COMMITS) -> None:
        if every < 1:
            raise ValueError("every must be at least 1")
        self.path = path
        self.faults = faults
        self.every = every
        self.enabled = True  # False: commits wake nothing (the replay harness measures the WAL)
        self._since = 0  # commits since the last wake; changed under the store's writer lock
        self._wake = WakeSignal()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._conn: sqlite3.Connection | None = None  # the thread's, opened at its first run
        self.runs = 0
        self.wal_pages = 0
        self.busy = 0
        self.failures = 0

    @property
    def requested(self) -> int:
        """Wakes asked for so far: by commits, and one by ``close``."""
        return self._wake.generation()

    def committed(self) -> None:
        """A write transaction of the store committed (called under its writer lock)."""
        self._since += 1
        if self._since >= self.every and self.enabled:
            self._since = 0
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="tidings-checkpointer", daemon=True)
                self._thread.start()
            self._wake.bump()

    def run_once(self) -> None:
        """One ``PASSIVE`` checkpoint on the thread's connection; a failure is counted and
        logged."""
        try:
            if self.faults.fire(FAULT_CHECKPOINT):
                raise sqlite3.OperationalError("fault: store.checkpoint")
            if self._conn is None:
                self._conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
            busy, wal_pages, copied = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except Exception as exc:  # noqa: BLE001 - the thread must live; the backstop still holds
            self._disconnect()  # (the next run starts on a fresh connection)
            with self._cond:
                self.runs += 1
                self.failures += 1
                self._cond.notify_all()
            log.warning("WAL checkpoint failed; the next one retries", path=self.path, error=repr(exc))
            return
        with self._cond:
            self.runs += 1
            self.wal_pages = wal_pages
            self.busy += 1 if busy or copied < wal_pages else 0
            self._cond.notify_all()

    def wait_for(self, condition: Callable[[Checkpointer], bool], timeout: float) -> bool:
        """Block until ``condition(self)`` holds after a run (tests, tools); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: condition(self), timeout)

    def status(self) -> dict[str, Any]:
        with self._cond:
            return {"runs": self.runs, "busy": self.busy, "failures": self.failures, "wal_pages": self.wal_pages}

    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def close(self) -> None:
        """Stop the thread (after the run it is in, if any); later commits start none."""
        self._stop.set()
        self._wake.bump()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=10)

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection  # pragma: no cover
                pass

    def _run(self) -> None:
        seen = 0  # (the wake that started this thread is the generation past it)
        try:
            while True:
                seen = self._wake.wait(seen, None)
                if self._stop.is_set():
                    return
                self.run_once()
        finally:
            self._disconnect()
