"""One bridge's projection rows for one transaction: read once, written once (D115).

A ``Batch`` is made for the frames of one bridge that one transaction applies: a request
of several frames applied on append, a single frame, a drained frame. Its life:

1. ``want(events)`` for every frame (``projection.want_rows``: the keys of every row the
   frame will read or write, all derived from the events, D8);
2. ``read()``: one set-based read per table family, all in one round trip on PostgreSQL
   (together with whatever the transaction has waiting: its lock, the order check, the
   dedupe read);
3. for each frame, ``apply.frame_scope`` (``batch.frame()`` inside it) around
   ``projection.project_frame``: the rules run against the rows in memory; a frame that
   raises is taken back whole (the journal) and a later frame never sees it;
4. ``flush()``: one set-based write per table family, in foreign-key order, only of rows
   whose content changed; sent behind the ``COMMIT`` when the transaction writes behind.

Keys the batch did not read (a rule reaching further than ``want_rows`` said) are read when
first used: one more round trip, never a wrong answer. The link hook reads the store, so
before a frame that may call it everything pending is flushed (``before_frame``, outside
that frame's savepoint), and at the call the frame's own rows are (inside it).

Soundness: every writer of a bridge's projection rows holds the bridge's append lock
(``inbox.lock_bridge_appends``), apply on append and the drain alike, so nothing else
changes these rows between the read and the flush. The outbox's echo report changes a
message's direction under the conversation's echo lock, which the batch takes (``Claims``)
for every conversation it may echo in, and a flush never writes a message column its
frames did not change.
"""

from __future__ import annotations

from typing import Any

from ..bridges.echo import Claims
from ..store.attachments import NewAttachments
from ..store.batch_rows import Journal, Writer
from ..store.bridge_messages import Messages
from ..store.conversations import Conversations
from ..store.engine import Tx
from ..store.identities import Identities
from ..store.reactions import Reactions
from ..store.read_cursors import ReadCursors


class _Frame:
    """``Batch.frame``: a journal mark, rolled back to when the block raises."""

    __slots__ = ("journal", "mark")

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.mark = journal.mark()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, _exc: object, _tb: object) -> None:
        if kind is not None:
            self.journal.rollback(self.mark)


class Batch:
    """The rows of one bridge that the frames of one transaction read and write."""

    __slots__ = ("tx", "bridge_id", "platform", "hook", "journal", "identities", "conversations", "messages",
                 "attachments", "reactions", "cursors", "echoes", "hooked", "_hook_wanted", "_hooks_read", "_reads")

    def __init__(self, tx: Tx, bridge_id: str, platform: str, hook: Any = None) -> None:
        self.tx = tx
        self.bridge_id = bridge_id
        self.platform = platform
        self.hook = hook
        journal = self.journal = Journal()
        self.identities = Identities(tx, journal, bridge_id)
        self.conversations = Conversations(tx, journal, bridge_id)
        self.messages = Messages(tx, journal, bridge_id)
        self.attachments = NewAttachments(journal, bridge_id)
        self.reactions = Reactions(tx, journal, bridge_id)
        self.cursors = ReadCursors(tx, journal, bridge_id)
        self.echoes = Claims(tx, journal, bridge_id)
        self.hooked: dict[str, bool] = {}  # conversation id -> whether the hook acts on it
        self._hook_wanted: set[str] = set()
        self._hooks_read: list[str] = []  # asked for by ``announce``, taken by ``read``
        self._reads: list[Any] = []  # announced, not taken yet: (statement, params, take)

    @property
    def rosters(self) -> Any:
        return self.conversations.rosters

    def want_hook(self, conversation_id: str) -> None:
        """Ask whether the hook acts on this conversation, with the next read."""
        if conversation_id not in self.hooked:
            self._hook_wanted.add(conversation_id)

    def announce(self) -> None:
        """Send the reads of what was asked for (``want``) with the transaction's next
        statement (``Tx.read_ahead``; PostgreSQL); ``read`` takes their answers."""
        if not (self.journal.asked or self._hook_wanted):
            return
        self.journal.asked = False
        tx, hook = self.tx, self.hook
        announce = getattr(hook, "announce", None)
        if getattr(hook, "acts_on", None) is not None:
            fresh = sorted(self._hook_wanted - set(self.hooked))
            self._hook_wanted.clear()
            self._hooks_read.extend(fresh)
            if announce is not None:
                for cid in fresh:
                    announce(tx, cid)
        reads = [
            *self.identities.reads(), *self.conversations.reads(), *self.rosters.reads(), *self.messages.reads(),
            *self.reactions.reads(), *self.cursors.reads(), *self.echoes.reads(),
        ]
        for stmt, params, _ in reads:
            tx.read_ahead(stmt, params)
        self._reads.extend(reads)

    def read(self) -> None:
        """Read everything asked for and not read yet: what ``announce`` sent ahead is
        taken from its round trip, the rest goes out now, all in one round trip."""
        self.announce()
        reads, self._reads = self._reads, []
        for stmt, params, take in reads:
            take(self.tx.all(stmt, params))
        hooks, self._hooks_read = self._hooks_read, []
        acts_on = getattr(self.hook, "acts_on", None)
        for cid in hooks:
            if cid not in self.hooked:
                self.hooked[cid] = bool(acts_on(self.tx, cid))  # type: ignore[misc]

    def hook_acts_on(self, conversation_id: str) -> bool:
        """Whether the message hook acts on this conversation's messages: False without a
        hook, True for a hook that cannot tell; read once a batch."""
        hook = self.hook
        if hook is None:
            return False
        acts_on = getattr(hook, "acts_on", None)
        if acts_on is None:
            return True
        known = self.hooked.get(conversation_id)
        if known is None:
            known = self.hooked[conversation_id] = bool(acts_on(self.tx, conversation_id))
        return known

    def frame(self) -> _Frame:
        """One frame's changes: taken back whole if the block raises."""
        return _Frame(self.journal)

    def flush(self) -> None:
        """Write every changed row, one statement per table family, parents first
        (``Tx.later``: behind, with the ``COMMIT``, when the transaction writes behind)."""
        send = Writer(self.tx)
        self.identities.flush(send)
        self.conversations.flush(send)  # (and the rosters, between its two statements)
        self.messages.flush(send)
        self.attachments.flush(send)
        self.reactions.flush(send)
        self.cursors.flush(send)
        self.echoes.flush(send)
