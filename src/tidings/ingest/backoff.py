"""Retry policy of the ingest worker: in-attempt transient retries, then in-process backoff.

Two levels:

* Within a frame's first attempt a transient database error is retried: at most
  ``ATTEMPTS`` = 4 tries, ``TRANSIENT_SLEEPS_MS`` = 5, 10, 20 ms apart (35 ms in all).
* A frame whose 4 tries all failed transiently is *deferred*: it stays unprocessed in the
  inbox and is not loaded or decoded again before ``not_before``. The delay is 1 s,
  doubling per failed round, capped at 5 min. The schedule lives in memory only; a
  restart empties it, so a restart retries every frame at once (nothing is ever dropped).
* A deferred frame's retry round is ``RETRY_ROUND_TRIES`` = 1 try, with no in-attempt
  sleep (``tries_for``): the backoff already spaces its rounds, so the 4 quick tries would
  only repeat the load and decode and hold the whole drain up for 35 ms per round. A
  transient failure defers it again (the delay doubles); anything else is classified as on
  any try.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

ATTEMPTS = 4
RETRY_ROUND_TRIES = 1
TRANSIENT_SLEEPS_MS = (5, 10, 20)
RETRY_BASE_MS = 1_000
RETRY_MAX_MS = 300_000


def retry_delay_ms(failures: int, base_ms: int = RETRY_BASE_MS, max_ms: int = RETRY_MAX_MS) -> int:
    """Delay after the ``failures``-th failed round: ``min(base * 2**(failures-1), max)``.

    Guarded against huge shifts, so any number of failures gives the cap, never an
    overflow or a zero.
    """
    shift = max(failures, 1) - 1
    if shift >= 62:
        return max_ms
    delay = base_ms << shift
    if delay <= 0 or delay > max_ms:
        return max_ms
    return delay


@dataclass(slots=True)
class RetryEntry:
    failures: int
    not_before_ms: int


class RetrySchedule:
    """``inbox_id -> RetryEntry`` for deferred frames. Touched by the draining thread only.

    ``len()`` and ``earliest()`` may be read from another thread (status): both only read.
    """

    __slots__ = ("base_ms", "max_ms", "_entries")

    def __init__(self, base_ms: int = RETRY_BASE_MS, max_ms: int = RETRY_MAX_MS) -> None:
        self.base_ms = base_ms
        self.max_ms = max_ms
        self._entries: dict[str, RetryEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, inbox_id: object) -> bool:
        return inbox_id in self._entries

    def get(self, inbox_id: str) -> RetryEntry | None:
        return self._entries.get(inbox_id)

    def tries_for(self, inbox_id: str) -> int:
        """Tries of the frame's next attempt: ``ATTEMPTS`` for its first, ``RETRY_ROUND_TRIES``
        for a retry round once it is deferred."""
        return RETRY_ROUND_TRIES if inbox_id in self._entries else ATTEMPTS

    def waiting(self, inbox_id: str, now_ms: int) -> bool:
        """True when the frame is deferred and its time has not come (skip it)."""
        entry = self._entries.get(inbox_id)
        return entry is not None and now_ms < entry.not_before_ms

    def defer(self, inbox_id: str, now_ms: int) -> RetryEntry:
        """Record one more failed round; the frame waits ``retry_delay_ms`` from ``now_ms``."""
        entry = self._entries.get(inbox_id)
        if entry is None:
            entry = self._entries[inbox_id] = RetryEntry(0, 0)
        entry.failures += 1
        entry.not_before_ms = now_ms + retry_delay_ms(entry.failures, self.base_ms, self.max_ms)
        return entry

    def forget(self, inbox_id: str) -> None:
        self._entries.pop(inbox_id, None)

    def prune(self, listed: Iterable[str]) -> int:
        """Drop the entries not in ``listed`` (frames processed elsewhere); return how many."""
        keep = set(listed)
        gone = [i for i in self._entries if i not in keep]
        for inbox_id in gone:
            del self._entries[inbox_id]
        return len(gone)

    def earliest(self) -> int | None:
        """The earliest ``not_before_ms`` of any deferred frame, or None."""
        entries = list(self._entries.values())
        if not entries:
            return None
        return min(e.not_before_ms for e in entries)

    def clear(self) -> None:
        self._entries.clear()

    def ids(self) -> list[str]:
        return list(self._entries)
