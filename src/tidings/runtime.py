"""The assembled hub process: store, bus, services, and the engines on their threads.

``Runtime`` is the composition root shared by ``tidings serve``, the CLI commands and the
tests. Tests build one per "process lifetime": a restart is a new ``Runtime`` over the same
database with a fresh bus, which is exactly what a crash loses.
"""

from __future__ import annotations

from typing import Any

import structlog

from .bus import Bus
from .clock import SYSTEM_CLOCK, Clock
from .faults import Faults
from .hub import accounts
from .hub.posting import Posting
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
    ) -> None:
        self.clock = clock
        self.faults = faults if faults is not None else Faults.from_env()
        self.store = Store(db_url, clock=clock, faults=self.faults)
        self.bus = Bus(clock=clock, faults=self.faults)
        self.posting = Posting(self.store, self.bus, self.faults)
        self.generated_admin_token = accounts.bootstrap(self.store, admin_token)
        self.system_account_id = accounts.system_account_id(self.store)
        self.started = False

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the engines on their threads (idempotent)."""
        if self.started:
            return
        self.started = True
        log.info("runtime started", db=self.store.dialect)

    def stop(self) -> None:
        """Stop the engines, close the bus and the store (idempotent)."""
        if not self.started:
            self.store.dispose()
            return
        self.started = False
        self.bus.close()
        self.store.dispose()
        log.info("runtime stopped")

    def __enter__(self) -> "Runtime":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- status ------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The counters of ``GET /api/status`` (CONTRACT §2 Status)."""
        return {
            "ingest": {"per_bridge": {}, "backlog": 0, "deferred_now": 0},
            "delivery": {},
            "bus": {"head_seq": self.bus.head_seq, "overruns": self.bus.overruns},
        }
