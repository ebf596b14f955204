"""Thread-safe named counters, the numbers behind ``/api/status``.

A ``Counters`` is created with its full list of names, so a snapshot always carries every
counter the contract promises, zeros included, and a typo in ``incr`` fails loudly.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Counters:
    __slots__ = ("_lock", "_values")

    def __init__(self, names: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._values = {name: 0 for name in names}

    def incr(self, name: str, by: int = 1) -> None:
        with self._lock:
            if name not in self._values:
                raise KeyError(f"unknown counter {name!r}")
            self._values[name] += by

    def add(self, counts: dict[str, int]) -> None:
        """Add several counts under one lock: all of them, or none when a name is unknown."""
        with self._lock:
            values = self._values
            for name in counts:
                if name not in values:
                    raise KeyError(f"unknown counter {name!r}")
            for name, by in counts.items():
                values[name] += by

    def get(self, name: str) -> int:
        with self._lock:
            return self._values[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)
