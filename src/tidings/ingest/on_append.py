"""Apply on append: the append transaction applies the frames it stores.

Used by ``Ingest.append`` through ``Worker.appender``. Each new frame is applied through
the drain's one apply path (``apply.FrameApplier.apply``), while the bridge has no older
unprocessed frame except frames waiting out their backoff (the drain passes those too), so
receipt order is kept exactly as the drain keeps it (D5). Applied: the inbox row is
inserted already marked applied, in the append's one commit, with the projection. A
deterministic failure: the frame's changes are taken back and the row is inserted
quarantined with its cause, in that same transaction. A transient failure: the row is
inserted unprocessed for the worker (``LEFT``), and so is the rest of the request; the
append commits either way. The outcome classification is the drain's (``is_transient``,
``cause_of``), not a copy.

A request's frames are decoded first, and one ``Batch`` (``ingest/batch.py``, D115) holds
the projection rows they all touch: read once, in the round trip of the request's first
statement; each frame's rules run against those rows in memory, and a frame that fails is
taken back whole (the batch's journal, and ``Tx.callbacks`` for its counters); the
changed rows go out after the last frame, one statement per table. A frame that may call
the link hook, which writes to the store itself, runs inside a savepoint of its own.

The request's inbox rows (``RequestRows``, D113): the frames stored under its dedupe keys
are read once, with the batch's reads; a frame is a duplicate when that read or an
earlier frame of the request holds its key; and every new frame's row, with its outcome,
goes out in one statement after the batch's writes (PostgreSQL: behind, with the
``COMMIT``). A write that fails there loses the append transaction
(``WriteBehindFailed``), which ``Ingest.append`` makes again without apply on append.

On PostgreSQL the order check of an append's first frame is speculative: its read is
announced ahead (``Tx.read_ahead``) and rides with the request's reads; a frame that turns
out held up is stored unprocessed (``HELD``, D82), and so is the rest of the request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import structlog

from ..clock import Clock
from ..store import inbox as inbox_store
from ..store.engine import Tx, WriteBehindFailed, is_database_error, is_transient
from .apply import (
    APPLIED,
    DUPLICATE,
    HELD,
    LEFT,
    QUARANTINED,
    Attempt,
    Decoded,
    FrameApplier,
    Outcome,
    cause_of,
    frame_scope,
)
from .backoff import RetrySchedule
from .batch import Batch

log = structlog.get_logger("tidings.ingest")


class _HeldUp(Exception):
    """Apply on append found, after its speculative insert, that the frame must wait."""


class _AttemptFailed(Exception):
    """Carries an attempt's error out of a savepoint that rolled back cleanly."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


#: A request's rows go out in statements of at most about this many payload bytes (the last
#: with the ``COMMIT``): a request of 1,000 frames of 1 MiB is not one parameter of 1 GiB.
ROWS_BYTES = 1 << 20


class RequestRows:
    """The inbox rows of one request applied on append (D113).

    Made before the request's first frame: it announces the read of the frames already
    stored under the request's dedupe keys (``Tx.read_ahead``), which then rides in the
    first frame's round trip. ``stored(key)`` is that frame's stored row, or the row this
    request took the key with; ``add`` keeps a new frame's row with its outcome; ``send``
    puts the rows kept so far into one insert (``inbox.insert_frames``: behind, on
    PostgreSQL). ``send`` is called outside any frame's savepoint, so a failure of that
    insert loses the transaction (``WriteBehindFailed``) rather than one frame.
    """

    __slots__ = ("bridge_id", "received_at_ms", "_keys", "_stored", "_rows", "_bytes")

    def __init__(self, tx: Tx, bridge_id: str, received_at_ms: int, frames: list[Any]) -> None:
        self.bridge_id = bridge_id
        self.received_at_ms = received_at_ms
        keys = sorted({f.dedupe_key for f in frames if f.dedupe_key})
        self._keys = keys or None
        self._stored: dict[str, tuple[Any, ...]] | None = None if keys else {}
        if self._keys is not None:
            inbox_store.read_ahead_stored_by_dedupe_keys(tx, bridge_id, self._keys)
        self._rows: list[dict[str, Any]] = []
        self._bytes = 0

    def stored(self, tx: Tx, dedupe_key: str) -> tuple[Any, ...] | None:
        """(inbox_id, codec, codec_version, payload) stored under ``dedupe_key``, by an
        earlier request or earlier in this one; None for a new key or ``""``."""
        if not dedupe_key:
            return None
        if self._stored is None:
            self._stored = inbox_store.stored_by_dedupe_keys(tx, self.bridge_id, cast("list[str]", self._keys))
        return self._stored.get(dedupe_key)

    def add(self, inbox_id: str, frame: Any, processed_at_ms: int | None = None,
            outcome: str | None = None, cause: str | None = None) -> None:
        """Keep a new frame's row: unprocessed, or with its outcome. Only after ``stored``
        said the frame's key is new."""
        self._rows.append({
            "inbox_id": inbox_id, "dedupe_key": frame.dedupe_key, "codec": frame.codec,
            "codec_version": frame.codec_version, "client_received_at_ms": frame.client_received_at_ms,
            "payload": frame.payload, "processed_at_ms": processed_at_ms, "outcome": outcome, "cause": cause,
        })
        self._bytes += len(frame.payload)
        if frame.dedupe_key:  # its duplicate check (``stored``) has read the stored keys
            cast("dict[str, tuple[Any, ...]]", self._stored)[frame.dedupe_key] = (
                inbox_id, frame.codec, frame.codec_version, frame.payload)

    def full(self) -> bool:
        return self._bytes >= ROWS_BYTES

    def send(self, tx: Tx) -> None:
        """Send the rows kept so far in one insert behind."""
        if self._rows:
            inbox_store.insert_frames(tx, self.bridge_id, self.received_at_ms, self._rows)
            self._rows = []
            self._bytes = 0


