"""The ingest engine as the runtime sees it: append, the worker thread, status.

``Runtime`` builds ``Ingest(runtime)``, calls ``start()``/``stop()``, and puts
``status()`` under ``"ingest"`` in ``/api/status``::

    {"per_bridge": {bridge_id: counters}, "backlog": n_unprocessed, "deferred_now": n}

Tests may build ``Ingest(store=..., decode=..., project=..., sleep=...)`` without a
runtime. ``TIDINGS_INGEST_GROUP=N`` sets the drain's group size (frames per
transaction, default ``grouping.DRAIN_GROUP``; 1: a frame a transaction; D119).

Group commit (off by default): with ``TIDINGS_INGEST_GROUP_COMMIT=N`` (N > 1), appends
that arrive while another append's transaction runs share the next transaction and its
one commit, each in its own savepoint (``group_commit.py``), at most N a group; an append
that finds none running commits alone at once, so nothing waits for a group to fill. It is
off because it measured slower (``bench/run.py``, section 1, "clients at once"; D97):
PostgreSQL already flushes the WAL of concurrent commits together and runs their
statements in parallel, which one shared transaction on one thread gives up, and a SQLite
commit in WAL mode costs too little to be worth sharing.

Apply on append (``apply_on_append=True``, the default): the append transaction also
applies its new frames through the worker's one "apply a frame" (``on_append.insert_applied``),
all of them in one batch that reads their rows once and writes each changed row once
(D115), when the bridge has no older unprocessed frame (one waiting out its backoff aside:
the drain passes it too). So a frame usually costs one commit instead of two (its inbox
row, inserted already marked applied, and its projection together) and is readable as soon
as the 202 is sent. A frame that fails
deterministically is inserted quarantined with its cause in that same commit; one that
fails transiently is inserted unprocessed for the worker, and so is the rest of its
request. The 202 still means exactly "durably committed". If the apply step breaks the
transaction itself, the request is appended again without it. ``apply_on_append=False``
gives the pure worker path (every frame is applied by the drain).

Connections (SQLite): an append transaction runs on a connection this engine keeps for
appends (``_AppendConnections``: taken by one request at a time, a few kept idle) instead
of a pool checkout per request. Transactions are the store's own (``Dedicated.write``:
``BEGIN IMMEDIATE`` under the store's one writer lock), so nothing about them changes.
PostgreSQL keeps the pool, whose idle ping replaces a connection the server dropped (D92).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, cast

import structlog

from ..errors import TidingsError
from ..faults import Faults
from ..store import inbox as inbox_store
from ..store.engine import Dedicated, Store, Tx, WriteBehindFailed
from .counters import BridgeCounters
from .decoders import DECODERS
from .group_commit import GroupCommit
from .grouping import DRAIN_GROUP
from .inbox import MAX_FRAME_BYTES, AppendResult, Frame, append_frames, frames_of_body, parse_frame
from .worker import DrainStats, Worker

log = structlog.get_logger("tidings.ingest")


#: The most appends one shared transaction takes (``TIDINGS_INGEST_GROUP_COMMIT``). 1, the
#: default: none shared, since sharing measured slower on both backends (decision D97).
GROUP_COMMIT_MEMBERS = 1


class _ApplyBroke(Exception):
    """The apply-on-append step failed its transaction (which then rolled back whole)."""


def _group_from_env() -> int:
    raw = os.environ.get("TIDINGS_INGEST_GROUP", "").strip()
    if not raw:
        return DRAIN_GROUP
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"TIDINGS_INGEST_GROUP must be a positive integer, got {raw!r}")
    return int(raw)


def _group_commit_from_env() -> int:
    raw = os.environ.get("TIDINGS_INGEST_GROUP_COMMIT", "").strip()
    if not raw:
        return GROUP_COMMIT_MEMBERS
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"TIDINGS_INGEST_GROUP_COMMIT must be a positive integer, got {raw!r}")
    return int(raw)


class _PooledWrite:
    """``_AppendConnections.write``: a write transaction on an idle connection (a new one
    when none is idle), given back afterwards. A plain class, not a generator: every append
    runs one."""

    __slots__ = ("pool", "conn", "unit")

    def __init__(self, pool: _AppendConnections) -> None:
        self.pool = pool
        self.conn: Dedicated | None = None
        self.unit: AbstractContextManager[Tx] | None = None

    def __enter__(self) -> Tx:
        pool = self.pool
        conn = self.conn = pool.take()
        try:
            unit = self.unit = conn.write()
            return unit.__enter__()
        except BaseException:
            pool.give_back(conn)
            raise

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool | None:
        try:
            return cast(AbstractContextManager[Tx], self.unit).__exit__(kind, exc, tb)
        finally:
            self.pool.give_back(cast(Dedicated, self.conn))


class _AppendConnections:
    """Write transactions for appends on SQLite connections kept for them.

    Each transaction takes an idle connection (or opens one) and gives it back after
    its commit or rollback, so one connection is only ever used by one thread at a
    time; at most ``keep`` stay idle, the rest go back to the pool. The transaction is
    ``Dedicated.write``, i.e. the store's own (same writer lock, same commit and
    ``after_commit`` rules), minus the pool checkout and reset of ``Store.write``.
    """

    def __init__(self, store: Store, keep: int = 2) -> None:
        self.store = store
        self.keep = keep
        self._idle: list[Dedicated] = []
        self._lock = threading.Lock()

    def write(self) -> _PooledWrite:
        return _PooledWrite(self)

    def take(self) -> Dedicated:
        """An idle connection, or a new one when none is idle."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self.store.dedicated()

    def give_back(self, conn: Dedicated) -> None:
        """``conn``, done with: kept idle, or closed when ``keep`` are idle already."""
        with self._lock:
            if len(self._idle) < self.keep:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class Ingest:
    def __init__(
        self,
        runtime: Any = None,
        *,
        store: Store | None = None,
        faults: Faults | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        apply_on_append: bool = True,
        inbox_ids: Callable[[int], str] | None = None,
        group_commit: int | None = None,
        **worker_options: Any,
    ) -> None:
        if store is None:
            if runtime is None:
                raise ValueError("Ingest needs a runtime or a store")
            store = runtime.store
        self.runtime = runtime
        self.store = store
        self.faults = faults if faults is not None else (runtime.faults if runtime is not None else store.faults)
        self.counters = BridgeCounters()
        self.max_frame_bytes = max_frame_bytes
        self.apply_on_append = apply_on_append
        #: Apply on append sends the projection's writes behind (``Tx.later``; PostgreSQL).
        self.write_behind = True
        self.inbox_ids = inbox_ids  # None: ingest.inbox.new_inbox_id
        worker_options.setdefault("group_size", _group_from_env())
        links = getattr(runtime, "links", None)
        if links is not None:
            # Bridge links post linked messages inside the projection's transaction.
            worker_options.setdefault("on_message", links.hook)
        self.worker = Worker(store, counters=self.counters, faults=self.faults, **worker_options)
        self._codec_platforms: dict[str, str] | None = None
        self._connections = _AppendConnections(store) if store.dialect == "sqlite" else None
        if group_commit is None:
            group_commit = _group_commit_from_env()
        self.group = GroupCommit((self._connections or store).write, max_members=group_commit, faults=self.faults)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.worker.start()

    def stop(self) -> None:
        self.worker.stop()
        if self._connections is not None:
            self._connections.close()

    def notify(self) -> None:
        self.worker.notify()

    def drain(self, on_frame: Callable[[str, str], None] | None = None) -> DrainStats:
        """One synchronous drain on the caller's thread (CLI, tests); not while started."""
        return self.worker.drain(on_frame)

    # -- append ----------------------------------------------------------------------------
    def codec_platforms(self) -> dict[str, str]:
        if self._codec_platforms is None:
            self._codec_platforms = {codec: dec.platform for codec, dec in DECODERS.items()}
        return self._codec_platforms

    def parse(self, raw_frames: list[Any], platform: str | None = None) -> list[Frame]:
        """Validate every frame of a request (all or nothing)."""
        platforms = self.codec_platforms()
        return [
            parse_frame(raw, i, max_bytes=self.max_frame_bytes, platform=platform, codec_platforms=platforms)
            for i, raw in enumerate(raw_frames)
        ]

    def append_body(self, bridge_id: str, body: Any, platform: str | None = None) -> list[AppendResult]:
        """Validate a request body (one frame or ``{"frames": [...]}``) and append it."""
        return self.append(bridge_id, self.parse(frames_of_body(body), platform))

    def append(self, bridge_id: str, frames: list[Frame]) -> list[AppendResult]:
        """Insert validated frames in one transaction (applying them when it may); wake the
        worker once committed if any new frame is left unprocessed."""
        if self.apply_on_append:
            try:
                results, left = self._append(bridge_id, frames, apply=True)
            except (_ApplyBroke, WriteBehindFailed) as exc:  # rolled back whole: nothing was stored
                cause = exc.__cause__
                log.warning(
                    "apply on append broke the append transaction; appending without it",
                    bridge_id=bridge_id, error=f"{type(cause).__name__}: {cause}",
                )
                results, left = self._append(bridge_id, frames, apply=False)
                if left:  # committed: apply on append applied none of them, the drain takes them
                    self.counters.of(bridge_id).incr("left_for_worker", left)
        else:
            results, left = self._append(bridge_id, frames, apply=False)
        counters = self.counters.of(bridge_id)
        new = stale = 0
        for r in results:
            if not r.replay:
                new += 1
            elif r.stale:
                stale += 1
        if new:
            counters.incr("appended", new)
        if len(results) - new:
            counters.incr("deduped", len(results) - new)
        if stale:
            counters.incr("stale_replays", stale)
            log.info("stale ingest replay ignored", bridge_id=bridge_id, frames=stale)
        if left:
            self.worker.notify()
        return results

    def _append(self, bridge_id: str, frames: list[Frame], apply: bool) -> tuple[list[AppendResult], int]:
        """One append, in a write transaction that concurrent appends may share
        (``group_commit.GroupCommit``: one commit for all, each append in its own
        savepoint); returns the results and how many new frames it left unprocessed once
        that transaction committed. Raises ``_ApplyBroke`` when the apply step failed."""
        return self.group.run(lambda tx: self._append_in(tx, bridge_id, frames, apply))

    def _append_in(self, tx: Tx, bridge_id: str, frames: list[Frame], apply: bool) -> tuple[list[AppendResult], int]:
        platform_of = self.worker.bridge_platform
        if not apply:
            results = append_frames(
                tx, bridge_id, frames, self.store.now_ms(), self.inbox_ids, bridge_platform=platform_of
            )
            return results, sum(1 for r in results if not r.replay)
        inbox_store.lock_bridge_appends(tx, bridge_id)
        # The batch's writes and the inbox rows go out behind, with the COMMIT (D105, D115);
        # one that fails loses the transaction (``WriteBehindFailed``), and the request is
        # appended again without apply on append, so the drain applies (or quarantines)
        # each frame on its own.
        tx.write_behind = self.write_behind and tx.dialect == "postgresql"
        now = self.store.now_ms()
        applier = self.worker.appender(bridge_id, now)
        try:
            results = append_frames(tx, bridge_id, frames, now, self.inbox_ids, applier, platform_of)
        except TidingsError:
            raise  # an unknown bridge: the same answer as without apply on append
        except Exception as exc:
            raise _ApplyBroke() from exc
        return results, applier.left

    # -- status ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self.store.read() as tx:
            backlog = inbox_store.backlog(tx)
            bridge_ids = inbox_store.bridge_ids(tx)
        per_bridge = {bridge_id: self.counters.of(bridge_id).snapshot() for bridge_id in bridge_ids}
        for bridge_id, values in self.counters.snapshot().items():
            per_bridge.setdefault(bridge_id, values)
        return {"per_bridge": per_bridge, "backlog": backlog, "deferred_now": len(self.worker.retries)}
