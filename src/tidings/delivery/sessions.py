"""Agent sessions: the in-memory registry and each session's bounded outbound queue.

Liveness is memory, never a database column: an agent is live while exactly one session of
it is registered here. A second connect replaces the first cleanly (the old stream gets an
``end`` event with reason ``replaced``). Every lifecycle change is handed to the consumer as
an edge, in registry order, so the consumer sees "old ended" before "new started".

The queue is the only thing the consumer and a session's reader share. The consumer thread
``offer``s without ever blocking: a full or closed queue refuses at once and the consumer
decides what the refusal means (a catch-up sweep, an owed row). Readers drain it from
asyncio (the SSE stream, ``next``) or from a thread (tests, ``get``/``drain``). When the
consumer has more sweep pages for a session than fit, it asks (``want_refill``) to be told
once the reader has drained the queue down to the low-water mark; the registry turns that
into a ``refill`` edge.

An asyncio reader waiting on an empty queue is woken by one ``call_soon_threadsafe`` (a
write to its loop's self-pipe). Inside ``coalesced_wakes()`` the producing thread collects
those wake-ups instead and issues them when the block ends, ONE call per event loop however
many of its sessions were offered something: the consumer wraps each message's fan-out in
it, since every SSE stream of a server shares the one loop. A reader's keep-alive deadline
is kept by one timer that outlives its waits (``Session.next``), so a wait ended by an item
costs no timer of its own.

The consumer keeps its sweep bookkeeping on the session object (``phase``, ``floors``,
``owed_after``); only the consumer thread touches those fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, cast

from ..ids import new_id


class Offer(StrEnum):
    """What ``Session.offer`` answered."""

    OK = "ok"
    FULL = "full"
    CLOSED = "closed"


class Phase(StrEnum):
    """Sweep phases (consumer-thread state): a new session first walks its cursors
    (deliver, or steer for a message that mentions it), then the start's pins
    (``pins.py``), then its owed mentions (steer), then its owed answers (``asks.py``),
    then takes live dispatches."""

    NEW = "new"
    CURSOR = "cursor"
    PINS = "pins"
    OWED = "owed"
    ANSWERS = "answers"
    LIVE = "live"


class EdgeKind(StrEnum):
    """The session edges the consumer orders behind the bus events before them."""

    START = "start"
    END = "end"
    STATE = "state"
    REFILL = "refill"


OFFER_OK = Offer.OK
OFFER_FULL = Offer.FULL
OFFER_CLOSED = Offer.CLOSED
PHASE_NEW = Phase.NEW
PHASE_CURSOR = Phase.CURSOR
PHASE_OWED = Phase.OWED
PHASE_LIVE = Phase.LIVE
PHASE_PINS = Phase.PINS
PHASE_ANSWERS = Phase.ANSWERS


_deferred = threading.local()


@contextlib.contextmanager
def coalesced_wakes() -> Iterator[None]:
    """On this thread, hold back the asyncio wake-ups that offers request until the block
    ends, then issue one ``call_soon_threadsafe`` per event loop (re-entrant: an inner
    block leaves them to the outer one). Items are queued at once either way; only the
    readers' wake-up waits for the end of the block."""
    if getattr(_deferred, "wakes", None) is not None:
        yield
        return
    wakes: dict[asyncio.AbstractEventLoop, list[asyncio.Future[Any]]] = {}
    _deferred.wakes = wakes
    try:
        yield
    finally:
        _deferred.wakes = None
        for loop, waiters in wakes.items():
            try:
                loop.call_soon_threadsafe(_set_all, waiters)
            except RuntimeError:  # the reader's loop is gone
                pass