def held_up(tx: Tx, retries: RetrySchedule, clock: Clock, bridge_id: str, received_at_ms: int, inbox_id: str) -> bool:
    """True when a frame of ``bridge_id`` appended as ``(received_at_ms, inbox_id)`` must
    wait for the drain: the bridge has an older unprocessed frame that the worker is not
    backing off. A frame waiting out its backoff does not hold it up, since the drain
    passes it too (D5); any other older frame must be applied first (receipt order).
    Reads the backoff schedule from another thread: only membership and times."""
    deferred = len(retries)
    older = inbox_store.older_unprocessed(tx, bridge_id, received_at_ms, inbox_id, deferred + 1)
    if len(older) > deferred:
        return True
    now = clock.now_ms()
    return not all(retries.waiting(i, now) for i in older)


def read_ahead_held_up(tx: Tx, retries: RetrySchedule, bridge_id: str, received_at_ms: int, inbox_id: str) -> None:
    """Announce ``held_up``'s read (``Tx.read_ahead``); it then costs no round trip of its own."""
    inbox_store.read_ahead_older_unprocessed(tx, bridge_id, received_at_ms, inbox_id, len(retries) + 1)


def insert_applied(
    applier: FrameApplier, tx: Tx, inbox_id: str, bridge_id: str, frame: Any, received_at_ms: int,
    rows: RequestRows, decoded: Decoded, batch: Batch | None, held_up: Callable[[], bool] | None = None,
) -> Outcome:
    """Apply a new frame, and keep its inbox row in ``rows`` with its outcome.

    ``APPLIED``: the projection in ``batch`` and the row together (counters added once
    ``tx`` commits). On failure the frame's changes to ``batch`` and its counters are taken
    back (and its savepoint, when it has one), and the row is kept as the drain would have
    left it: ``QUARANTINED`` with its cause (a deterministic failure) or unprocessed,
    ``LEFT`` for the drain (a transient one). ``DUPLICATE``: the bridge's dedupe key is
    stored already (``rows.stored``); nothing is kept. Safe on any thread: it touches no
    per-frame state of the worker. An error that breaks ``tx`` itself propagates (a
    database error of a frame without a savepoint does: nothing took it back); the
    caller's transaction is then lost.

    ``held_up`` (PostgreSQL's apply on append, the request's first frame): asked right
    after the duplicate check, its read announced with the request's; True stores the row
    unprocessed (``HELD``).

    ``batch`` (None when the projection is a test seam): the request's rows, whose read is
    announced here, so that the first frame's first statement carries it.
    """
    now = applier.clock.now_ms()
    att = Attempt()
    if batch is not None:
        batch.announce()  # (the first frame's: rides with its first statement)
    duplicate = rows.stored(tx, frame.dedupe_key) is not None
    if batch is not None:
        batch.read()  # (answered by the round trip that just ran)
    if duplicate:
        return DUPLICATE
    scope, own = frame_scope(tx, batch, decoded)
    try:
        with scope:
            try:
                if held_up is not None and held_up():
                    raise _HeldUp()
                _outcome, staged = applier.apply(tx, inbox_id, att, (bridge_id, frame.codec, frame.codec_version,
                                                                     received_at_ms, frame.payload),
                                                 mark=False, doc=getattr(frame, "doc", None), decoded=decoded,
                                                 batch=batch)
            except WriteBehindFailed:
                raise  # an earlier frame's write: the whole transaction is lost, not this frame
            except Exception as exc:
                if not own and is_database_error(exc):
                    raise  # nothing took a database error back: the transaction is lost
                raise _AttemptFailed(exc) from exc
    except _AttemptFailed as failed:
        # The frame's changes were taken back cleanly (had its savepoint failed to roll back,
        # that error would have propagated instead): ``tx`` and ``batch`` are as before it.
        error = failed.exc
        if isinstance(error, _HeldUp):
            rows.add(inbox_id, frame)
            return HELD
        if is_transient(error):
            log.info(
                "transient error applying a frame on append; the worker retries it",
                inbox_id=inbox_id, bridge_id=bridge_id, error=f"{type(error).__name__}: {error}",
            )
            rows.add(inbox_id, frame)
            counters = applier.counters.of(bridge_id)
            tx.after_commit(lambda: counters.incr("left_for_worker"))
            return LEFT
        cause = cause_of(error)
        rows.add(inbox_id, frame, processed_at_ms=now, outcome=QUARANTINED, cause=cause)
        codec = att.codec if att.codec is not None else frame.codec

        def quarantined() -> None:
            applier.quarantined(inbox_id, bridge_id, codec, cause)
            applier.counters.of(bridge_id).incr("applied_on_append")

        tx.after_commit(quarantined)
        return QUARANTINED
    rows.add(inbox_id, frame, processed_at_ms=now, outcome=APPLIED)

    def applied() -> None:
        if staged is not None:
            staged.commit("projected", "applied_on_append")

    tx.after_commit(applied)
    return APPLIED


