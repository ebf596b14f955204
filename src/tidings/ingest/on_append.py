"""Apply on append: the append transaction applies the frames it stores.

Used by ``Ingest.append`` through ``Worker.appender``. Each new frame is applied through
the drain's one apply path (``apply.FrameApplier.apply``) inside a SAVEPOINT, while the
bridge has no older unprocessed frame except frames waiting out their backoff (the drain
passes those too), so receipt order is kept exactly as the drain keeps it (D5). Applied:
the inbox row is inserted already marked applied, together with the projection, in the
append's one commit. A deterministic failure: the savepoint rolls back and the row is
inserted quarantined with its cause, in that same transaction. A transient failure: the
savepoint rolls back and the row is inserted unprocessed for the worker (``LEFT``); the
append commits either way. The outcome classification is the drain's (``is_transient``,
``cause_of``), not a copy.

The frames of a request are decoded first, and one ``Batch`` (``ingest/batch.py``, D115)
holds the projection rows they all touch: read once, inside the first frame's savepoint
and in the round trip of its first statement; each frame's rules run against those rows
in memory (a frame that fails is taken back whole); the changed rows go out after the last
frame, one statement per table, behind, with the ``COMMIT``. A write that fails there
loses the append transaction (``WriteBehindFailed``), which ``Ingest.append`` makes again
without apply on append.

On PostgreSQL the first frame of an append is inserted speculatively: the order check's
read is announced ahead (``Tx.read_ahead``) and rides in the insert's round trip; a frame
that turns out held up is taken back with its savepoint and stored unprocessed (``HELD``,
D82).

A request of several frames on PostgreSQL (``RequestRows``, D113) inserts no row inside a
frame's savepoint: the frames stored under the request's dedupe keys are read once, in the
first frame's round trip; a frame's duplicate check is that read and the keys the request
took before it; and each new frame's row, with its outcome, joins the request's rows, which
go out in one statement behind, with the ``COMMIT``. What is stored is what the one-row
inserts store; the frames are applied in the same order, each still in its savepoint.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any, cast

import structlog

from ..clock import Clock
from ..store import inbox as inbox_store
from ..store.engine import Tx, WriteBehindFailed, is_transient
from .apply import (
    APPLIED,
    DUPLICATE,
    HELD,
    LEFT,
    QUARANTINED,
    Attempt,
    Decoded,
    FrameApplier,
    FrameRow,
    Outcome,
    cause_of,
)
from .backoff import RetrySchedule
from .batch import Batch
from .projection import may_call_hook

log = structlog.get_logger("tidings.ingest")


class _HeldUp(Exception):
    """Apply on append found, after its speculative insert, that the frame must wait."""


class _AttemptFailed(Exception):
    """Carries an attempt's error out of a savepoint that rolled back cleanly."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


def insert_row(tx: Tx, inbox_id: str, row: FrameRow, frame: Any, **outcome: Any) -> bool:
    """Insert the inbox row of a new frame (unprocessed, or with ``outcome``); False for a
    duplicate of the bridge's dedupe key."""
    bridge_id, codec, codec_version, received_at_ms, payload = row
    return inbox_store.insert_frame(
        tx, inbox_id=inbox_id, bridge_id=bridge_id, dedupe_key=frame.dedupe_key, codec=codec,
        codec_version=codec_version, received_at_ms=received_at_ms,
        client_received_at_ms=frame.client_received_at_ms, payload=payload, **outcome,
    )


#: A request's rows go out in statements of at most about this many payload bytes (the last
#: with the ``COMMIT``): a request of 1,000 frames of 1 MiB is not one parameter of 1 GiB.
ROWS_BYTES = 1 << 20


