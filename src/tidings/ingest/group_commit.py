"""Group commit: concurrent appends share one transaction and one commit.

``GroupCommit.run(work)`` returns ``work(tx)``'s value once the transaction ``work`` ran in
has committed. Callers that arrive while a transaction is running queue up; the first of
them to find no transaction running leads the next one, running every queued ``work`` in
arrival order, each inside its own SAVEPOINT, and commits once for all of them. Nobody
waits for a batch to fill: a caller that finds the hub idle leads a group of one at once,
so a lone request costs what it did before (and a group of one takes no savepoint).

Guarantees:

* **Committed means committed.** A caller's ``run`` returns only after the commit that
  holds its work; the 202 of an append still means durably stored.
* **Alone if anything goes wrong.** When a member's ``work`` raises inside a shared
  transaction, its savepoint takes back everything it did (its ``after_commit`` callbacks
  included) and the others commit; that member's ``work`` then runs again alone, in a
  transaction of its own, and what that run returns or raises is its answer. When the
  shared transaction itself fails (its commit included), nothing of it was stored and
  every member's ``work`` runs again alone. A group of one is already alone: its error is
  its answer, exactly as without grouping.
* **One transaction or none.** After each member the leader checks that the shared
  transaction is still open (``Tx.active``): SQLite rolls a transaction back by itself on
  some errors, after which later statements would autocommit one by one. A transaction
  lost that way fails the whole group, and every member runs again alone.
* **Order.** Members run in the order they arrived, so two appends of one bridge are
  applied in receipt order whether or not they share a transaction.

``work`` must keep all its effects inside ``tx`` (or in ``tx.after_commit``), since it may
run twice when a shared transaction fails.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Generic, TypeVar

import structlog

from ..faults import Faults
from ..store.engine import Tx

log = structlog.get_logger("tidings.ingest")

T = TypeVar("T")

#: Fault point: the shared transaction of a group of two or more fails before its commit.
FAULT_SHARED_COMMIT = "ingest.group_commit_fails"


class MemberState(StrEnum):
    QUEUED = "queued"
    COMMITTED = "committed"  # its work ran in a transaction that committed: ``value``
    RAISED = "raised"  # it ran alone (a group of one) and raised: ``error``
    RERUN = "rerun"  # it must run again in a transaction of its own


class SharedTransactionLost(Exception):
    """A member's work ended the shared transaction under the group (checked after each)."""


class SharedCommitFailed(Exception):
    """Raised by the fault point ``ingest.group_commit_fails`` (tests)."""


class _Member(Generic[T]):
    __slots__ = ("work", "state", "value", "error")

    def __init__(self, work: Callable[[Tx], T]) -> None:
        self.work = work
        self.state = MemberState.QUEUED
        self.value: Any = None
        self.error: BaseException | None = None


class GroupCommit:
    """Runs ``work`` functions in shared write transactions (see the module docstring).

    ``write`` opens one write transaction (``Store.write`` or a connection keeper's).
    ``max_members``: the most works one transaction takes (1: never shared).
    """

    def __init__(self, write: Callable[[], contextlib.AbstractContextManager[Tx]], *,
                 max_members: int = 64, faults: Faults | None = None) -> None:
        if max_members < 1:
            raise ValueError("max_members must be at least 1")
        self._write = write
        self.max_members = max_members
        self._faults = faults or Faults()
        self._cond = threading.Condition()
        self._queue: list[_Member[Any]] = []
        self._leading = False
        # Figures (read by status, the bench and tests): transactions committed, the
        # members they held, members that had to run again alone.
        self.commits = 0
        self.members = 0
        self.reruns = 0
        self.largest = 0
        #: Test hooks: ``on_queue`` is called (under the queue's lock) with the number
        #: queued once a caller joined the queue; ``on_lead`` by a leader with its group's
        #: size, before it runs the group. Events a test waits on, instead of sleeping.
        self.on_queue: Callable[[int], None] | None = None
        self.on_lead: Callable[[int], None] | None = None

    def waiting(self) -> int:
        """How many callers are queued for the next transaction (tests, status)."""
        with self._cond:
            return len(self._queue)

    def run(self, work: Callable[[Tx], T]) -> T:
        """``work(tx)``'s value once the transaction it ran in has committed."""
        if self.max_members == 1:
            return self._alone(work)
        member: _Member[T] = _Member(work)
        with self._cond:
            self._queue.append(member)
            if self.on_queue is not None:
                self.on_queue(len(self._queue))
            while True:
                if member.state is not MemberState.QUEUED:
                    break
                if not self._leading:
                    self._leading = True
                    batch = self._queue[: self.max_members]
                    del self._queue[: len(batch)]
                    self._cond.release()
                    try:
                        self._run_batch(batch)
                    finally:
                        self._cond.acquire()
                        self._leading = False
                        self._cond.notify_all()
                    continue
                self._cond.wait()
        if member.state is MemberState.COMMITTED:
            return member.value  # type: ignore[no-any-return]
        if member.state is MemberState.RAISED:
            assert member.error is not None
            raise member.error
        with self._cond:
            self.reruns += 1
        return self._alone(work)

    # -- inside -------------------------------------------------------------------------------
    def _alone(self, work: Callable[[Tx], T]) -> T:
        with self._write() as tx:
            value = work(tx)
        with self._cond:
            self.commits += 1
            self.members += 1
            self.largest = max(self.largest, 1)
        return value

    def _run_batch(self, batch: list[_Member[Any]]) -> None:
        """Run ``batch`` in one transaction and settle every member's state; never raises
        for a member's error. A group of one runs as it would alone (no savepoint), its
        value or error its own."""
        if self.on_lead is not None:
            self.on_lead(len(batch))
        if len(batch) == 1:
            only = batch[0]
            try:
                only.value = self._alone(only.work)
            except BaseException as exc:  # noqa: BLE001 - handed to its caller, raised there
                only.error = exc
                only.state = MemberState.RAISED
            else:
                only.state = MemberState.COMMITTED
            return
        ok: list[_Member[Any]] = []
        try:
            with self._write() as tx:
                for member in batch:
                    try:
                        with tx.savepoint():
                            member.value = member.work(tx)
                    except Exception as exc:  # noqa: BLE001 - this member runs again alone
                        log.info("an append failed inside a shared transaction; it runs again alone",
                                 error=f"{type(exc).__name__}: {exc}")
                        member.state = MemberState.RERUN
                    else:
                        ok.append(member)
                    if not tx.active():
                        raise SharedTransactionLost("a member's work ended the shared transaction")
                if self._faults.fire(FAULT_SHARED_COMMIT):
                    raise SharedCommitFailed("fault point ingest.group_commit_fails")
        except Exception as exc:  # noqa: BLE001 - nothing was stored: every member runs alone
            log.warning("a shared append transaction failed; each of its appends runs again alone",
                        members=len(batch), error=f"{type(exc).__name__}: {exc}")
            for member in batch:
                member.state = MemberState.RERUN
                member.value = None
            return
        for member in ok:
            member.state = MemberState.COMMITTED
        with self._cond:
            self.commits += 1
            self.members += len(ok)
            self.largest = max(self.largest, len(batch))

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"commits": self.commits, "members": self.members, "reruns": self.reruns,
                    "largest": self.largest}
