"""The consumer's dedicated connection and its ONE failure path.

Every part of the consumer (routing, the durability unit, the sweeps, the scans) is handed
this ``Link`` and reads and writes through ``link.db``. When a step fails, the part calls
``link.failed(...)``: it logs the failure with its ids, counts it, optionally asks for every
live session to be swept again (``resweep_live``), and replaces the connection if the
failure broke it. Nothing else in delivery/ writes a failure block by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import structlog

from ..counters import Counters
from ..store import delivery as delivery_store
from ..store.engine import Dedicated, Store, Tx
from ..store.retry import reconnect_if_broken

log = structlog.get_logger("tidings.delivery")


class Link:
    """The consumer's connection (None until ``open``), the failure helper and the
    ``resweep_live`` request a failure can leave for the next periodic scan."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self._db: Dedicated | None = None
        #: A failure that may have cost a live session a push: sweep every live session
        #: after the next periodic scan.
        self.resweep_live = False
        #: Cluster (PostgreSQL, several nodes): the ``cluster.ClusterNode``, set before the
        #: consumer opens; None = one process.
        self.cluster: Any = None

    def open(self, store: Store) -> None:
        self._db = store.dedicated(pg_settings=delivery_store.CONSUMER_PG_SETTINGS)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def db(self) -> Dedicated:
        """The open connection (only valid between ``open`` and ``close``)."""
        assert self._db is not None
        return self._db

    @property
    def dedicated(self) -> Dedicated | None:
        return self._db

    @contextlib.contextmanager
    def strict_write(self) -> Iterator[Tx]:
        """A write transaction on the consumer's connection that commits with the server's
        default durability (the connection's own setting is for the routing flush only)."""
        with self.db.write() as tx:
            delivery_store.strict_commit(tx)
            yield tx

    def failed(
        self,
        message: str | None,
        exc: BaseException,
        *,
        counter: str | None = None,
        resweep: bool = False,
        level: str = "error",
        **ids: Any,
    ) -> None:
        """The one failure path: count, ask for a resweep, log (with ids), reconnect."""
        if counter is not None:
            self.counters.incr(counter)
        if resweep:
            self.resweep_live = True
        if message is not None:
            getattr(log, level)(message, **ids, error=repr(exc))
        self.recover()

    def recover(self) -> None:
        """Replace the dedicated connection if it broke (a lost PostgreSQL link)."""
        reconnect_if_broken(self._db)