class RequestRows:
    """The inbox rows of one request of several frames (PostgreSQL apply on append, D113).

    Made before the request's first frame: it announces the read of the frames already
    stored under the request's dedupe keys (``Tx.read_ahead``), which then rides in the
    first frame's round trip. ``stored(key)`` is that frame's stored row, or the row this
    request took the key with; ``add`` keeps a new frame's row with its outcome; ``send``
    puts the rows kept so far into one insert sent behind (``Tx.later``). ``send`` is called
    outside any frame's savepoint, so a failure of that insert loses the transaction
    (``WriteBehindFailed``) rather than one frame.
    """

    __slots__ = ("bridge_id", "received_at_ms", "_keys", "_stored", "_rows", "_bytes")

    def __init__(self, tx: Tx, bridge_id: str, received_at_ms: int, frames: list[Any]) -> None:
        self.bridge_id = bridge_id
        self.received_at_ms = received_at_ms
        keys = sorted({f.dedupe_key for f in frames if f.dedupe_key})
        self._keys = json.dumps(keys) if keys else None
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
            self._stored = inbox_store.stored_by_dedupe_keys(tx, self.bridge_id, cast(str, self._keys))
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
            inbox_store.insert_frames_behind(tx, self.bridge_id, self.received_at_ms, json.dumps(self._rows))
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
    held_up: Callable[[], bool] | None = None, rows: RequestRows | None = None,
    decoded: Decoded | None = None, batch: Batch | None = None,
) -> Outcome:
    """Insert a new frame and apply it, in one SAVEPOINT of the caller's transaction.

    The inbox row is written once, already carrying its outcome: ``APPLIED`` (the
    projection and the row together; counters added once ``tx`` commits). On failure
    the savepoint takes the row back and the frame's changes to ``batch`` are taken back
    with it, and the row is written again as the drain would have left it:
    ``QUARANTINED`` with its cause (a deterministic failure) or unprocessed, ``LEFT`` for
    the drain (a transient one). ``DUPLICATE``: the bridge's dedupe key is already
    stored; nothing was written. Safe on any thread: it touches no per-frame state of the
    worker. An error that breaks ``tx`` itself propagates; the caller's transaction is
    then lost.

    ``held_up`` (PostgreSQL's apply on append): asked right after the insert, inside the
    savepoint; True rolls the savepoint back and stores the row unprocessed (``HELD``).
    So the order check's read rides in the insert's round trip (``AppendApplier``).

    ``rows`` (a request of several frames on PostgreSQL): nothing is inserted here. The
    duplicate check is ``rows.stored`` (whose read rides with the frame's reads), and the
    row, with the outcome it would have been written with, joins ``rows`` (D113).

    ``decoded`` and ``batch``: the frame decoded ahead, and the batch of its request,
    whose read is announced here (the first frame's round trip carries it) and taken
    before the frame is projected.
    """
    row: FrameRow = (bridge_id, frame.codec, frame.codec_version, received_at_ms, frame.payload)
    now = applier.clock.now_ms()
    att = Attempt()

    def store(**outcome: Any) -> None:  # the row as the outcome leaves it
        if rows is None:
            insert_row(tx, inbox_id, row, frame, **outcome)
        else:
            rows.add(inbox_id, frame, **outcome)

    scope = batch.frame() if batch is not None else contextlib.nullcontext()
    try:
        with tx.savepoint(), scope:
            try:
                doc = getattr(frame, "doc", None)
                if batch is not None:
                    batch.announce()  # (the first frame's: rides with its first statement)
                if rows is not None:
                    duplicate = rows.stored(tx, frame.dedupe_key) is not None
                else:
                    duplicate = not insert_row(tx, inbox_id, row, frame, processed_at_ms=now, outcome=APPLIED)
                if batch is not None:
                    batch.read()  # (answered by the round trip that just ran)
                if duplicate:
                    return DUPLICATE
                if held_up is not None and held_up():
                    raise _HeldUp()
                _outcome, staged = applier.apply(tx, inbox_id, att, row, mark=False, doc=doc, decoded=decoded,
                                                 batch=batch)
            except WriteBehindFailed:
                raise  # an earlier frame's write: the whole transaction is lost, not this frame
            except Exception as exc:
                raise _AttemptFailed(exc) from exc
    except _AttemptFailed as failed:
        # The savepoint was rolled back cleanly (had that failed too, its own error would
        # have propagated instead): ``tx`` is as it was before this frame, and so is ``batch``.
        error = failed.exc
        if isinstance(error, _HeldUp):
            store()
            return HELD
        if is_transient(error):
            log.info(
                "transient error applying a frame on append; the worker retries it",
                inbox_id=inbox_id, bridge_id=bridge_id, error=f"{type(error).__name__}: {error}",
            )
            store()
            counters = applier.counters.of(bridge_id)
            tx.after_commit(lambda: counters.incr("left_for_worker"))
            return LEFT
        cause = cause_of(error)
        store(processed_at_ms=now, outcome=QUARANTINED, cause=cause)
        codec = att.codec if att.codec is not None else frame.codec

        def quarantined() -> None:
            applier.quarantined(inbox_id, bridge_id, codec, cause)
            applier.counters.of(bridge_id).incr("applied_on_append")

        tx.after_commit(quarantined)
        return QUARANTINED
    if rows is not None:
        rows.add(inbox_id, frame, processed_at_ms=now, outcome=APPLIED)

    def applied() -> None:
        if staged is not None:
            staged.commit()
            staged.target.incr("projected")
            staged.target.incr("applied_on_append")

    tx.after_commit(applied)
    return APPLIED