def _wake(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_result(True)


def _set_all(waiters: list[asyncio.Future[Any]]) -> None:
    for waiter in waiters:
        _wake(waiter)


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_result(False)


class Queued(Protocol):
    """What a session's queue holds: a ``Dispatch``, a pin notice (``pins.PinNotice``) or
    an answer (``asks.AnswerDispatch``); the stream writes ``payload()`` as event ``kind``."""

    @property
    def kind(self) -> str: ...

    @property
    def message_id(self) -> str: ...

    def payload(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Dispatch:
    """One ``deliver`` or ``steer`` of a message to a session."""

    kind: str  # "deliver" | "steer"
    message: dict[str, Any]  # hub.channels.public_message(row)
    channel_id: str
    #: The message mentions this recipient (the one grammar); a steer always does (D54).
    mentions_you: bool = False
    pinned: bool = False  # a pin of the start sweep (delivery/pins.py)

    @property
    def message_id(self) -> str:
        return cast(str, self.message["id"])

    def payload(self) -> dict[str, Any]:
        out = {"type": self.kind, "message": self.message, "channel_id": self.channel_id,
               "mentions_you": self.mentions_you}
        if self.pinned:
            out["pinned"] = True
        return out


@dataclass(frozen=True, slots=True)
class SessionEnd:
    """The last item a session's reader sees."""

    reason: str

    kind = "end"

    def payload(self) -> dict[str, Any]:
        return {"type": "end", "reason": self.reason}


class Session:
    __slots__ = (
        "session_id",
        "agent_id",
        "capacity",
        "low_water",
        "_on_refill",
        "_lock",
        "_cond",
        "_items",
        "_end",
        "_end_taken",
        "_waiter",
        "_deadline",
        "_alarm_at",
        "_alarm_loop",
        "_refill_wanted",
        "phase",
        "floors",
        "owed_after",
        "extras",
    )

    def __init__(
        self,
        session_id: str,
        agent_id: str,
        *,
        capacity: int,
        low_water: int,
        on_refill: Callable[[Session], None] | None = None,
    ) -> None:
        self.session_id = session_id
        self.agent_id = agent_id
        self.capacity = capacity
        self.low_water = min(low_water, capacity)
        self._on_refill = on_refill
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._items: deque[Queued] = deque()
        self._end: SessionEnd | None = None
        self._end_taken = False
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]] | None = None
        # The reader's keep-alive timer (``next``): the current wait's deadline, and when
        # and on which loop the one live timer was armed (None: none armed).
        self._deadline: float | None = None
        self._alarm_at: float | None = None
        self._alarm_loop: asyncio.AbstractEventLoop | None = None
        self._refill_wanted = False
        self.phase: Phase = PHASE_NEW
        self.floors: dict[str, int] = {}
        self.owed_after: tuple[str, int] = ("", 0)
        self.extras: dict[str, Any] = {}  # per-session state of the pin and answer sweeps

    def __repr__(self) -> str:
        return f"<Session {self.session_id} agent={self.agent_id} queued={len(self._items)} phase={self.phase}>"

    # -- state ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._end is not None

    @property
    def end_reason(self) -> str | None:
        end = self._end
        return None if end is None else end.reason

    def pending(self) -> int:
        with self._lock:
            return len(self._items)

    # -- producer side (the consumer thread) ------------------------------------------------
    def offer(self, item: Queued) -> Offer:
        """Queue ``item`` unless the session is closed or full; never blocks."""
        with self._lock:
            if self._end is not None:
                return OFFER_CLOSED
            if len(self._items) >= self.capacity:
                return OFFER_FULL
            self._items.append(item)
            self._wake_locked()
        return OFFER_OK

    def close(self, reason: str) -> bool:
        """End the session: later offers are refused; the reader gets what is queued, then
        the end. True only for the call that closed it."""
        with self._lock:
            if self._end is not None:
                return False
            self._end = SessionEnd(reason)
            self._refill_wanted = False
            self._wake_locked()
        return True

    def want_refill(self) -> None:
        """Ask for a ``refill`` once the queue is at or below the low-water mark."""
        fire = False
        with self._lock:
            if self._end is not None:
                return
            if len(self._items) <= self.low_water:
                fire = True
            else:
                self._refill_wanted = True
        if fire and self._on_refill is not None:
            self._on_refill(self)

    def _wake_locked(self) -> None:
        self._cond.notify_all()
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            loop, future = waiter
            wakes = getattr(_deferred, "wakes", None)
            if wakes is not None:
                wakes.setdefault(loop, []).append(future)
                return
            try:
                loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:  # the reader's loop is gone
                pass

    # -- consumer side (the reader) --------------------------------------------------------
    def _take_locked(self) -> tuple[Queued | SessionEnd | None, bool]:
        if self._items:
            item = self._items.popleft()
            refill = self._refill_wanted and len(self._items) <= self.low_water
            if refill:
                self._refill_wanted = False
            return item, refill
        if self._end is not None and not self._end_taken:
            self._end_taken = True
            return self._end, False
        return None, False

    def _after_take(self, refill: bool) -> None:
        if refill and self._on_refill is not None:
            self._on_refill(self)

    def get_nowait(self) -> Queued | SessionEnd | None:
        with self._lock:
            item, refill = self._take_locked()
        self._after_take(refill)
        return item

    def get(self, timeout: float | None = None) -> Queued | SessionEnd | None:
        """Blocking take for threads: the next item, or None when the timeout ran out (or
        the end was already taken)."""
        with self._lock:
            item, refill = self._take_locked()
            if item is None and not self._end_taken:
                self._cond.wait_for(lambda: bool(self._items) or self._end is not None, timeout)
                item, refill = self._take_locked()
        self._after_take(refill)
        return item

    async def next(self, timeout: float | None) -> Queued | SessionEnd | None:
        """The next item for an asyncio reader; None when ``timeout`` passes first (the
        caller sends a keep-alive) or the end was already taken.

        A wait is a bare future, with no task. Its deadline is kept by one timer per reader
        that outlives the waits: a wait ended by an item leaves the timer armed, and a timer
        that fires before the current wait's deadline arms again for it (``_ring``). So a
        reader woken once per item arms a timer about once per ``timeout``, not once per
        item; a wait whose deadline comes before the armed timer arms its own."""
        loop = asyncio.get_running_loop()
        with self._lock:
            item, refill = self._take_locked()
            if item is None and not self._end_taken:
                future = loop.create_future()
                self._waiter = (loop, future)
            else:
                future = None
        if future is None:
            self._after_take(refill)
            return item
        if timeout is None:
            self._deadline = None
        else:
            self._deadline = deadline = loop.time() + timeout
            at = self._alarm_at
            if at is None or at > deadline or self._alarm_loop is not loop:
                self._arm(loop, deadline)
        try:
            woken = await future
        finally:
            with self._lock:
                if self._waiter is not None and self._waiter[1] is future:
                    self._waiter = None
        if not woken:
            return None
        return self.get_nowait()

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        """Arm the live timer for ``at`` on ``loop``; a timer armed before it is left to
        fire and do nothing (``_ring``)."""
        loop.call_at(at, self._ring, loop, at)
        self._alarm_at = at
        self._alarm_loop = loop

    def _ring(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        """The keep-alive timer armed for ``at`` fired on ``loop``: the wait in progress
        ends (False) if its deadline is ``at`` or earlier, else the timer arms again for
        its deadline. A timer no longer the live one (another armed since, for an earlier
        deadline or on another loop) does nothing."""
        if self._alarm_loop is not loop or self._alarm_at != at:
            return
        self._alarm_at = None
        deadline = self._deadline
        with self._lock:
            waiter = self._waiter
        if deadline is None or waiter is None or waiter[0] is not loop or waiter[1].done():
            return  # no wait with a deadline: the next one arms
        if deadline <= at:
            _expire(waiter[1])
        else:
            self._arm(loop, deadline)

    def drain(self) -> list[Queued | SessionEnd]:
        """Everything queued right now (tests and synchronous readers)."""
        out: list[Queued | SessionEnd] = []
        while (item := self.get_nowait()) is not None:
            out.append(item)
        return out


class SessionRegistry:
    """One live session per agent; lifecycle edges go to the consumer in registry order."""

    def __init__(
        self,
        submit: Callable[[EdgeKind, Session, Any], None],
        *,
        capacity: int,
        low_water: int,
    ) -> None:
        self._submit = submit
        self._capacity = capacity
        self._low_water = low_water
        self._lock = threading.Lock()
        self._by_agent: dict[str, Session] = {}
        self._by_id: dict[str, Session] = {}

    def _refill(self, session: Session) -> None:
        self._submit(EdgeKind.REFILL, session, None)

    def connect(self, agent_id: str) -> Session:
        session = Session(
            new_id("ses"), agent_id, capacity=self._capacity, low_water=self._low_water, on_refill=self._refill
        )
        with self._lock:
            old = self._by_agent.get(agent_id)
            if old is not None:
                del self._by_id[old.session_id]
                old.close("replaced")
                self._submit(EdgeKind.END, old, "replaced")
            self._by_agent[agent_id] = session
            self._by_id[session.session_id] = session
            self._submit(EdgeKind.START, session, None)
        return session

    def disconnect(self, session: Session, reason: str = "closed") -> bool:
        """End ``session`` if it is still registered; idempotent."""
        with self._lock:
            if self._by_id.get(session.session_id) is not session:
                return False
            del self._by_id[session.session_id]
            if self._by_agent.get(session.agent_id) is session:
                del self._by_agent[session.agent_id]
            session.close(reason)
            self._submit(EdgeKind.END, session, reason)
        return True

    def get(self, session_id: str) -> Session | None:
        with self._lock:
            return self._by_id.get(session_id)

    def for_agent(self, agent_id: str) -> Session | None:
        with self._lock:
            return self._by_agent.get(agent_id)

    def is_live(self, agent_id: str) -> bool:
        with self._lock:
            return agent_id in self._by_agent

    def count(self) -> int:
        with self._lock:
            return len(self._by_id)

    def close_all(self, reason: str) -> int:
        with self._lock:
            sessions = list(self._by_id.values())
        return sum(1 for s in sessions if self.disconnect(s, reason))
