"""The assembled hub process: store, bus, services, and the engines on their threads.

``Runtime`` is the composition root shared by ``tidings serve``, the CLI commands and the
tests. Tests build one per "process lifetime": a restart is a new ``Runtime`` over the same
database with a fresh bus, which is exactly what a crash loses.
"""

from __future__ import annotations

import os
from typing import Any

import structlog

from .bridges.links import Links
from .bridges.outbox import CONNECTORS
from .bus import Bus
from .clock import SYSTEM_CLOCK, Clock
from .cluster.status import cluster_status
from .delivery.engine import Delivery
from .faults import Faults
from .hub import accounts
from .hub.posting import Posting
from .hub.search_indexer import SearchIndexer
from .ingest.engine import Ingest
from .store.engine import Store

log = structlog.get_logger("tidings.runtime")


class Runtime:
    def __init__(
        self,
        db_url: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        faults: Faults | None = None,
        admin_token: str | None = None,
        cluster: bool = False,
        address: str = "",
        attachments_dir: str | None = None,
    ) -> None:
        self.clock = clock
        self.faults = faults if faults is not None else Faults.from_env()
        self.store = Store(db_url, clock=clock, faults=self.faults)
        self.bus = Bus(clock=clock, faults=self.faults)
        self.posting = Posting(self.store, self.bus, self.faults)
        self.generated_admin_token = accounts.bootstrap(self.store, admin_token)
        self.system_account_id = accounts.system_account_id(self.store)
        self.started = False
        # Attachment bytes: a content-addressed folder (hub.attachments, blobs.py).
        self.attachments_dir = attachments_dir
        self.attachment_max_bytes = int(os.environ.get("TIDINGS_ATTACHMENT_MAX_BYTES", 50 * 1024 * 1024))
        self._blobs: Any = None
        # The engines. Each is built here, started by start(), stopped by stop(), and
        # contributes its section to status(). Both are always present.
        self.links = Links(self)
        self.delivery: Delivery = Delivery(self)
        self.ingest: Ingest = Ingest(self)
        # SQLite: the search index catches up in batches on this thread (D95).
        self.search_indexer = SearchIndexer(self.store)
        # A cluster node (``tidings serve`` on PostgreSQL): see cluster/node.py.
        self.cluster: Any = None
        if cluster and self.store.dialect == "postgresql":
            from .cluster.node import attach

            self.cluster = attach(self, address)

    @property
    def blobs(self) -> Any:
        """The attachment blob store (a folder beside the database unless configured)."""
        if self._blobs is None:
            from .blobs import FolderBlobStore, default_dir

            self._blobs = FolderBlobStore(self.attachments_dir or default_dir(self.store.url))
        return self._blobs

    @blobs.setter
    def blobs(self, value: Any) -> None:
        self._blobs = value

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the engines on their threads (idempotent)."""
        if self.started:
            return
        self.started = True
        if self.cluster is not None:
            self.cluster.start()
        self.delivery.start()
        self.ingest.start()
        self.search_indexer.start()
        log.info("runtime started", db=self.store.dialect)

    def stop(self) -> None:
        """Stop the engines, close the bus and the store (idempotent)."""
        if self.cluster is not None:
            self.cluster.stop()
        if self.started:
            self.started = False
            self.search_indexer.stop()
            self.ingest.stop()
            self.delivery.stop()
            log.info("runtime stopped")
        else:
            self.ingest.stop()  # never started, but it may hold append connections
        self.bus.close()
        self.store.dispose()

    def __enter__(self) -> Runtime:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- status ------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The counters of ``GET /api/status`` (docs/api.md §8.1)."""
        return {
            "ingest": self.ingest.status(),
            "delivery": self.delivery.status(),
            "bus": {"head_seq": self.bus.head_seq, "overruns": self.bus.overruns},
            **({"search_index": self.search_indexer.status()} if self.store.dialect == "sqlite" else {}),
            **({"checkpoints": self.store.checkpointer.status()} if self.store.checkpointer is not None else {}),
            "bridges": CONNECTORS.section(self),  # outbox counts and connector counters
            **({"cluster": cluster_status(self)} if self.store.dialect == "postgresql" else {}),
        }

