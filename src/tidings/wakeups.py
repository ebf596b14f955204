"""A process-local wake-up hint: a generation counter threads can wait on.

``bump`` after a commit that someone may be waiting for; a waiter remembers the
``generation`` it saw and ``wait``s until it differs (or a timeout). Only a hint: every
waiter re-reads durable state when it wakes, and wakes on its own timeout anyway.
"""

from __future__ import annotations

import threading


class WakeSignal:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0

    def bump(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def generation(self) -> int:
        with self._cond:
            return self._generation

    def wait(self, seen: int, timeout: float | None) -> int:
        """Until the generation differs from ``seen`` (or ``timeout`` s); the generation."""
        with self._cond:
            self._cond.wait_for(lambda: self._generation != seen, timeout)
            return self._generation