class AppendApplier:
    """Apply on append, for one append transaction (``Worker.appender``).

    ``append_frames`` calls it to store each new frame. Frames are applied in order while
    the bridge has no older unprocessed frame other than those the worker is backing off
    (``held_up``, checked once, before the first); from the first frame left to the drain
    on, the rest are stored unprocessed too, so the drain takes them in receipt order.
    ``left`` counts the new frames left unprocessed. ``begin`` decodes every frame of the
    request and asks one ``Batch`` for the rows they touch; ``finish`` flushes it. A
    request of several frames on PostgreSQL keeps its rows in ``rows`` and inserts them in
    one statement (``finish``; ``RequestRows``, D113).
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
        """Before the request's first frame: decode every frame, and ask one batch for the
        rows they touch; a request of several frames whose writes go behind keeps its
        rows for one insert."""
        if tx.write_behind and len(frames) > 1:
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
        if self.rows is not None:
            return self.rows.stored(tx, frame.dedupe_key)
        return inbox_store.frame_by_dedupe(tx, self.bridge_id, frame.dedupe_key)

    def finish(self, tx: Tx) -> None:
        """After the request's last frame: the batch's rows, then the request's inbox
        rows, go out (behind, with the ``COMMIT``)."""
        if self.batch is not None:
            self.batch.flush()
        if self.rows is not None:
            self.rows.send(tx)

    def __call__(self, tx: Tx, inbox_id: str, frame: Any) -> bool:
        """Store ``frame`` as ``inbox_id`` (applied if it may be); False for a duplicate."""
        index = self._next
        self._next += 1
        decoded = self.decoded[index] if index < len(self.decoded) else None
        rows, batch = self.rows, self.batch
        if rows is not None and rows.full():
            rows.send(tx)  # between two frames: outside either's savepoint
        if self.applying is None and tx.dialect == "postgresql":
            # Speculate: insert it applied, with the order check's read in the same round
            # trip, and take it back if it turns out held up (rare).
            retries, clock, bridge_id, received_at_ms = self.retries, self.applier.clock, self.bridge_id, self.received_at_ms
            read_ahead_held_up(tx, retries, bridge_id, received_at_ms, inbox_id)
            outcome = insert_applied(
                self.applier, tx, inbox_id, bridge_id, frame, received_at_ms,
                held_up=lambda: held_up(tx, retries, clock, bridge_id, received_at_ms, inbox_id), rows=rows,
                decoded=decoded, batch=batch,
            )
            if outcome == DUPLICATE:
                return False  # not decided yet: the next new frame asks again
            self.applying = outcome not in (HELD, LEFT)
            if not self.applying:
                self.left += 1
            return True
        if self.applying is None:
            self.applying = not held_up(
                tx, self.retries, self.applier.clock, self.bridge_id, self.received_at_ms, inbox_id
            )
        if self.applying:
            if batch is not None and decoded is not None and decoded.events and may_call_hook(batch, decoded.events):
                batch.flush()  # the hook reads the store: earlier frames' rows first, outside this frame
            outcome = insert_applied(self.applier, tx, inbox_id, self.bridge_id, frame, self.received_at_ms,
                                     rows=rows, decoded=decoded, batch=batch)
            if outcome == DUPLICATE:
                return False
            if outcome == LEFT:
                self.applying = False
                self.left += 1
            return True
        if rows is not None:
            if rows.stored(tx, frame.dedupe_key) is not None:
                return False
            rows.add(inbox_id, frame)
            self.left += 1
            return True
        row: FrameRow = (self.bridge_id, frame.codec, frame.codec_version, self.received_at_ms, frame.payload)
        inserted = insert_row(tx, inbox_id, row, frame)
        if inserted:
            self.left += 1
        return inserted
