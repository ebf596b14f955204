"""Clocks: the one source of "now" for every engine.

Every component takes a ``Clock`` instead of calling ``time`` itself, so tests pin time by
construction (``FakeClock``) and the replay harness can pin every clock to a frame's receipt
time. A clock also lets a waiter be woken when time moves: ``FakeClock.advance`` notifies
listeners, so a worker sleeping until a retry time wakes without real time passing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Clock:
    """Wall-clock milliseconds plus a way to be told when a fake clock moves."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Register ``fn`` to run whenever the clock is moved by hand (never for real time)."""

    def remove_listener(self, fn: Callable[[], None]) -> None:
        """Undo ``add_listener``; unknown listeners are ignored."""

    @property
    def is_fake(self) -> bool:
        return False


SYSTEM_CLOCK = Clock()


class FakeClock(Clock):
    """A clock that only moves when told to. Thread-safe; listeners run after each move."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def now_ms(self) -> int:
        with self._lock:
            return self._now

    def set(self, ms: int) -> None:
        with self._lock:
            self._now = ms
            listeners = list(self._listeners)
        for fn in listeners:
            fn()

    def advance(self, ms: int) -> None:
        with self._lock:
            self._now += ms
            listeners = list(self._listeners)
        for fn in listeners:
            fn()

    def add_listener(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    @property
    def is_fake(self) -> bool:
        return True
