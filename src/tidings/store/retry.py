"""The transient-retry loop and reconnect-after-error, each written once.

``attempt(fn, ...)`` runs ``fn`` until it succeeds, at most ``tries`` times:
a transient database error (``is_transient``, THE classification) replaces a broken
connection and sleeps the next delay before trying again; any other error propagates at
once; after the last try ``TransientExhausted`` carries the last error. The ingest worker
(the list page, one frame, the quarantine mark) retries through it; every engine's
connection recovers through ``reconnect_if_broken`` (the delivery consumer too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import structlog

from .engine import Dedicated, is_transient

log = structlog.get_logger("tidings.store")

T = TypeVar("T")


class TransientExhausted(Exception):
    """Every try failed with a transient error; ``last`` is the last one."""

    def __init__(self, last: BaseException | None) -> None:
        super().__init__(str(last))
        self.last = last


def reconnect_if_broken(conn: Dedicated | None) -> None:
    """After an error: replace the connection if the error broke it (a lost PostgreSQL
    link). A failed reconnect is logged; the next use tries again."""
    if conn is None:
        return
    dbapi = conn.dbapi
    if getattr(dbapi, "closed", False) is True or getattr(dbapi, "broken", False):
        try:
            conn.reconnect()
        except Exception as exc:  # noqa: BLE001 - the next use retries
            log.error("could not reconnect", error=repr(exc))


def attempt(
    fn: Callable[[], T],
    *,
    conn: Dedicated | None,
    sleep: Callable[[float], None],
    tries: int,
    sleeps_ms: Sequence[int],
    first_try: int = 0,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """Run ``fn`` with transient retries (see the module docstring). ``on_retry`` is told
    of each transient error that another try follows. ``sleeps_ms[n - 1]`` is slept before
    try ``n`` (so it holds at least ``tries - 1`` delays)."""
    last: BaseException | None = None
    for n in range(first_try, tries):
        if n:
            sleep(sleeps_ms[n - 1] / 1000.0)
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc):
                raise
            reconnect_if_broken(conn)
            last = exc
            if on_retry is not None and n < tries - 1:
                on_retry(exc)
    raise TransientExhausted(last)
