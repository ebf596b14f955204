"""The ingest engine as the runtime sees it: append, the worker thread, status.

``Runtime`` builds ``Ingest(runtime)``, calls ``start()``/``stop()``, and puts
``status()`` under ``"ingest"`` in ``/api/status``::

    {"per_bridge": {bridge_id: counters}, "backlog": n_unprocessed, "deferred_now": n}

Tests may build ``Ingest(store=..., decode=..., project=..., sleep=...)`` without a
runtime. ``TIDINGS_INGEST_GROUP=N`` sets the worker's group size (frames per
transaction, default 1; see ``worker.py``).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import structlog

from ..faults import Faults
from ..store import inbox as inbox_store
from ..store.engine import Store
from .counters import BridgeCounters
from .inbox import MAX_FRAME_BYTES, AppendResult, Frame, append_frames, frames_of_body, parse_frame
from .worker import DrainStats, Worker

log = structlog.get_logger("tidings.ingest")


def _group_from_env() -> int:
    raw = os.environ.get("TIDINGS_INGEST_GROUP", "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"TIDINGS_INGEST_GROUP must be a positive integer, got {raw!r}")
    return int(raw)


class Ingest:
    def __init__(
        self,
        runtime: Any = None,
        *,
        store: Store | None = None,
        faults: Faults | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
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
        worker_options.setdefault("group_size", _group_from_env())
        self.worker = Worker(store, counters=self.counters, faults=self.faults, **worker_options)
        self._codec_platforms: dict[str, str] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.worker.start()

    def stop(self) -> None:
        self.worker.stop()

    def notify(self) -> None:
        self.worker.notify()

    def drain(self, on_frame: Callable[[str, str], None] | None = None) -> DrainStats:
        """One synchronous drain on the caller's thread (CLI, tests); not while started."""
        return self.worker.drain(on_frame)

    # -- append ----------------------------------------------------------------------------
    def codec_platforms(self) -> dict[str, str]:
        if self._codec_platforms is None:
            from .decoders import DECODERS

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
        """Insert validated frames in one transaction; wake the worker once committed."""
        with self.store.write() as tx:
            results = append_frames(tx, bridge_id, frames, self.store.now_ms())
        counters = self.counters.of(bridge_id)
        new = sum(1 for r in results if not r.replay)
        if new:
            counters.incr("appended", new)
        if len(results) - new:
            counters.incr("deduped", len(results) - new)
        stale = sum(1 for r in results if r.stale)
        if stale:
            counters.incr("stale_replays", stale)
            log.info("stale ingest replay ignored", bridge_id=bridge_id, frames=stale)
        if new:
            self.worker.notify()
        return results

    # -- status ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self.store.read() as tx:
            backlog = inbox_store.backlog(tx)
            bridge_ids = inbox_store.bridge_ids(tx)
        per_bridge = {bridge_id: self.counters.of(bridge_id).snapshot() for bridge_id in bridge_ids}
        for bridge_id, values in self.counters.snapshot().items():
            per_bridge.setdefault(bridge_id, values)
        return {"per_bridge": per_bridge, "backlog": backlog, "deferred_now": len(self.worker.retries)}
