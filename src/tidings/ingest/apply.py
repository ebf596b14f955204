"""Apply one frame: THE one path from an inbox row to the projection, for the drain and
for apply on append, with the cause classification and the staged counters.

``FrameApplier.apply`` loads (or is handed) the row, checks the codec against the bridge's
platform, decodes, validates, projects and marks the row applied, all inside the caller's
transaction. It raises ``FrameRejected`` (or any deterministic error) to quarantine, a
transient database error to retry, ``Gone`` when someone else finished the frame first.
``cause_of`` turns an error into the cause stored with a quarantined frame. The
projection counts into ``StagedCounters``, added to the bridge's counters only once the
transaction committed, so the counters never report rolled-back work.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from enum import StrEnum
from typing import Any, NamedTuple, cast

import structlog
from psycopg import errors as pgerr

from .. import metrics
from ..clock import Clock
from ..counters import Counters
from ..faults import Faults
from ..store import inbox as inbox_store
from ..store.engine import Tx, is_integrity_error
from . import cluster_drain, projection
from .batch import Batch
from .counters import INGEST_COUNTERS, BridgeCounters
from .decoders import DECODERS, DecodeError, decode_frame
from .events import InvalidEvent, validate_event
from .projection import ProjectionContext, ProjectionError

log = structlog.get_logger("tidings.ingest")

MAX_CAUSE = 2000
FAULT_BUSY = "ingest.busy"


class Outcome(StrEnum):
    """What happened to one frame."""

    APPLIED = "applied"
    QUARANTINED = "quarantined"
    DEFERRED = "deferred"
    GONE = "gone"  # processed elsewhere between listing and loading (or in between tries)
    SKIPPED = "skipped"  # deferred and not due yet: not loaded, not decoded
    LEFT = "left"  # apply on append failed transiently: left unprocessed for the worker
    DUPLICATE = "duplicate"  # apply on append: the dedupe key was already stored
    HELD = "held"  # apply on append: an older frame of the bridge must go first; stored unprocessed


APPLIED = Outcome.APPLIED
QUARANTINED = Outcome.QUARANTINED
DEFERRED = Outcome.DEFERRED
GONE = Outcome.GONE
SKIPPED = Outcome.SKIPPED
LEFT = Outcome.LEFT
DUPLICATE = Outcome.DUPLICATE
HELD = Outcome.HELD

Decode = Callable[[str, int, Any], list[Any]]
Project = Callable[[Tx, Any, list[Any]], Any]
#: An inbox row as the apply path reads it: (bridge_id, codec, codec_version, received_at_ms, payload).
FrameRow = tuple[str, str, int, int, Any]


class Decoded(NamedTuple):
    """A frame decoded ahead of its apply (``FrameApplier.decode_ahead``): its events and
    its bridge's platform, or the error that ``apply`` raises for it."""

    events: list[Any] | None
    platform: str | None
    error: Exception | None


class _BatchedFrame:
    """``with tx.savepoint() if own else tx.callbacks(), batch.frame():`` as one object
    (a plain class: a frame's unit costs no generator)."""

    __slots__ = ("tx", "batch", "own", "outer", "inner")

    def __init__(self, tx: Tx, batch: Batch, own: bool) -> None:
        self.tx = tx
        self.batch = batch
        self.own = own

    def __enter__(self) -> None:
        outer = self.outer = self.tx.savepoint() if self.own else self.tx.callbacks()
        outer.__enter__()
        inner = self.inner = self.batch.frame()
        inner.__enter__()  # (takes the journal's mark: it cannot fail)

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool | None:
        try:
            self.inner.__exit__(kind, exc, tb)  # (rolls the journal back on error)
        except BaseException as failed:  # (as ``with`` would: the outer unit sees the new error)
            if self.outer.__exit__(type(failed), failed, failed.__traceback__):
                return True
            raise
        return self.outer.__exit__(kind, exc, tb)


def frame_scope(tx: Tx, batch: Batch | None, decoded: Decoded | None) -> tuple[AbstractContextManager[Any], bool]:
    """The unit one frame of a batch is applied in, and whether it is a savepoint of its own.

    A frame that may call the link hook (which reads and writes the store) gets a
    savepoint, once the rows of the batch's earlier frames are flushed; any other frame
    sends no statement of its own, and a failure is taken back by the batch's journal and
    ``Tx.callbacks`` (its counters). Without a batch (a projection test seam): a savepoint.
    A database error inside a unit that is not a savepoint leaves ``tx`` lost: the caller
    must not go on with it."""
    if batch is None:
        return tx.savepoint(), True
    own = decoded is not None and decoded.events is not None and projection.may_call_hook(batch, decoded.events)
    if own:
        batch.flush()
    return _BatchedFrame(tx, batch, own), own


