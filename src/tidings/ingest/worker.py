"""The ingest worker: one thread that drains the inbox into the projection.

When it drains
  At start (crash recovery: whatever a previous process left unprocessed is retried at
  once), on every append notification, and when the earliest retry timer fires. With a
  ``FakeClock`` the timer is the clock's listener (moving the clock wakes the thread);
  with the real clock it is the wait's timeout.

How it drains (spec ingest-reference §2.3, our code)
  From the zero cursor it pages *positions only*, ``PAGE_SIZE`` = 256 at a time, with the
  row-value cursor ``(received_at_ms, inbox_id) > (:after_ms, :after_id)`` over the
  partial index of unprocessed rows, and loads one frame at a time by primary key. A
  deferred frame whose retry time has not come is passed over without being loaded or
  decoded. After the walk, retry entries of frames no longer listed (processed elsewhere)
  are pruned.

One frame, one transaction (spec README, difference 5)
  Load, decode, project and mark ``outcome='applied'`` run in ONE write transaction: the
  projection's rows and the processed mark commit together or not at all. A transient
  database error (``store.engine.is_transient``) rolls everything back and the whole
  attempt (decode included) is tried again, 4 tries 5/10/20 ms apart; after that the
  frame is deferred in process (``backoff.py``). Anything else is deterministic: the
  transaction rolls back and, in a transaction of its own, the frame is marked
  ``outcome='quarantined'`` with its cause (difference 6: queryable, not just logged).

Apply on append (``AppendApplier`` / ``insert_applied``, used by ``Ingest.append``)
  The append transaction may apply the frames it stores, through the same ``_apply`` as
  the drain, each inside a SAVEPOINT, when the bridge has no older unprocessed frame
  except frames waiting out their backoff (the drain passes those too), so receipt order
  is kept exactly as the drain keeps it. Applied: the inbox row is inserted already marked applied,
  together with the projection, in the append's one commit. A deterministic failure: the
  savepoint rolls back and the row is inserted quarantined with its cause, in that same
  transaction. A transient failure: the savepoint rolls back and the row is inserted
  unprocessed for this worker (``LEFT``); the append commits either way. The outcome
  classification is the drain's (``is_transient``, ``cause_of``), not a copy.

Grouping (throughput option)
  With ``group_size > 1`` several consecutive ready frames share one transaction, each
  inside its own SAVEPOINT, so a failing frame rolls back only its own work. A transient
  error ends the group: what came before it commits, the rest go through the one-frame
  path. A failed group commit replays the group one frame at a time. Default 1.

Counters
  The projection counts into a staged copy that is added to the bridge's counters only
  once its transaction committed, so the counters never report rolled-back work.
  ``decoded_events`` counts every successful decode (retries count again), ``deferred``
  counts exhausted attempts, not frames waiting (that is ``deferred_now``).

Test seams: ``decode`` and ``project`` callables (defaults: the real decoders and
projection, imported lazily), ``sleep`` (the 5/10/20 ms in-attempt sleeps), ``clock``,
``retry_base_ms``/``retry_max_ms``, ``page_size``, and the fault point ``ingest.busy``.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import structlog

from .. import metrics
from ..clock import Clock
from ..counters import Counters
from ..faults import Faults
from ..store import inbox as inbox_store
from . import cluster_drain
from ..store.engine import Dedicated, Store, Tx, is_integrity_error, is_transient
from .backoff import ATTEMPTS, RETRY_BASE_MS, RETRY_MAX_MS, TRANSIENT_SLEEPS_MS, RetrySchedule
from .counters import INGEST_COUNTERS, BridgeCounters

log = structlog.get_logger("tidings.ingest")

PAGE_SIZE = 256
MAX_CAUSE = 2000
FAULT_BUSY = "ingest.busy"

# Outcomes of one frame.
APPLIED = "applied"
QUARANTINED = "quarantined"
DEFERRED = "deferred"
GONE = "gone"  # processed elsewhere between listing and loading (or in between tries)
SKIPPED = "skipped"  # deferred and not due yet: not loaded, not decoded
LEFT = "left"  # apply on append failed transiently: left unprocessed for the worker
DUPLICATE = "duplicate"  # apply on append: the dedupe key was already stored
HELD = "held"  # apply on append: an older frame of the bridge must go first; stored unprocessed

Decode = Callable[[str, int, Any], list]
Project = Callable[[Tx, Any, list], bool]


class FrameRejected(Exception):
    """A deterministic failure found by the worker itself; ``cause`` is what is stored."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class _Gone(Exception):
    """The frame was processed by someone else while this attempt ran (roll back)."""


