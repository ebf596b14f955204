"""The ingest worker: one thread that drains the inbox into the projection.

When it drains
  At start (crash recovery: whatever a previous process left unprocessed is retried at
  once), on every append notification, and when the earliest retry timer fires. With a
  ``FakeClock`` the timer is the clock's listener (moving the clock wakes the thread);
  with the real clock it is the wait's timeout.

How it drains
  From the zero cursor it pages *positions only*, ``PAGE_SIZE`` = 256 at a time, with the
  row-value cursor ``(received_at_ms, inbox_id) > (:after_ms, :after_id)`` over the
  partial index of unprocessed rows, and loads one frame at a time by primary key. A
  deferred frame whose retry time has not come is passed over without being loaded or
  decoded (no round trip of its own); one whose time has come gets its retry round, one
  try, on its own (never inside a group). After the walk, retry entries of frames no
  longer listed (processed elsewhere) are pruned.

One frame, one transaction
  Load, decode, project and mark ``outcome='applied'`` run in ONE write transaction: the
  projection's rows and the processed mark commit together or not at all. The claim
  brings the row back and the frame takes its bridge's lock (D117); the decoded frame's
  rows are read in one round trip (D115), and on PostgreSQL its writes wait for the
  ``COMMIT`` (D106); a write that fails there fails the frame
  with the database's own error, as it would have failed at once. A transient
  database error (``store.engine.is_transient``) rolls everything back and the whole
  attempt (decode included) is tried again, 4 tries 5/10/20 ms apart; after that the
  frame is deferred in process (``backoff.py``), and each of its retry rounds is one try.
  Anything else is deterministic: the transaction rolls back and, in a transaction of its
  own, the frame is marked ``outcome='quarantined'`` with its cause (difference 6:
  queryable, not just logged).

Where the rest lives
  ``apply.py``: the one "apply one frame" path, the cause classification and the staged
  counters (the projection's counts are added to the bridge's only once its transaction
  committed). ``on_append.py``: apply on append. ``grouping.py``: several frames per
  transaction, one batch a bridge (``group_size > 1``; D118). ``store/retry.py``: the
  transient-retry loop (``attempt``) and the reconnect after an error.

Counters and logs
  ``decoded_events`` counts every successful decode (retries count again), ``deferred``
  counts exhausted attempts (failed rounds), not frames waiting (that is ``deferred_now``).
  A frame's failed rounds 1, 2, 4, 8, ... are logged (``failed_rounds``), not every one.

Test seams: ``decode`` and ``project`` callables (defaults: the real decoders and
projection), ``sleep`` (the 5/10/20 ms in-attempt sleeps), ``clock``,
``retry_base_ms``/``retry_max_ms``, ``page_size``, and the fault point ``ingest.busy``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import structlog

from ..clock import Clock
from ..faults import Faults
from ..store import inbox as inbox_store
from ..store.engine import Dedicated, Store, Tx, WriteBehindFailed
from ..store.retry import TransientExhausted, attempt
from .apply import (
    APPLIED,
    DEFERRED,
    DUPLICATE,
    FAULT_BUSY,
    GONE,
    LEFT,
    MAX_CAUSE,
    QUARANTINED,
    SKIPPED,
    Attempt,
    Decode,
    FrameApplier,
    FrameRejected,
    Gone,
    Outcome,
    Project,
    StagedCounters,
    busy_error,
    cause_of,
)
from .backoff import ATTEMPTS, RETRY_BASE_MS, RETRY_MAX_MS, TRANSIENT_SLEEPS_MS, RetrySchedule
from .counters import BridgeCounters
from .grouping import process_group
from .on_append import AppendApplier

log = structlog.get_logger("tidings.ingest")

PAGE_SIZE = 256

#: Names other modules and tests import from here.
__all__ = [
    "APPLIED", "DEFERRED", "DUPLICATE", "FAULT_BUSY", "GONE", "LEFT", "MAX_CAUSE", "PAGE_SIZE", "QUARANTINED",
    "SKIPPED", "AppendApplier", "Decode", "DrainStats", "FrameRejected", "Outcome", "Project", "StagedCounters",
    "Worker", "busy_error", "cause_of",
]


@dataclass(slots=True)
class DrainStats:
    listed: int = 0
    applied: int = 0
    quarantined: int = 0
    deferred: int = 0
    skipped: int = 0
    gone: int = 0
    pruned: int = 0
    complete: bool = True  # False when a page could not be listed (the walk stopped early)
    outcomes: dict[str, str] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)


class Worker:
    """Drains the inbox; ``start()`` runs it on its own thread, ``drain()`` runs one pass.

    Applying a frame is ``self.applier`` (``apply.FrameApplier``, which holds the
    ``decode``/``project`` seams); this class owns the thread, the timers and the walk.
    """

    def __init__(
        self,
        store: Store,
        *,
        counters: BridgeCounters | None = None,
        faults: Faults | None = None,
        clock: Clock | None = None,
        decode: Decode | None = None,
        project: Project | None = None,
        validate: bool | None = None,
        sleep: Callable[[float], None] | None = None,
        page_size: int = PAGE_SIZE,
        group_size: int = 1,
        retry_base_ms: int = RETRY_BASE_MS,
        retry_max_ms: int = RETRY_MAX_MS,
        codec_platforms: dict[str, str] | None = None,
        on_message: Callable[..., Any] | None = None,
    ) -> None:
        if page_size < 1 or group_size < 1:
            raise ValueError("page_size and group_size must be at least 1")
        self.store = store
        self.clock = clock or store.clock
        self.faults = faults if faults is not None else store.faults
        self.counters = counters if counters is not None else BridgeCounters()
        self.page_size = page_size
        self.group_size = group_size
        self.sleep = sleep or time.sleep
        self.retries = RetrySchedule(retry_base_ms, retry_max_ms)
        self.applier = FrameApplier(
            clock=self.clock, faults=self.faults, counters=self.counters, decode=decode, project=project,
            validate=validate, codec_platforms=codec_platforms, on_message=on_message,
        )
        #: A drained frame, or group, sends its projection's writes behind (``Tx.later``;
        #: PostgreSQL, D106); its rows are read in one round trip either way (D115, D118).
        self.write_behind = True
        self._conn: Dedicated | None = None
        self._cur = Attempt()  # the drain thread's current frame (counters, logs)
        self._listed_retries: list[str] = []
        # thread
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._stopping = False
        self._pending = False
        self._pause_until: int | None = None
        self._drain_lock = threading.Lock()
        self._drained = threading.Condition()
        self.drains = 0

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def across_nodes(self) -> bool:
        """Cluster: drained frames take their bridge's lock (``cluster_drain``); set by
        ``cluster.node.attach``."""
        return self.applier.across_nodes

    @across_nodes.setter
    def across_nodes(self, value: bool) -> None:
        self.applier.across_nodes = value

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping = False
        self._pending = True  # the start drain
        self.clock.add_listener(self._on_clock)
        self._thread = threading.Thread(target=self._run, name="tidings-ingest", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        thread = self._thread
        alive = False
        if thread is not None:
            self._stopping = True
            self._wake.set()
            thread.join(timeout)
            alive = thread.is_alive()
            self._thread = None
            self.clock.remove_listener(self._on_clock)
        with self._drain_lock:
            if not alive:
                self._stopping = False  # a later synchronous drain() may run again
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def notify(self) -> None:
        """Frames were appended: drain soon (cheap; callable from any thread)."""
        self._pending = True
        self._wake.set()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Block until ``predicate()`` holds after some drain (tests, CLI); True if it did."""
        with self._drained:
            return self._drained.wait_for(predicate, timeout)

    def _on_clock(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            try:
                if self.drain_if_due() is not None:
                    continue
            except Exception as exc:  # noqa: BLE001 - the thread must survive anything
                log.error("ingest drain failed; retrying later", error=f"{type(exc).__name__}: {exc}")
                self._pause_until = self.clock.now_ms() + self.retries.base_ms
                continue
            self._wake.wait(self._wait_timeout())
            self._wake.clear()

    def drain_if_due(self, on_frame: Callable[[str, str], None] | None = None) -> DrainStats | None:
        """What the run loop does when it wakes: drain once if an append notified it or a
        retry timer is due, else nothing (None). The replay harness pumps the worker with it
        on the caller's thread; not while the thread runs."""
        if not (self._pending or self._timer_due()):
            return None
        self._pending = False
        stats = self.drain(on_frame)
        if not stats.complete:
            self._pause_until = self.clock.now_ms() + self.retries.base_ms
        return stats

    def _next_timer(self) -> int | None:
        # After a failed drain the pause rules, or a due retry entry would spin the loop.
        if self._pause_until is not None:
            return self._pause_until
        return self.retries.earliest()

    def _timer_due(self) -> bool:
        when = self._next_timer()
        if when is None or self.clock.now_ms() < when:
            return False
        self._pause_until = None
        return True

    def _wait_timeout(self) -> float | None:
        when = self._next_timer()
        if when is None or self.clock.is_fake:
            return None  # a fake clock's listener wakes us when it moves
        return max(0.0, (when - self.clock.now_ms()) / 1000.0)

    # -- wiring ----------------------------------------------------------------------------
    def _connection(self) -> Dedicated:
        if self._conn is None:
            self._conn = self.store.dedicated()
        return self._conn

    def _attempt(self, fn: Callable[[], Any], *, first_try: int = 0, tries: int = ATTEMPTS,
                 on_retry: Callable[[BaseException], None] | None = None) -> Any:
        """``store.retry.attempt`` on this worker's connection, with its sleeps."""
        return attempt(fn, conn=self._conn, sleep=self.sleep, tries=tries, sleeps_ms=TRANSIENT_SLEEPS_MS,
                       first_try=first_try, on_retry=on_retry)

    def bridge_platform(self, tx: Tx, bridge_id: str) -> str | None:
        """The bridge's platform, or None for an unknown bridge (``FrameApplier``)."""
        return self.applier.bridge_platform(tx, bridge_id)

    # -- the drain -------------------------------------------------------------------------
    def drain(self, on_frame: Callable[[str, str], None] | None = None) -> DrainStats:
        """One full pass over the unprocessed frames (see the module docstring)."""
        with self._drain_lock:
            try:
                return self._drain(on_frame)
            finally:
                with self._drained:
                    self.drains += 1
                    self._drained.notify_all()

    def _drain(self, on_frame: Callable[[str, str], None] | None) -> DrainStats:
        stats = DrainStats()
        retries = self.retries
        now = self.clock.now_ms()
        after_ms, after_id = 0, ""
        # Retry entries to keep: frames listed by this walk (deferred before, or just now).
        listed_retries = self._listed_retries = []
        batch: list[str] = []
        while True:
            page = self._list_page(after_ms, after_id)
            if page is None:
                stats.complete = False
                return stats
            for _received, inbox_id in page:
                if self._stopping:  # shutting down: stop between frames, prune nothing
                    stats.complete = False
                    return stats
                stats.listed += 1
                if inbox_id in retries:
                    listed_retries.append(inbox_id)
                    if retries.waiting(inbox_id, now):
                        stats.skipped += 1
                        continue
                    # Its retry round: one try, alone (after the group before it, in order).
                    if batch:
                        self._run_group(batch, stats, on_frame)
                        batch = []
                    self._finish(inbox_id, self._process_one(inbox_id), stats, on_frame)
                    continue
                if self.group_size == 1:
                    self._finish(inbox_id, self._process_one(inbox_id), stats, on_frame)
                else:
                    batch.append(inbox_id)
                    if len(batch) >= self.group_size:
                        self._run_group(batch, stats, on_frame)
                        batch = []
            if batch:
                self._run_group(batch, stats, on_frame)
                batch = []
            if len(page) < self.page_size:
                break
            after_ms, after_id = page[-1]
        stats.pruned = retries.prune(listed_retries)
        return stats

    def _finish(
        self, inbox_id: str, outcome: str, stats: DrainStats, on_frame: Callable[[str, str], None] | None
    ) -> None:
        if outcome == DEFERRED:
            self.retries.defer(inbox_id, self.clock.now_ms())
            self._listed_retries.append(inbox_id)
        else:
            self.retries.forget(inbox_id)
        stats.count(outcome)
        if on_frame is not None:
            on_frame(inbox_id, outcome)

    def _list_page(self, after_ms: int, after_id: str) -> list[tuple[int, str]] | None:
        conn = self._connection()

        def read() -> list[tuple[int, str]]:
            # One statement: no snapshot to share, so no BEGIN or ROLLBACK (PostgreSQL).
            with conn.autocommit_read() as tx:
                return inbox_store.unprocessed_after(tx, after_ms, after_id, self.page_size)

        try:
            page: list[tuple[int, str]] = self._attempt(read)
        except TransientExhausted as exhausted:
            log.warning("could not list unprocessed ingest frames; retrying later", error=str(exhausted.last))
            return None
        return page

    # -- one frame ---------------------------------------------------------------------------
    def _process_one(self, inbox_id: str, first_try: int = 0) -> Outcome:
        conn = self._connection()
        att = self._cur = Attempt()

        def once() -> tuple[Outcome, StagedCounters | None]:
            try:
                with conn.write() as tx:
                    tx.write_behind = self.write_behind and tx.dialect == "postgresql"
                    return self.applier.apply(tx, inbox_id, att)
            except WriteBehindFailed as failed:
                # The frame is the whole transaction, so the failure is this frame's, and it
                # is the database's error that says retry or quarantine (and why), as eager.
                raise failed.__cause__ or failed from None

        def retried(_exc: BaseException) -> None:
            self.applier.retried(att)

        try:
            outcome, staged = self._attempt(
                once, first_try=first_try, tries=self.retries.tries_for(inbox_id), on_retry=retried
            )
        except Gone:
            return GONE
        except TransientExhausted as exhausted:
            self._deferred(inbox_id, exhausted.last)
            return DEFERRED
        except Exception as exc:  # noqa: BLE001 - deterministic: the frame is quarantined
            return self._quarantine(inbox_id, exc)
        if staged is not None:
            staged.commit("projected")
        return cast(Outcome, outcome)

    def _quarantine(self, inbox_id: str, exc: BaseException) -> Outcome:
        cause = cause_of(exc)
        bridge_id, codec = self._cur.bridge_id, self._cur.codec
        conn = self._connection()

        def mark() -> bool:
            with conn.write() as tx:
                return inbox_store.mark_quarantined(tx, inbox_id, self.clock.now_ms(), cause)

        try:
            marked = self._attempt(mark)
        except TransientExhausted as exhausted:
            return self._deferred(inbox_id, exhausted.last)
        except Exception as again:  # noqa: BLE001 - left unprocessed for a later retry
            log.error(
                "could not quarantine ingest frame; retrying later",
                inbox_id=inbox_id, bridge_id=bridge_id, cause=cause, error=f"{type(again).__name__}: {again}",
            )
            return self._deferred(inbox_id, again, count=False)
        if not marked:
            return GONE
        self.applier.quarantined(inbox_id, bridge_id, codec, cause)
        return QUARANTINED

    def _deferred(self, inbox_id: str, exc: BaseException | None, count: bool = True) -> Outcome:
        """Count a failed round (``deferred``); log rounds 1, 2, 4, 8, ... of the frame only,
        so a frame stuck for days logs a few lines, not one per retry round."""
        bridge_id = self._cur.bridge_id or self._bridge_of(inbox_id)
        if count and bridge_id is not None:
            self.counters.of(bridge_id).incr("deferred")
        entry = self.retries.get(inbox_id)
        failed_rounds = 1 if entry is None else entry.failures + 1
        if failed_rounds & (failed_rounds - 1) == 0:
            log.warning(
                "ingest frame exhausted its transient retries; left unprocessed for a later retry",
                inbox_id=inbox_id, bridge_id=bridge_id, failed_rounds=failed_rounds, error=str(exc),
            )
        return DEFERRED

    def _bridge_of(self, inbox_id: str) -> str | None:
        try:
            with self.store.read() as tx:
                row = inbox_store.frame_state(tx, inbox_id)
        except Exception:  # noqa: BLE001 - only used to attribute a counter
            return None
        return None if row is None else row["bridge_id"]

    # -- apply on append and groups ---------------------------------------------------------
    def appender(self, bridge_id: str, received_at_ms: int) -> AppendApplier:
        """The ``insert`` step of one append transaction that applies what it appends."""
        return AppendApplier(self.applier, self.retries, bridge_id, received_at_ms)

    def _run_group(
        self, ids: list[str], stats: DrainStats, on_frame: Callable[[str, str], None] | None
    ) -> None:
        done = process_group(ids, conn=self._connection(), applier=self.applier, process_one=self._process_one,
                             write_behind=self.write_behind)
        for inbox_id, outcome in done:
            self._finish(inbox_id, outcome, stats, on_frame)