class FrameRejected(Exception):
    """A deterministic failure found by the worker itself; ``cause`` is what is stored."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class Gone(Exception):
    """The frame was processed by someone else while this attempt ran (roll back)."""


class Attempt:
    """What one attempt learned about its frame (for counters and logs after a failure).

    Kept per call, not on the worker, so the drain thread and apply-on-append callers on
    request threads never share it.
    """

    __slots__ = ("bridge_id", "codec")

    def __init__(self) -> None:
        self.bridge_id: str | None = None
        self.codec: str | None = None


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

    def commit(self, *also: str) -> None:
        """Add the frame's counts, and one to each counter named in ``also``, to the
        target's, under one lock (the frame's transaction has committed)."""
        counts = {name: value for name, value in self._values.items() if value}
        for name in also:
            counts[name] = counts.get(name, 0) + 1
        self.target.add(counts)


def cause_of(exc: BaseException, stage: str = "") -> str:
    """The cause stored with a quarantined frame: short, one line, storable on both backends."""
    if isinstance(exc, FrameRejected):
        text = exc.cause
    else:
        name = type(exc).__name__
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
        return pgerr.SerializationFailure(f"could not serialize access (fault {FAULT_BUSY})")
    exc = sqlite3.OperationalError(f"database is locked (fault {FAULT_BUSY})")
    exc.sqlite_errorcode = 5  # SQLITE_BUSY
    return exc


def check_events(events: list[Any]) -> None:
    """Validate what a test-seam decoder returned (``decode_frame`` validates its own)."""
    for i, ev in enumerate(events):
        try:
            validate_event(ev)
        except InvalidEvent as exc:
            raise FrameRejected(f"invalid event {i}: {exc}") from exc


class FrameApplier:
    """Apply one frame inside a caller's transaction (see the module docstring).

    Test seams: ``decode`` and ``project`` (defaults: ``decode_frame`` and
    ``projection.project_frame``), ``validate``, ``codec_platforms``.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        faults: Faults,
        counters: BridgeCounters,
        decode: Decode | None = None,
        project: Project | None = None,
        validate: bool | None = None,
        codec_platforms: dict[str, str] | None = None,
        on_message: Callable[..., Any] | None = None,
    ) -> None:
        self.clock = clock
        self.faults = faults
        self.counters = counters
        self.on_message = on_message
        self.codec_platforms = (
            codec_platforms if codec_platforms is not None
            else {codec: dec.platform for codec, dec in DECODERS.items()}
        )
        self.decode: Decode = decode if decode is not None else decode_frame
        self.project: Project = project if project is not None else projection.project_frame
        # decode_frame takes the payload's text or the object it is the text of; a test
        # seam gets the stored text, as it always has.
        self.decode_objects = self.decode is decode_frame
        # decode_frame validates every event it returns; anything else is checked here.
        self.validate = validate if validate is not None else self.decode is not decode_frame
        self.platforms: dict[str, str] = {}  # bridge id -> platform (bridges never change or go)
        #: Cluster (PostgreSQL, several nodes draining one inbox): each drained frame takes its
        #: bridge's lock first (``cluster_drain``). Set through ``Worker.across_nodes``.
        self.across_nodes = False

    def bridge_platform(self, tx: Tx, bridge_id: str) -> str | None:
        """The bridge's platform, or None for an unknown bridge (not remembered).

        Remembered per process once read: a bridge is never deleted and its platform
        never changes (no statement of the store updates or deletes ``bridges``)."""
        platform = self.platforms.get(bridge_id)
        if platform is None:
            platform = inbox_store.bridge_platform(tx, bridge_id)
            if platform is not None:
                self.platforms[bridge_id] = platform
        return platform

    def decode_ahead(self, tx: Tx, att: Attempt, row: FrameRow, doc: Any = None) -> Decoded:
        """Decode ``row`` before its apply (apply on append decodes a request's frames
        first, so that one read brings the rows they all touch). Never raises: a failure
        is kept, and ``apply(decoded=...)`` raises it where ``apply`` would have raised it
        itself. Nothing is counted here."""
        try:
            events, platform = self._decode(tx, att, row, doc)
        except Exception as exc:  # noqa: BLE001 - raised by apply, in order
            return Decoded(None, None, exc)
        return Decoded(events, platform, None)

    def _decode(self, tx: Tx, att: Attempt, row: FrameRow, doc: Any) -> tuple[list[Any], str | None]:
        bridge_id, codec, codec_version, _received_at_ms, payload = row
        if doc is not None and self.decode_objects:
            payload = doc
        att.bridge_id, att.codec = bridge_id, codec
        platform = self.bridge_platform(tx, bridge_id)
        expected = self.codec_platforms.get(codec)
        if expected is not None and expected != platform:
            raise FrameRejected(
                f"codec {codec!r} carries {expected} frames but bridge {bridge_id} is a {platform} bridge"
            )
        try:
            events = self.decode(codec, codec_version, payload)
        except Exception as exc:
            raise FrameRejected(cause_of(exc, "decode")) from exc
        if type(events) is not list:
            raise FrameRejected(f"decode: the decoder returned {type(events).__name__}, not a list of events")
        return events, platform

    @metrics.timed_frame_apply
    def apply(
        self, tx: Tx, inbox_id: str, att: Attempt, row: FrameRow | None = None, mark: bool = True,
        doc: Any = None, decoded: Decoded | None = None, batch: Batch | None = None,
    ) -> tuple[Outcome, StagedCounters | None]:
        """Load, decode and project one frame inside ``tx``; mark it applied.

        THE one implementation of "apply one frame", for the drain and for apply on append
        (which passes the ``row`` it is inserting instead of loading it, ``mark=False``
        because that row is inserted already marked, ``doc``, the parsed object the row's
        payload text was made from, so the decoder does not parse it again, and the
        ``batch`` its frames are projected in, whose rows it read and flushes). Raises
        ``FrameRejected`` (or any deterministic error) to quarantine, a transient database
        error to retry, ``Gone`` when someone else finished the frame first.
        """
        claimed = row is None
        if row is None:  # load it and mark it applied in one statement (rolled back on failure)
            if self.across_nodes:  # cluster: drains of one bridge on several nodes, one frame at a time
                row = cluster_drain.claim_frame(tx, inbox_id, self.clock.now_ms())
            else:
                row = inbox_store.claim_unprocessed(tx, inbox_id, self.clock.now_ms())
                if row is not None:
                    # Every writer of a bridge's projection rows holds its lock (ingest/batch.py).
                    inbox_store.lock_bridge_appends(tx, row[0])
            if row is None:
                return GONE, None
        bridge_id, received_at_ms = row[0], row[3]
        if decoded is None:
            events, platform = self._decode(tx, att, row, doc)
        elif decoded.error is not None:
            raise decoded.error
        else:
            events, platform = cast("list[Any]", decoded.events), decoded.platform
        counters = self.counters.of(bridge_id)
        counters.incr("decoded_events", len(events))
        if self.validate:
            check_events(events)
        if self.faults.fire(FAULT_BUSY):
            raise busy_error(tx.dialect)
        staged = StagedCounters(counters)
        ctx = ProjectionContext(
            bridge_id=bridge_id,
            platform=cast(str, platform),  # an unknown bridge: the projection rejects it
            inbox_id=inbox_id,
            received_at_ms=received_at_ms,
            now_ms=self.clock.now_ms(),
            counters=staged,
            on_message=self.on_message,
            batch=batch,
        )
        self.project(tx, ctx, events)
        if mark and not claimed and not inbox_store.mark_applied(tx, inbox_id, self.clock.now_ms()):
            raise Gone()
        return APPLIED, staged

    def claim_group(self, tx: Tx, inbox_ids: list[str]) -> dict[str, FrameRow]:
        """Claim a drain group's frames in ``tx`` (load them and mark them applied, one
        statement) and take the lock of each of their bridges, sorted: inbox id -> row of
        those still unprocessed. In a cluster the locks come first, as ``claim_frame``'s
        (each frame's bridge read, then locked, then the frames claimed)."""
        if self.across_nodes:
            return cast("dict[str, FrameRow]", cluster_drain.claim_frames(tx, inbox_ids, self.clock.now_ms()))
        rows = cast("dict[str, FrameRow]", inbox_store.claim_many(tx, inbox_ids, self.clock.now_ms()))
        for bridge_id in sorted({row[0] for row in rows.values()}):
            # Every writer of a bridge's projection rows holds its lock (ingest/batch.py, D117).
            inbox_store.lock_bridge_appends(tx, bridge_id)
        return rows

    @property
    def batches(self) -> bool:
        """Whether frames are projected in batches: the real projection, or a seam that
        says it hands each frame on to the real projection with its context, batch and all
        (``batches = True``, the replay harness's stuck fault). Any other seam reads and
        writes on its own, one frame in a savepoint."""
        project = self.project
        return project is projection.project_frame or getattr(project, "batches", False) is True

    def batch(self, tx: Tx, bridge_id: str, decoded: list[Decoded]) -> Batch | None:
        """A batch for frames of ``bridge_id`` decoded ahead (apply on append, a drain
        group), with the rows they touch asked for; the caller reads it (``Batch.read``).
        None when the projection is a test seam."""
        if not self.batches:
            return None
        platform = next((d.platform for d in decoded if d.platform is not None), None)
        batch = Batch(tx, bridge_id, platform or "", self.on_message)
        for d in decoded:
            if d.events is not None:
                projection.want_rows(batch, d.events)
        return batch

    def retried(self, att: Attempt) -> None:
        """Count a try of ``att``'s frame that failed transiently and will be made again."""
        if att.bridge_id is not None:
            self.counters.of(att.bridge_id).incr("transient_retries")

    def quarantined(self, inbox_id: str, bridge_id: str | None, codec: str | None, cause: str) -> None:
        """Count and log a frame that was marked quarantined (after its commit)."""
        if bridge_id is not None:
            self.counters.of(bridge_id).incr("quarantined")
        log.warning("ingest frame quarantined", inbox_id=inbox_id, bridge_id=bridge_id, codec=codec, cause=cause)