class _Unavailable(Exception):
    """The projection module is not part of this build: leave every frame unprocessed."""


class _HeldUp(Exception):
    """Apply on append found, after its speculative insert, that the frame must wait."""


class _AttemptFailed(Exception):
    """Carries an attempt's error out of a savepoint that rolled back cleanly."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


class _Attempt:
    """What one attempt learned about its frame (for counters and logs after a failure).

    Kept per call, not on the worker, so the drain thread and apply-on-append callers on
    request threads never share it.
    """

    __slots__ = ("bridge_id", "codec")

    def __init__(self) -> None:
        self.bridge_id: str | None = None
        self.codec: str | None = None


@dataclass(slots=True)
class _FallbackContext:
    """Same fields as ``projection.ProjectionContext``, for builds and tests without it."""

    bridge_id: str
    platform: str
    inbox_id: str
    received_at_ms: int
    now_ms: int
    counters: Counters
    on_message: Callable | None = None


_COUNTER_NAMES = frozenset(INGEST_COUNTERS)


class StagedCounters(Counters):
    """A frame's counts, held until its transaction commits, then added to the bridge's.

    Used by the one thread that runs the frame's transaction (and its ``after_commit``
    callbacks), so it holds only the names counted so far and takes no lock; an unknown
    name still fails loudly, as with any ``Counters``."""

    __slots__ = ("target",)

    def __init__(self, target: Counters) -> None:
        self._values = {}
        self.target = target

    def incr(self, name: str, by: int = 1) -> None:
        if name not in _COUNTER_NAMES:
            raise KeyError(f"unknown counter {name!r}")
        values = self._values
        values[name] = values.get(name, 0) + by

    def get(self, name: str) -> int:
        if name not in _COUNTER_NAMES:
            raise KeyError(name)
        return self._values.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        values = self._values
        return {name: values.get(name, 0) for name in INGEST_COUNTERS}

    def commit(self) -> None:
        target = self.target
        for name, value in self._values.items():
            if value:
                target.incr(name, value)


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


def cause_of(exc: BaseException, stage: str = "") -> str:
    """The cause stored with a quarantined frame: short, one line, storable on both backends."""
    if isinstance(exc, FrameRejected):
        text = exc.cause
    else:
        name = type(exc).__name__
        try:
            from .decoders import DecodeError
        except ImportError:  # pragma: no cover
            DecodeError = ()  # type: ignore[assignment]
        try:
            from .projection import ProjectionError  # type: ignore[attr-defined]
        except ImportError:
            ProjectionError = ()  # type: ignore[assignment]
        if stage == "decode":
            text = f"decode: {exc}" if isinstance(exc, DecodeError) else f"decoder failed ({name}): {exc}"
        elif isinstance(exc, ProjectionError):
            text = f"projection: {exc}"
        elif is_integrity_error(exc):
            text = f"projection rejected by the database ({name}): {exc}"
        else:
            text = f"internal error ({name}): {exc}"
    text = " ".join(text.replace("\x00", "").split())
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_CAUSE:
        text = text[: MAX_CAUSE - 1] + "…"
    return text or "unknown error"


def busy_error(dialect: str) -> Exception:
    """The transient database error the ``ingest.busy`` fault raises, per backend."""
    if dialect == "postgresql":
        from psycopg import errors as pgerr

        return pgerr.SerializationFailure(f"could not serialize access (fault {FAULT_BUSY})")
    exc = sqlite3.OperationalError(f"database is locked (fault {FAULT_BUSY})")
    exc.sqlite_errorcode = 5  # SQLITE_BUSY
    return exc


class Worker:
    """Drains the inbox; ``start()`` runs it on its own thread, ``drain()`` runs one pass."""

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
        on_message: Callable | None = None,
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
        self.on_message = on_message
        self._decode = decode
        self._project = project
        self._validate = validate
        self._codec_platforms = codec_platforms
        self._ctx_type: Any = None
        self._resolved = False
        self._unavailable_logged = False
        self._platforms: dict[str, str] = {}  # bridge id -> platform (bridges never change or go)
        #: Cluster (PostgreSQL, several nodes draining one inbox): each drained frame takes its
        #: bridge's lock first (``cluster_drain``). Set by ``cluster.node.attach``.
        self.across_nodes = False
        self._decode_objects = False  # the decoder takes a parsed payload object (decode_frame)
        self._conn: Dedicated | None = None
        self._cur = _Attempt()  # the drain thread's current frame (counters, logs)
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
    def _resolve(self) -> None:
        if self._resolved:
            return
        from .decoders import DECODERS, decode_frame

        if self._codec_platforms is None:
            self._codec_platforms = {codec: dec.platform for codec, dec in DECODERS.items()}
        if self._decode is None:
            self._decode = decode_frame
        # decode_frame takes the payload's text or the object it is the text of; a test
        # seam gets the stored text, as it always has.
        self._decode_objects = self._decode is decode_frame
        if self._validate is None:
            # decode_frame validates every event it returns; anything else is checked here.
            self._validate = self._decode is not decode_frame
        try:
            from . import projection  # type: ignore[attr-defined]
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.projection":
                raise
            projection = None
        if self._project is None:
            if projection is None:
                raise _Unavailable("the projection module is not part of this build")
            self._project = projection.project_frame
        self._ctx_type = getattr(projection, "ProjectionContext", None) or _FallbackContext
        self._resolved = True

    def _connection(self) -> Dedicated:
        if self._conn is None:
            self._conn = self.store.dedicated()
        return self._conn

    def _recover(self, exc: BaseException) -> None:
        """After a transient error: take a fresh connection if the old one is broken."""
        conn = self._conn
        if conn is None or self.store.dialect != "postgresql":
            return
        dbapi = conn.dbapi
        if getattr(dbapi, "closed", False) or getattr(dbapi, "broken", False):
            try:
                conn.reconnect()
            except Exception as again:  # noqa: BLE001 - next try reports it
                log.warning("ingest reconnect failed", error=str(again))

    def _sleep_ms(self, ms: int) -> None:
        self.sleep(ms / 1000.0)

    # -- the drain -------------------------------------------------------------------------
    def drain(self, on_frame: Callable[[str, str], None] | None = None) -> DrainStats:
        """One full pass over the unprocessed frames (see the module docstring)."""
        with self._drain_lock:
            try:
                self._resolve()
            except _Unavailable as exc:
                if not self._unavailable_logged:
                    self._unavailable_logged = True
                    log.error("ingest worker idle: frames stay in the inbox", reason=str(exc))
                return DrainStats(complete=False)
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
        for attempt in range(ATTEMPTS):
            if attempt:
                self._sleep_ms(TRANSIENT_SLEEPS_MS[attempt - 1])
            try:
                with conn.read() as tx:
                    return inbox_store.unprocessed_after(tx, after_ms, after_id, self.page_size)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self._recover(exc)
                last = exc
        log.warning("could not list unprocessed ingest frames; retrying later", error=str(last))
        return None

    # -- one frame ---------------------------------------------------------------------------
    def _process_one(self, inbox_id: str, first_try: int = 0) -> str:
        conn = self._connection()
        self._cur = _Attempt()
        last: BaseException | None = None
        for attempt in range(first_try, ATTEMPTS):
            if attempt:
                self._sleep_ms(TRANSIENT_SLEEPS_MS[attempt - 1])
            try:
                with conn.write() as tx:
                    outcome, staged = self._apply(tx, inbox_id, self._cur)
            except _Gone:
                return GONE
            except Exception as exc:
                if is_transient(exc):
                    self._recover(exc)
                    last = exc
                    if attempt < ATTEMPTS - 1 and self._cur.bridge_id is not None:
                        self.counters.of(self._cur.bridge_id).incr("transient_retries")
                    continue
                return self._quarantine(inbox_id, exc)
            if staged is not None:
                staged.commit()
                staged.target.incr("projected")
            return outcome
        self._deferred(inbox_id, last)
        return DEFERRED

    def bridge_platform(self, tx: Tx, bridge_id: str) -> str | None:
        """The bridge's platform, or None for an unknown bridge (not remembered).

        Remembered per process once read: a bridge is never deleted and its platform
        never changes (no statement of the store updates or deletes ``bridges``)."""
        platform = self._platforms.get(bridge_id)
        if platform is None:
            platform = inbox_store.bridge_platform(tx, bridge_id)
            if platform is not None:
                self._platforms[bridge_id] = platform
        return platform

    @metrics.timed_frame_apply
    def _apply(
        self, tx: Tx, inbox_id: str, att: _Attempt, row: tuple | None = None, mark: bool = True,
        doc: Any = None,
    ) -> tuple[str, StagedCounters | None]:
        """Load, decode and project one frame inside ``tx``; mark it applied.

        THE one implementation of "apply one frame", for the drain and for apply on append
        (which passes the ``row`` it is inserting instead of loading it, ``mark=False``
        because that row is inserted already marked, and ``doc``, the parsed object the
        row's payload text was made from, so the decoder does not parse it again). Raises
        ``FrameRejected`` (or any deterministic error) to quarantine, a transient database
        error to retry, ``_Gone`` when someone else finished the frame first.
        """
        claimed = row is None
        if claimed:  # load it and mark it applied in one statement (rolled back on failure)
            if self.across_nodes:  # cluster: the bridge's lock first, one frame at a time (cluster_drain)
                row = cluster_drain.claim_frame(tx, inbox_id, self.clock.now_ms())
            else:
                row = inbox_store.claim_unprocessed(tx, inbox_id, self.clock.now_ms())
            if row is None:
                return GONE, None
        bridge_id, codec, codec_version, received_at_ms, payload = row
        if doc is not None and self._decode_objects:
            payload = doc
        att.bridge_id, att.codec = bridge_id, codec
        platform = self.bridge_platform(tx, bridge_id)
        expected = self._codec_platforms.get(codec)  # type: ignore[union-attr]
        if expected is not None and expected != platform:
            raise FrameRejected(
                f"codec {codec!r} carries {expected} frames but bridge {bridge_id} is a {platform} bridge"
            )
        counters = self.counters.of(bridge_id)
        try:
            events = self._decode(codec, codec_version, payload)  # type: ignore[misc]
        except Exception as exc:
            raise FrameRejected(cause_of(exc, "decode")) from exc
        if type(events) is not list:
            raise FrameRejected(f"decode: the decoder returned {type(events).__name__}, not a list of events")
        counters.incr("decoded_events", len(events))
        if self._validate:
            self._check_events(events)
        if self.faults.fire(FAULT_BUSY):
            raise busy_error(tx.dialect)
        staged = StagedCounters(counters)
        ctx = self._ctx_type(
            bridge_id=bridge_id,
            platform=platform,
            inbox_id=inbox_id,
            received_at_ms=received_at_ms,
            now_ms=self.clock.now_ms(),
            counters=staged,
            on_message=self.on_message,
        )
        self._project(tx, ctx, events)  # type: ignore[misc]
        if mark and not claimed and not inbox_store.mark_applied(tx, inbox_id, self.clock.now_ms()):
            raise _Gone()
        return APPLIED, staged

    @staticmethod
    def _check_events(events: list) -> None:
        from .events import InvalidEvent, validate_event

        for i, ev in enumerate(events):
            try:
                validate_event(ev)
            except InvalidEvent as exc:
                raise FrameRejected(f"invalid event {i}: {exc}") from exc

    def _quarantine(self, inbox_id: str, exc: BaseException) -> str:
        cause = cause_of(exc)
        bridge_id, codec = self._cur.bridge_id, self._cur.codec
        conn = self._connection()
        last: BaseException | None = None
        for attempt in range(ATTEMPTS):
            if attempt:
                self._sleep_ms(TRANSIENT_SLEEPS_MS[attempt - 1])
            try:
                with conn.write() as tx:
                    marked = inbox_store.mark_quarantined(tx, inbox_id, self.clock.now_ms(), cause)
            except Exception as again:
                if is_transient(again):
                    self._recover(again)
                    last = again
                    continue
                log.error(
                    "could not quarantine ingest frame; retrying later",
                    inbox_id=inbox_id, bridge_id=bridge_id, cause=cause, error=f"{type(again).__name__}: {again}",
                )
                return self._deferred(inbox_id, again, count=False)
            if not marked:
                return GONE
            self._quarantined(inbox_id, bridge_id, codec, cause)
            return QUARANTINED
        return self._deferred(inbox_id, last)

    def _quarantined(self, inbox_id: str, bridge_id: str | None, codec: str | None, cause: str) -> None:
        if bridge_id is not None:
            self.counters.of(bridge_id).incr("quarantined")
        log.warning("ingest frame quarantined", inbox_id=inbox_id, bridge_id=bridge_id, codec=codec, cause=cause)

    def _deferred(self, inbox_id: str, exc: BaseException | None, count: bool = True) -> str:
        bridge_id = self._cur.bridge_id or self._bridge_of(inbox_id)
        if count and bridge_id is not None:
            self.counters.of(bridge_id).incr("deferred")
        log.warning(
            "ingest frame exhausted its transient retries; left unprocessed for a later retry",
            inbox_id=inbox_id, bridge_id=bridge_id, error=str(exc),
        )
        return DEFERRED

    def _bridge_of(self, inbox_id: str) -> str | None:
        try:
            with self.store.read() as tx:
                row = inbox_store.frame_state(tx, inbox_id)
        except Exception:  # noqa: BLE001 - only used to attribute a counter
            return None
        return None if row is None else row["bridge_id"]

    # -- apply on append ---------------------------------------------------------------------
    def appender(self, bridge_id: str, received_at_ms: int) -> "AppendApplier":
        """The ``insert`` step of one append transaction that applies what it appends."""
        return AppendApplier(self, bridge_id, received_at_ms)

    def held_up(self, tx: Tx, bridge_id: str, received_at_ms: int, inbox_id: str) -> bool:
        """True when a frame of ``bridge_id`` appended as ``(received_at_ms, inbox_id)`` must
        wait for the drain: the bridge has an older unprocessed frame that this worker is not
        backing off. A frame waiting out its backoff does not hold it up, since the drain
        passes it too (D5); any other older frame must be applied first (receipt order).
        Reads the backoff schedule from another thread: only membership and times."""
        retries = self.retries
        deferred = len(retries)
        older = inbox_store.older_unprocessed(tx, bridge_id, received_at_ms, inbox_id, deferred + 1)
        if len(older) > deferred:
            return True
        now = self.clock.now_ms()
        return not all(retries.waiting(i, now) for i in older)

    def read_ahead_held_up(self, tx: Tx, bridge_id: str, received_at_ms: int, inbox_id: str) -> None:
        """Announce ``held_up``'s read (``Tx.read_ahead``); it then costs no round trip of its own."""
        inbox_store.read_ahead_older_unprocessed(tx, bridge_id, received_at_ms, inbox_id, len(self.retries) + 1)

    def insert_applied(
        self, tx: Tx, inbox_id: str, bridge_id: str, frame: Any, received_at_ms: int,
        held_up: Callable[[], bool] | None = None,
    ) -> str:
        """Insert a new frame and apply it, in one SAVEPOINT of the caller's transaction.

        The inbox row is written once, already carrying its outcome: ``APPLIED`` (the
        projection and the row together; counters added once ``tx`` commits). On failure
        the savepoint takes the row back with the projection, and the row is written again
        as the drain would have left it: ``QUARANTINED`` with its cause (a deterministic
        failure) or unprocessed, ``LEFT`` for the drain (a transient one). ``DUPLICATE``:
        the bridge's dedupe key is already stored; nothing was written. Safe on any thread:
        it touches no per-frame state of the worker. An error that breaks ``tx`` itself
        propagates; the caller's transaction is then lost.

        ``held_up`` (PostgreSQL's apply on append): asked right after the insert, inside the
        savepoint; True rolls the savepoint back and stores the row unprocessed (``HELD``).
        So the order check's read rides in the insert's round trip (``AppendApplier``).
        """
        row = (bridge_id, frame.codec, frame.codec_version, received_at_ms, frame.payload)
        try:
            self._resolve()
        except _Unavailable:
            return LEFT if self._insert(tx, inbox_id, row, frame) else DUPLICATE
        now = self.clock.now_ms()
        att = _Attempt()
        try:
            with tx.savepoint():
                try:
                    if not self._insert(tx, inbox_id, row, frame, processed_at_ms=now, outcome=APPLIED):
                        return DUPLICATE
                    if held_up is not None and held_up():
                        raise _HeldUp()
                    _outcome, staged = self._apply(
                        tx, inbox_id, att, row, mark=False, doc=getattr(frame, "doc", None)
                    )
                except Exception as exc:
                    raise _AttemptFailed(exc) from exc
        except _AttemptFailed as failed:
            # The savepoint was rolled back cleanly (had that failed too, its own error would
            # have propagated instead): ``tx`` is as it was before this frame.
            exc = failed.exc
            if isinstance(exc, _HeldUp):
                self._insert(tx, inbox_id, row, frame)
                return HELD
            if is_transient(exc):
                log.info(
                    "transient error applying a frame on append; the worker retries it",
                    inbox_id=inbox_id, bridge_id=bridge_id, error=f"{type(exc).__name__}: {exc}",
                )
                self._insert(tx, inbox_id, row, frame)
                counters = self.counters.of(bridge_id)
                tx.after_commit(lambda: counters.incr("left_for_worker"))
                return LEFT
            cause = cause_of(exc)
            self._insert(tx, inbox_id, row, frame, processed_at_ms=now, outcome=QUARANTINED, cause=cause)
            codec = att.codec

            def quarantined() -> None:
                self._quarantined(inbox_id, bridge_id, codec, cause)
                self.counters.of(bridge_id).incr("applied_on_append")

            tx.after_commit(quarantined)
            return QUARANTINED

        def applied() -> None:
            if staged is not None:
                staged.commit()
                staged.target.incr("projected")
                staged.target.incr("applied_on_append")

        tx.after_commit(applied)
        return APPLIED

    @staticmethod
    def _insert(tx: Tx, inbox_id: str, row: tuple, frame: Any, **outcome: Any) -> bool:
        bridge_id, codec, codec_version, received_at_ms, payload = row
        return inbox_store.insert_frame(
            tx, inbox_id=inbox_id, bridge_id=bridge_id, dedupe_key=frame.dedupe_key, codec=codec,
            codec_version=codec_version, received_at_ms=received_at_ms,
            client_received_at_ms=frame.client_received_at_ms, payload=payload, **outcome,
        )

    # -- groups ------------------------------------------------------------------------------
    def _run_group(
        self, ids: list[str], stats: DrainStats, on_frame: Callable[[str, str], None] | None
    ) -> None:
        for inbox_id, outcome in self._process_group(ids):
            self._finish(inbox_id, outcome, stats, on_frame)

    def _process_group(self, ids: list[str]) -> list[tuple[str, str]]:
        """Several frames in one transaction, a SAVEPOINT each (see the module docstring)."""
        if len(ids) == 1:
            return [(ids[0], self._process_one(ids[0]))]
        conn = self._connection()
        done: list[tuple[str, str]] = []
        staged_all: list[StagedCounters] = []
        quarantined: list[tuple[str, str | None, str | None, str]] = []
        leftover: list[str] = []
        try:
            with conn.write() as tx:
                for index, inbox_id in enumerate(ids):
                    self._cur = _Attempt()
                    try:
                        with tx.savepoint():
                            outcome, staged = self._apply(tx, inbox_id, self._cur)
                    except _Gone:
                        done.append((inbox_id, GONE))
                        continue
                    except Exception as exc:
                        if is_transient(exc):
                            if self._cur.bridge_id is not None:
                                self.counters.of(self._cur.bridge_id).incr("transient_retries")
                            leftover = ids[index:]
                            break
                        cause = cause_of(exc)
                        with tx.savepoint():
                            marked = inbox_store.mark_quarantined(tx, inbox_id, self.clock.now_ms(), cause)
                        if marked:
                            quarantined.append((inbox_id, self._cur.bridge_id, self._cur.codec, cause))
                            done.append((inbox_id, QUARANTINED))
                        else:
                            done.append((inbox_id, GONE))
                        continue
                    done.append((inbox_id, outcome))
                    if staged is not None:
                        staged_all.append(staged)
        except Exception as exc:  # nothing of the group committed: one frame at a time
            if not is_transient(exc):
                log.error("ingest group failed; replaying it frame by frame", error=f"{type(exc).__name__}: {exc}")
            self._recover(exc)
            return [(inbox_id, self._process_one(inbox_id)) for inbox_id in ids]
        for staged in staged_all:
            staged.commit()
            staged.target.incr("projected")
        for inbox_id, bridge_id, codec, cause in quarantined:
            self._quarantined(inbox_id, bridge_id, codec, cause)
        if leftover:
            done.append((leftover[0], self._process_one(leftover[0], first_try=1)))
            done.extend((inbox_id, self._process_one(inbox_id)) for inbox_id in leftover[1:])
        return done


class AppendApplier:
    """Apply on append, for one append transaction (``Worker.appender``).

    ``append_frames`` calls it to store each new frame. Frames are applied in order while
    the bridge has no older unprocessed frame other than those the worker is backing off
    (``Worker.held_up``, checked once, before the first); from the first frame left to the
    drain on, the rest are stored unprocessed too, so the drain takes them in receipt
    order. ``left`` counts the new frames left unprocessed.
    """

    __slots__ = ("worker", "bridge_id", "received_at_ms", "applying", "left")

    def __init__(self, worker: Worker, bridge_id: str, received_at_ms: int) -> None:
        self.worker = worker
        self.bridge_id = bridge_id
        self.received_at_ms = received_at_ms
        self.applying: bool | None = None
        self.left = 0

    def __call__(self, tx: Tx, inbox_id: str, frame: Any) -> bool:
        """Store ``frame`` as ``inbox_id`` (applied if it may be); False for a duplicate."""
        if self.applying is None and tx.dialect == "postgresql":
            # Speculate: insert it applied, with the order check's read in the same round
            # trip, and take it back if it turns out held up (rare).
            worker, bridge_id, received_at_ms = self.worker, self.bridge_id, self.received_at_ms
            worker.read_ahead_held_up(tx, bridge_id, received_at_ms, inbox_id)
            outcome = worker.insert_applied(
                tx, inbox_id, bridge_id, frame, received_at_ms,
                held_up=lambda: worker.held_up(tx, bridge_id, received_at_ms, inbox_id),
            )
            if outcome == DUPLICATE:
                return False  # not decided yet: the next new frame asks again
            self.applying = outcome not in (HELD, LEFT)
            if not self.applying:
                self.left += 1
            return True
        if self.applying is None:
            self.applying = not self.worker.held_up(tx, self.bridge_id, self.received_at_ms, inbox_id)
        if self.applying:
            outcome = self.worker.insert_applied(tx, inbox_id, self.bridge_id, frame, self.received_at_ms)
            if outcome == DUPLICATE:
                return False
            if outcome == LEFT:
                self.applying = False
                self.left += 1
            return True
        row = (self.bridge_id, frame.codec, frame.codec_version, self.received_at_ms, frame.payload)
        inserted = self.worker._insert(tx, inbox_id, row, frame)
        if inserted:
            self.left += 1
        return inserted