class AppendApplier:
    """Apply on append, for one append transaction (``Worker.appender``).

    ``append_frames`` calls it to store each new frame. Frames are applied in order while
    the bridge has no older unprocessed frame other than those the worker is backing off
    (``held_up``, checked once, before the first); from the first frame left to the drain
    on, the rest are stored unprocessed too, so the drain takes them in receipt order.
    ``left`` counts the new frames left unprocessed. ``begin`` decodes every frame of the
    request and asks one ``Batch`` for the rows they touch, and makes the request's
    ``RequestRows``; ``finish`` flushes the batch, then the rows (D113, D115).
    """

    __slots__ = ("applier", "retries", "bridge_id", "received_at_ms", "applying", "left", "rows", "batch",
                 "decoded", "_next")

    def __init__(self, applier: FrameApplier, retries: RetrySchedule, bridge_id: str, received_at_ms: int) -> None:
        self.applier = applier
        self.retries = retries
        self.bridge_id = bridge_id
        self.received_at_ms = received_at_ms
        self.applying: bool | None = None
        self.left = 0
        self.rows: RequestRows | None = None
        self.batch: Batch | None = None
        self.decoded: list[Decoded] = []
        self._next = 0

    def begin(self, tx: Tx, frames: list[Any]) -> None:
        """Before the request's first frame: its rows' read announced, every frame decoded,
        and one batch asked for the projection rows they touch."""
        self.rows = RequestRows(tx, self.bridge_id, self.received_at_ms, frames)
        applier, bridge_id, received_at_ms = self.applier, self.bridge_id, self.received_at_ms
        self.decoded = [
            applier.decode_ahead(tx, Attempt(), (bridge_id, f.codec, f.codec_version, received_at_ms, f.payload),
                                 getattr(f, "doc", None))
            for f in frames
        ]
        self.batch = applier.batch(tx, bridge_id, self.decoded)

    def stored(self, tx: Tx, frame: Any) -> tuple[Any, ...] | None:
        """(inbox_id, codec, codec_version, payload) of the frame stored under the key of
        ``frame``, which this appender just found to be a duplicate."""
        return cast(RequestRows, self.rows).stored(tx, frame.dedupe_key)

    def finish(self, tx: Tx) -> None:
        """After the request's last frame: the batch's rows, then the request's inbox
        rows, go out (behind, with the ``COMMIT``, on PostgreSQL)."""
        if self.batch is not None:
            self.batch.flush()
        cast(RequestRows, self.rows).send(tx)

    def __call__(self, tx: Tx, inbox_id: str, frame: Any) -> bool:
        """Keep ``frame`` as ``inbox_id`` (applied if it may be); False for a duplicate."""
        index = self._next
        self._next += 1
        decoded, rows, batch = self.decoded[index], cast(RequestRows, self.rows), self.batch
        if rows.full():
            rows.send(tx)  # between two frames: outside either's savepoint
        applier, bridge_id, received_at_ms = self.applier, self.bridge_id, self.received_at_ms
        if self.applying is None and tx.dialect == "postgresql":
            # Speculate: the order check's read goes with the request's reads, and a frame
            # that turns out held up is stored unprocessed (rare).
            retries, clock = self.retries, applier.clock
            read_ahead_held_up(tx, retries, bridge_id, received_at_ms, inbox_id)
            outcome = insert_applied(
                applier, tx, inbox_id, bridge_id, frame, received_at_ms, rows, decoded, batch,
                held_up=lambda: held_up(tx, retries, clock, bridge_id, received_at_ms, inbox_id),
            )
            if outcome == DUPLICATE:
                return False  # not decided yet: the next new frame asks again
            self.applying = outcome not in (HELD, LEFT)
            if not self.applying:
                self.left += 1
            return True
        if self.applying is None:
            self.applying = not held_up(tx, self.retries, applier.clock, bridge_id, received_at_ms, inbox_id)
        if self.applying:
            outcome = insert_applied(applier, tx, inbox_id, bridge_id, frame, received_at_ms, rows, decoded, batch)
            if outcome == DUPLICATE:
                return False
            if outcome == LEFT:
                self.applying = False
                self.left += 1
            return True
        if rows.stored(tx, frame.dedupe_key) is not None:
            return False
        rows.add(inbox_id, frame)
        self.left += 1
        return True
