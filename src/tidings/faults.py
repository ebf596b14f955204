"""Named fault points, armed from ``TIDINGS_FAULTS`` or by tests.

A fault point is a place in the code that asks ``faults.fire("name")`` and misbehaves on
purpose when it answers True. ``TIDINGS_FAULTS="bus.drop_publish,ingest.busy:3"`` arms
``bus.drop_publish`` for every call and ``ingest.busy`` for the next three. Points whose
contract says "the next event" (``bus.overrun``) default to a single shot.

Tests arm points on the hub's own ``Faults`` instance, never on a global, so two hubs in
one process never see each other's faults.
"""

from __future__ import annotations

import os
import threading

#: Fault points whose bare name means "once", per docs/api.md §2.
ONE_SHOT_BY_DEFAULT = frozenset({"bus.overrun"})


class Faults:
    def __init__(self, spec: str | None = None) -> None:
        self._lock = threading.Lock()
        self._remaining: dict[str, int | None] = {}
        self.fired: dict[str, int] = {}
        if spec:
            self.load(spec)

    @classmethod
    def from_env(cls) -> Faults:
        return cls(os.environ.get("TIDINGS_FAULTS", ""))

    def load(self, spec: str) -> None:
        """Parse ``name[:N][,name[:N]…]``; a bad count is a usage error (ValueError)."""
        for raw in spec.split(","):
            item = raw.strip()
            if not item:
                continue
            name, _, count = item.partition(":")
            if count:
                if not count.isdigit():
                    raise ValueError(f"fault {name!r}: count must be a whole number, got {count!r}")
                self.arm(name, int(count))
            else:
                self.arm(name, 1 if name in ONE_SHOT_BY_DEFAULT else None)

    def arm(self, name: str, times: int | None = None) -> None:
        """Arm ``name`` for ``times`` firings (None: every call until disarmed)."""
        with self._lock:
            self._remaining[name] = times

    def disarm(self, name: str) -> None:
        with self._lock:
            self._remaining.pop(name, None)

    def armed(self, name: str) -> bool:
        with self._lock:
            return name in self._remaining

    def fire(self, name: str) -> bool:
        """True when the point ``name`` should misbehave now; consumes one shot."""
        if not self._remaining:  # fast path: nothing armed
            return False
        with self._lock:
            if name not in self._remaining:
                return False
            left = self._remaining[name]
            if left is not None:
                if left <= 0:
                    del self._remaining[name]
                    return False
                if left == 1:
                    del self._remaining[name]
                else:
                    self._remaining[name] = left - 1
            self.fired[name] = self.fired.get(name, 0) + 1
            return True
