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


#: The table families, parents first: the order of their reads and of their writes.
_FAMILIES = ("identities", "conversations", "messages", "attachments", "reactions", "cursors", "echoes")

#: How each family is made (``Batch.__getattr__``): from the transaction, the batch's
#: journal and the bridge.
_MAKE: dict[str, Any] = {
    "identities": Identities,
    "conversations": Conversations,
    "messages": Messages,
    "attachments": lambda _tx, journal, bridge_id: NewAttachments(journal, bridge_id),
    "reactions": Reactions,
    "cursors": ReadCursors,
    "echoes": Claims,
}


class Batch:
    """The rows of one bridge that the frames of one transaction read and write.

    A table family is made when first used (``__getattr__``), so a batch pays only for the
    families its frames touch: a family never made has nothing to read or write.
    """

    __slots__ = ("tx", "bridge_id", "platform", "hook", "journal", *_FAMILIES, "_made",
                 "hooked", "_hook_wanted", "_hooks_read", "_reads")

    identities: Identities
    conversations: Conversations
    messages: Messages
    attachments: NewAttachments
    reactions: Reactions
    cursors: ReadCursors
    echoes: Claims

    def __init__(self, tx: Tx, bridge_id: str, platform: str, hook: Any = None) -> None:
        self.tx = tx
        self.bridge_id = bridge_id
        self.platform = platform
        self.hook = hook
        self.journal = Journal()
        self._made: dict[str, Any] = {}  # family name -> the family, for those made
        self.hooked: dict[str, bool] = {}  # conversation id -> whether the hook acts on it
        self._hook_wanted: set[str] = set()
        self._hooks_read: list[str] = []  # asked for by ``announce``, taken by ``read``
        self._reads: list[Any] = []  # announced, not taken yet: (statement, params, take)

    def __getattr__(self, name: str) -> Any:
        """A family's slot read before it was set: the family, made now (once)."""
        make = _MAKE.get(name)
        if make is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        family = make(self.tx, self.journal, self.bridge_id)
        setattr(self, name, family)
        self._made[name] = family
        return family

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
        reads: list[Any] = []
        made = self._made
        for name in _FAMILIES:
            family = made.get(name)
            if family is not None:
                reads += family.reads()
                if name == "conversations":  # (the rosters are the conversations' companion)
                    reads += family.rosters.reads()
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
        made = self._made
        if not made:
            return
        send = Writer(self.tx)
        for name in _FAMILIES:
            family = made.get(name)
            if family is not None:
                family.flush(send)  # (the conversations' flush writes the rosters too, between its two statements)
