"""The in-process event bus: a numbered, bounded, never-blocking fan-out.

Writers commit to the store first and publish afterwards (``tx.after_commit``); readers
subscribe with the last sequence number they saw and get the missed span back as a replay,
followed by a live tail. The bus is a hint channel on top of the durable store, never the
record itself, and it keeps these invariants:

* **Publish never blocks.** It takes one short lock, numbers the event, stores it in a ring
  of the last ``capacity`` events and offers it to every subscriber's bounded buffer. A
  subscriber whose buffer is full is not waited for: it is overrun.
* **Numbering.** Sequence numbers start at 1 and grow by one per publish, under the lock,
  so the ring always holds a contiguous run ``oldest..head``. Every event also carries the
  bus ``epoch``, a random non-zero 63-bit number minted per ``Bus`` instance: a cursor is
  only meaningful together with the epoch it was read under (a restarted process starts a
  new epoch and a new sequence space).
* **Exactly-once handoff.** ``subscribe(since_seq)`` registers the subscriber and snapshots
  the replay (retained events with ``seq > since_seq``) under the same lock as publish, so
  every later event is in exactly one of ``replay`` or the live tail: no gap, no duplicate.
  When the bus cannot prove there is no gap (unknown epoch, cursor ahead of the head, or
  part of the span already evicted) it raises ``BufferUnderflow`` instead of guessing.
* **The lagged latch.** An overrun subscription is closed with ``lagged`` set, for good. It
  means "you missed events: rebuild from the durable store, then subscribe again". Events
  that were already buffered are still handed out before the close is seen. A clean close
  (``Bus.close`` or ``Subscription.cancel``) never sets it.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tidings.clock import SYSTEM_CLOCK, Clock
from tidings.faults import Faults

__all__ = ["DEFAULT_CAPACITY", "DEFAULT_BUFFER", "Bus", "BufferUnderflow", "Stamped", "Subscription"]

DEFAULT_CAPACITY = 1024
DEFAULT_BUFFER = 1024

#: Fault point: the next publish overruns every current subscriber (docs/api.md §2).
OVERRUN_FAULT = "bus.overrun"


class BufferUnderflow(Exception):
    """The requested cursor cannot be continued without a gap; resync from the store."""

    def __init__(self, reason: str, *, since_seq: int, head_seq: int, oldest_seq: int | None) -> None:
        self.reason = reason
        self.since_seq = since_seq
        self.head_seq = head_seq
        self.oldest_seq = oldest_seq
        retained = "nothing retained" if oldest_seq is None else f"retained {oldest_seq}..{head_seq}"
        super().__init__(
            f"cannot resume the event stream after seq {since_seq}: {reason} "
            f"(bus head {head_seq}, {retained}); rebuild from the durable store"
        )


@dataclass(frozen=True, slots=True)
class Stamped:
    """One published event: its number, publish time (unix ms), bus epoch and payload."""

    seq: int
    at_ms: int
    epoch: int
    payload: object


def _mint_epoch() -> int:
    while True:
        epoch = secrets.randbits(63)
        if epoch:
            return epoch


class Subscription:
    """One reader's view of the bus: a ``replay`` snapshot, then a bounded live tail.

    The live tail is fed by ``Bus.publish`` and read with ``get`` (threads), ``aget``
    (asyncio) or ``get_nowait``. Once ``closed`` is true no new event will arrive, but events
    already buffered are still returned first. ``lagged`` tells an overrun (events were
    missed) from a clean close.
    """

    __slots__ = (
        "replay",
        "head_seq",
        "_bus",
        "_limit",
        "_lock",
        "_ready",
        "_buffer",
        "_closed",
        "_lagged",
        "_sleepers",
        "_async_waiters",
    )

    def __init__(self, bus: Bus | None, replay: list[Stamped], head_seq: int, limit: int) -> None:
        self.replay: list[Stamped] = replay
        self.head_seq: int = head_seq
        self._bus = bus
        self._limit = limit
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._buffer: deque[Stamped] = deque()
        self._closed = bus is None
        self._lagged = False
        self._sleepers = 0
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    # -- state -------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once no further live event can arrive (buffered ones may still be pending)."""
        return self._closed

    @property
    def lagged(self) -> bool:
        """The overrun latch: once true, events were missed and it never goes back."""
        return self._lagged

    def __repr__(self) -> str:
        state = "lagged" if self._lagged else ("closed" if self._closed else "live")
        return (
            f"<Subscription {state} head_seq={self.head_seq} replay={len(self.replay)} "
            f"buffered={len(self._buffer)}>"
        )

    # -- called by the bus, with the bus lock held ---------------------------------------

    def _offer(self, event: Stamped, wake: list[Any]) -> bool:
        """Buffer ``event`` without blocking; False means the buffer is full (an overrun)."""
        with self._lock:
            if self._closed:
                return True
            if len(self._buffer) >= self._limit:
                return False
            self._buffer.append(event)
            if self._sleepers:
                self._ready.notify()
            if self._async_waiters:
                wake.extend(self._async_waiters)
                self._async_waiters.clear()
        return True

    def _shut(self, lagged: bool, wake: list[Any]) -> None:
        """Mark closed (and latch ``lagged`` if asked); wake every waiter. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if lagged:
                self._lagged = True
            self._ready.notify_all()
            wake.extend(self._async_waiters)
            self._async_waiters.clear()

    # -- reading -------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> Stamped | None:
        """Next live event, blocking up to ``timeout`` seconds (None: until one arrives).

        Buffered events come before the close. None means either closed and drained (see
        ``lagged``) or the timeout ran out while still open (``closed`` is False).
        """
        with self._lock:
            if self._buffer:
                return self._buffer.popleft()
            if self._closed:
                return None
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                if deadline is None:
                    remaining = None
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                self._sleepers += 1
                try:
                    self._ready.wait(remaining)
                finally:
                    self._sleepers -= 1
                if self._buffer:
                    return self._buffer.popleft()
                if self._closed:
                    return None

    def get_nowait(self) -> Stamped | None:
        """Next buffered live event, or None right away if there is none."""
        with self._lock:
            if self._buffer:
                return self._buffer.popleft()
            return None

    async def aget(self) -> Stamped | None:
        """Like ``get()`` for asyncio callers: waits without blocking the event loop.

        Publishes may happen on any thread. Cancelling the awaiting task (for instance via
        ``asyncio.wait_for``) never consumes an event.
        """
        loop = asyncio.get_running_loop()
        while True:
            signal = asyncio.Event()
            waiter = (loop, signal)
            with self._lock:
                if self._buffer:
                    return self._buffer.popleft()
                if self._closed:
                    return None
                self._async_waiters.append(waiter)
            try:
                await signal.wait()
            finally:
                with self._lock:
                    if waiter in self._async_waiters:
                        self._async_waiters.remove(waiter)

    def __iter__(self) -> Iterator[Stamped]:
        """Yield live events (not the replay) until the subscription is closed and drained."""
        while True:
            event = self.get()
            if event is None:
                return
            yield event

    # -- leaving -------------------------------------------------------------------------

    def cancel(self) -> None:
        """Leave the bus: no more live events, ``lagged`` untouched. Safe to call any time."""
        wake: list[Any] = []
        bus = self._bus
        if bus is not None:
            bus._forget(self)
        self._shut(False, wake)
        _wake_async(wake)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cancel()


def _wake_async(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]) -> None:
    for loop, signal in waiters:
        try:
            loop.call_soon_threadsafe(signal.set)
        except RuntimeError:  # the waiter's loop is already closed: nobody left to wake
            pass


class Bus:
    """A numbered ring of recent events with non-blocking fan-out to subscribers."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        buffer: int = DEFAULT_BUFFER,
        clock: Clock | None = None,
        faults: Faults | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if buffer < 1:
            raise ValueError(f"buffer must be at least 1, got {buffer}")
        self.capacity = capacity
        self.buffer = buffer
        self.clock = clock if clock is not None else SYSTEM_CLOCK
        self.faults = faults if faults is not None else Faults()
        self.epoch: int = _mint_epoch()
        self._lock = threading.Lock()
        self._ring: deque[Stamped] = deque(maxlen=capacity)
        self._next_seq = 1
        # A dict used as an insertion-ordered set: O(1) removal, ordered fan-out.
        self._subs: dict[Subscription, None] = {}
        self._closed = False
        self._overruns = 0

    # -- state -------------------------------------------------------------------------

    @property
    def head_seq(self) -> int:
        """The last assigned sequence number (0 before the first publish)."""
        return self._next_seq - 1

    @property
    def overruns(self) -> int:
        """How many subscriptions have been overrun since this bus was made."""
        return self._overruns

    @property
    def closed(self) -> bool:
        """True after ``close()``; it never reopens."""
        return self._closed

    @property
    def subscriber_count(self) -> int:
        """Live subscriptions currently registered."""
        return len(self._subs)

    def __repr__(self) -> str:
        return (
            f"<Bus epoch={self.epoch} head_seq={self.head_seq} subscribers={len(self._subs)} "
            f"overruns={self._overruns}{' closed' if self._closed else ''}>"
        )

    # -- writing -------------------------------------------------------------------------

    def publish(self, payload: object) -> int:
        """Number, stamp, retain and fan out ``payload``; return its seq. Never blocks.

        A subscriber that cannot take the event is overrun (lagged, closed and dropped)
        instead of being waited for. When the ``bus.overrun`` fault fires, every current
        subscriber is overrun that way; the event is still retained in the ring. After a
        ``close()`` events are still numbered and retained, but nobody is listening.
        """
        force_overrun = self.faults.fire(OVERRUN_FAULT)
        wake: list[Any] = []
        with self._lock:
            seq = self._next_seq
            self._next_seq = seq + 1
            event = Stamped(seq, self.clock.now_ms(), self.epoch, payload)
            self._ring.append(event)
            subs = self._subs
            if subs:
                if force_overrun:
                    overrun = list(subs)
                else:
                    overrun = [sub for sub in subs if not sub._offer(event, wake)]
                if overrun:
                    self._overruns += len(overrun)
                    for sub in overrun:
                        del subs[sub]
                        sub._shut(True, wake)
        if wake:
            _wake_async(wake)
        return seq

    def overrun_all(self) -> int:
        """Overrun every current subscriber now (lagged, closed, dropped), as if each had
        missed an event: used when events from outside this process may have been lost (a
        cluster node's LISTEN connection broke). Returns how many were overrun."""
        wake: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        with self._lock:
            subs = list(self._subs)
            self._subs.clear()
            self._overruns += len(subs)
            for sub in subs:
                sub._shut(True, wake)
        _wake_async(wake)
        return len(subs)

    # -- reading -------------------------------------------------------------------------

    def subscribe(self, since_seq: int = 0, epoch: int = 0) -> Subscription:
        """Replay everything after ``since_seq``, then stream live, with no gap or duplicate.

        ``since_seq=0`` replays the whole ring and ignores ``epoch``. A positive cursor must
        come with this bus's ``epoch``, must not be ahead of the head, and must not reach
        into evicted history; otherwise ``BufferUnderflow`` is raised. On a closed bus the
        result is an already-closed, empty, non-lagged subscription (never an error).
        """
        with self._lock:
            head = self._next_seq - 1
            if self._closed:
                return Subscription(None, [], head, self.buffer)
            if since_seq < 0:
                raise ValueError(f"since_seq must not be negative, got {since_seq}")
            ring = self._ring
            oldest = ring[0].seq if ring else None
            if since_seq > 0 and epoch != self.epoch:
                raise BufferUnderflow(
                    "the cursor belongs to another bus epoch" if epoch else "a cursor needs its epoch",
                    since_seq=since_seq,
                    head_seq=head,
                    oldest_seq=oldest,
                )
            if since_seq >= self._next_seq:
                raise BufferUnderflow(
                    "the cursor is ahead of the bus head", since_seq=since_seq, head_seq=head, oldest_seq=oldest
                )
            if since_seq > 0 and oldest is not None and oldest > since_seq + 1:
                raise BufferUnderflow(
                    "the events right after the cursor were already evicted",
                    since_seq=since_seq,
                    head_seq=head,
                    oldest_seq=oldest,
                )
            if oldest is None or since_seq < oldest:
                replay = list(ring)
            else:
                # The ring is contiguous, so seq > since_seq starts at a known offset.
                replay = list(itertools.islice(ring, since_seq - oldest + 1, None))
            sub = Subscription(self, replay, head, self.buffer)
            self._subs[sub] = None
            return sub

    # -- shutting down -------------------------------------------------------------------

    def close(self) -> None:
        """Close every live subscription cleanly (lagged stays False); later subscribes
        get terminal subscriptions. Idempotent."""
        wake: list[Any] = []
        with self._lock:
            self._closed = True
            subs = list(self._subs)
            self._subs.clear()
            for sub in subs:
                sub._shut(False, wake)
        _wake_async(wake)

    def _forget(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.pop(sub, None)
