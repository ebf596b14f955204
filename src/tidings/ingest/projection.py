"""The projection: one decoded frame's events applied to the bridge tables, writing only
what changed. The write guards themselves are the rules of the table-family classes of
``tidings.store`` (``Identities``, ``Conversations`` and ``Rosters``, ``Messages``,
``Reactions``, ``ReadCursors``), which hold a batch's rows (``ingest/batch.py``, D115).

The worker calls :func:`project_frame` inside the frame's one transaction and marks the
frame processed in that same transaction, so a frame is applied whole or not at all. A
frame is projected in a ``Batch``: the rows of one bridge that the frames of one
transaction touch, asked for first (:func:`want_rows`), read once, changed in memory and
written once; a frame that raises is taken back whole from the batch, and a later frame of
the batch never sees it. Database errors propagate raw (the worker retries transient ones
and quarantines the rest); bad data the decoders let through raises
:class:`ProjectionError`, whose text is the quarantine cause.

Order within a frame, whatever the decoded order: conversations, messages, mutations,
reactions, receipts.

* **Ids** are derived (:func:`derive_id`): sha256 of the entity, the bridge and the
  natural key, so replaying the same frames into a fresh store reproduces every id.
* **Identities** are canonicalised by ``tidings.ingest.events.identity_key`` (the one
  implementation), once per sighting: a ref the decoder built with ``identity_ref`` for
  this platform carries its proven ``kind``/``canonical``, any other is canonicalised
  here. Merge rule of a new sighting: ``raw`` is replaced,
  ``display_name`` only by a non-empty name, ``is_self`` only turns on. An unchanged
  identity is not written (the batch's row is compared); a changed one goes through the
  guarded upsert. Anonymous reactors (``anon:<emoji>``) never get a row.
* **Conversations**: a ``ConversationEvent`` (Google) writes kind/title/revision only
  when one differs, then diffs the roster (one read; no write when unchanged; only the
  difference otherwise; a repeated identity or an unknown role is a ``ProjectionError``);
  a roster change advances ``updated_at_ms`` monotonically. Messages mint their
  conversation when it is new (kind inferred from the remote id) and otherwise raise
  ``last_message_at_ms`` only when strictly newer: one bump per conversation per frame.
  On Signal and WhatsApp, which send no rosters, an incoming message's sender is added to
  the roster when absent.
* **Messages**: guarded natural-key upsert; a re-delivered original never undoes an edit
  or a delete. **Mutations**: last-writer-wins edits, terminal deletes (the body is
  cleared); a mutation of an unknown message counts ``mutations_orphaned``.
* **Reactions**: delta mode (Signal, WhatsApp) is last writer wins by occurrence time with
  tombstones; Google messages carry snapshots (``MessageEvent.reactions_snapshot``), and
  every such message gets its snapshot applied with the fence at ``received_at_ms``, even
  with no reaction in the frame (an empty snapshot still advances the fence).
* **Receipts**: only our own ``read`` receipts move a read cursor, forwards only;
  everything else counts ``receipts_dropped``.

Counters are added after the commit (``tx.after_commit``), so a rolled-back attempt that
is retried never counts twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from hashlib import sha256
from typing import Any

from ..counters import Counters
from ..store.conversations import RosterError, RosterRow
from ..store.engine import Tx
from ..store.reactions import SELF_REACTOR, SnapshotEntry
from .attachments import metadata as attachment_metadata
from .batch import Batch
from .events import (
    PLATFORMS,
    ConversationEvent,
    Event,
    IdentityRef,
    InvalidEvent,
    MessageEvent,
    MessageMutationEvent,
    ReactionEvent,
    ReceiptEvent,
    identity_key,
)

__all__ = [
    "MessageChange",
    "ProjectionContext",
    "ProjectionError",
    "ROLES",
    "conversation_id_for",
    "derive_id",
    "identity_id_for",
    "infer_conversation_kind",
    "may_call_hook",
    "message_id_for",
    "project_frame",
    "want_rows",
]

ROLES = frozenset({"member", "admin", "owner", "unknown"})
# Platforms whose reactions come as whole snapshots per message (with the fence).
SNAPSHOT_PLATFORMS = frozenset({"google"})
# Platforms that send no rosters: an incoming message's sender joins the roster.
SENDER_ROSTER_PLATFORMS = frozenset({"signal", "whatsapp"})


class ProjectionError(Exception):
    """A deterministic failure to project a frame; ``str(exc)`` is the quarantine cause."""


@dataclass(frozen=True, slots=True)
class MessageChange:
    """What the bridge-link hook is told about (inside the frame's transaction).

    ``kind``: ``"new"`` (a newly inserted incoming message), ``"edit"`` or ``"delete"``
    (an applied mutation, either direction). ``body`` is the message's body after the
    change (``""`` for a delete). ``occurred_at_ms`` is when the change happened on the
    network: the message's time for ``new``, the mutation's time otherwise.
    """

    kind: str
    bridge_id: str
    conversation_id: str
    message_id: str
    remote_message_id: str
    sender_identity_id: str | None
    direction: str
    body: str
    occurred_at_ms: int


@dataclass(slots=True)
class ProjectionContext:
    bridge_id: str
    platform: str  # "signal" | "whatsapp" | "google"
    inbox_id: str
    received_at_ms: int  # the frame's server receipt time; the Google reaction-fence sequence
    now_ms: int  # store clock now (for created/updated stamps)
    counters: Counters  # this bridge's counters (tidings.ingest.counters.INGEST_COUNTERS)
    # The message hook (bridge links): called for every new incoming message and applied
    # edit or delete in a conversation it acts on. A hook may also have
    # ``acts_on(tx, conversation_id) -> bool`` (False: it does nothing for that
    # conversation) and ``announce(tx, conversation_id)`` (announces the read ``acts_on``
    # makes, so it rides with the batch's read); one without them acts on every conversation.
    on_message: Callable[[Tx, MessageChange], None] | None = None
    # The batch this frame is projected in (``ingest/batch.py``); None: a batch of its own.
    batch: Batch | None = None


# -- ids ---------------------------------------------------------------------------------
def derive_id(prefix: str, entity: str, bridge_id: str, *natural_key: str) -> str:
    """``prefix_`` + the first 32 hex digits of sha256 over the entity, the bridge and the
    natural key. Each part is length-prefixed, so distinct keys never share a preimage."""
    text = "\x1f".join([f"{len(part)}:{part}" for part in (entity, bridge_id, *natural_key)])
    return f"{prefix}_{sha256(text.encode()).hexdigest()[:32]}"


@lru_cache(maxsize=8192)
def identity_id_for(bridge_id: str, kind: str, canonical: str) -> str:
    return derive_id("idn", "identity", bridge_id, kind, canonical)


# Platforms whose read receipts may name a message outside the conversation they name:
# signal-cli's read syncs carry the sender, never the group, and a Signal message id
# (``<author>:<timestamp>``) is unique on its bridge, so a miss in the named conversation
# is looked up by remote id across the bridge (one match, or nothing).
RECEIPTS_LOCATE_BY_REMOTE_ID = frozenset({"signal"})


# Pure functions of their arguments, asked again and again for the same conversations and
# identities (and for the messages that mutations, reactions and receipts target): remembered.
@lru_cache(maxsize=8192)
def conversation_id_for(bridge_id: str, remote_conversation_id: str) -> str:
    return derive_id("conv", "conversation", bridge_id, remote_conversation_id)


@lru_cache(maxsize=8192)
def message_id_for(bridge_id: str, remote_conversation_id: str, remote_message_id: str) -> str:
    return derive_id("bmsg", "message", bridge_id, remote_conversation_id, remote_message_id)


def infer_conversation_kind(platform: str, remote_conversation_id: str) -> str:
    """The kind of a conversation first seen in a message.

    Signal: ``signal-group:`` is a group, anything else direct. WhatsApp: a ``@g.us`` chat
    is a group, ``@broadcast`` a broadcast, anything else direct. Google ids are opaque:
    direct until a conversation snapshot says otherwise.
    """
    if platform == "signal":
        return "group" if remote_conversation_id.startswith("signal-group:") else "direct"
    if platform == "whatsapp":
        lowered = remote_conversation_id.lower()
        if lowered.endswith("@g.us"):
            return "group"
        if lowered.endswith("@broadcast"):
            return "broadcast"
    return "direct"


# -- the frame ---------------------------------------------------------------------------
# Which pass takes an event, in the order the passes run (see the module docstring).
_BUCKET = {ConversationEvent: 0, MessageEvent: 1, MessageMutationEvent: 2, ReactionEvent: 3, ReceiptEvent: 4}


def project_frame(tx: Tx, ctx: ProjectionContext, events: list[Event]) -> bool:
    """Apply one frame's events in ``tx``; True when any row changed.

    With ``ctx.batch`` (a ``Batch`` whose ``read`` covered these events, ``want_rows``) the
    rules run against the batch's rows and the batch's owner flushes them; the owner runs
    each frame inside ``Batch.frame`` (``apply.frame_scope``), which takes a failed frame's
    changes back whole. Without one, the frame is a batch of its own: read, projected and
    flushed here (behind the ``COMMIT`` when ``tx`` writes behind); a failure leaves it
    unflushed."""
    if ctx.platform not in PLATFORMS:
        raise ProjectionError(f"unknown platform {ctx.platform!r}; expected one of {sorted(PLATFORMS)}")
    buckets: tuple[list[Any], list[Any], list[Any], list[Any], list[Any]] = ([], [], [], [], [])
    for i, ev in enumerate(events):
        index = _BUCKET.get(type(ev))
        if index is None:
            raise ProjectionError(f"event {i} is a {type(ev).__name__}, not one of the five event kinds")
        buckets[index].append(ev)
    batch = ctx.batch
    if batch is not None:
        return _project(tx, ctx, batch, buckets)
    batch = Batch(tx, ctx.bridge_id, ctx.platform, ctx.on_message)
    want_rows(batch, events)
    batch.read()
    changed = _project(tx, ctx, batch, buckets)
    batch.flush()
    return changed


def _project(tx: Tx, ctx: ProjectionContext, batch: Batch, buckets: tuple[list[Any], ...]) -> bool:
    convs, msgs, muts, reacts, receipts = buckets
    frame = _Frame(tx, ctx, batch)
    for ev in convs:
        frame.conversation(ev)
    if msgs:
        frame.messages(msgs)
    for ev in muts:
        frame.mutation(ev)
    if reacts or frame.snapshots:
        frame.reactions(reacts)
    for ev in receipts:
        frame.receipt(ev)
    counts = frame.counts
    if counts:
        counters = ctx.counters

        def add_counts() -> None:
            for name, n in counts.items():
                counters.incr(name, n)

        tx.after_commit(add_counts)
    return frame.changed


def key_of(platform: str, ref: IdentityRef, what: str) -> tuple[str, str]:
    """The identity key (kind, canonical) of ``ref`` on ``platform``."""
    if ref.platform == platform:
        # Proven by events.identity_ref: kind/canonical are identity_key(platform, raw).
        return ref.kind, ref.canonical
    try:
        return identity_key(platform, ref.raw)
    except InvalidEvent as exc:
        raise ProjectionError(f"{what}: {exc}") from None


def want_rows(batch: Batch, events: list[Any]) -> None:
    """Ask ``batch`` for every row ``project_frame`` will read or write for ``events``
    (``Batch.want``), so that one read brings them all. Every key is derived from the
    events (D8): the identities of senders, roster entries and reactors; the
    conversations; whole rosters of conversation snapshots and the senders' places in the
    rosters that senders join; the messages written, mutated, reacted to and receipted
    (and, where receipts locate messages by remote id, those); the reactions and fences
    of the messages reacted to; the read cursors receipts may move; the outbox items an
    outgoing message may echo; and whether the hook acts on a conversation. Anything it
    leaves out is read when first used."""
    platform, bridge_id = batch.platform, batch.bridge_id
    if platform not in PLATFORMS:
        return  # (``project_frame`` rejects it)
    # (A family is named only where an event needs it: the batch makes it on first use.)
    hook = batch.hook is not None
    sender_roster = platform in SENDER_ROSTER_PLATFORMS

    def identity(ref: Any) -> tuple[str, str] | None:
        try:
            key = key_of(platform, ref, "")
        except ProjectionError:
            return None  # the projection rejects it, in order
        if key[0] == "anonymous":
            return None
        batch.identities.want(*key)
        return key

    for ev in events:
        kind = type(ev)
        if kind is MessageEvent:
            remote_conv = ev.remote_conversation_id
            cid = conversation_id_for(bridge_id, remote_conv)
            mid = message_id_for(bridge_id, remote_conv, ev.remote_message_id)
            batch.conversations.want(remote_conv)
            batch.messages.want(mid)
            key = identity(ev.sender)
            if ev.reactions_snapshot and platform in SNAPSHOT_PLATFORMS:
                batch.reactions.want(mid)
            if ev.direction == "outgoing":
                batch.echoes.want(cid, ev.remote_message_id)
            else:
                if sender_roster and key is not None:
                    batch.rosters.want_member(cid, identity_id_for(bridge_id, *key))
                if hook:
                    batch.want_hook(cid)
        elif kind is ReceiptEvent:
            if ev.status == "read" and ev.actor.is_self:
                batch.cursors.want(conversation_id_for(bridge_id, ev.remote_conversation_id))
                for remote_message_id in ev.remote_message_ids:
                    batch.messages.want(message_id_for(bridge_id, ev.remote_conversation_id, remote_message_id))
                    if platform in RECEIPTS_LOCATE_BY_REMOTE_ID:
                        batch.messages.want_remote(remote_message_id)
                        batch.cursors.want_of_remote(remote_message_id)
        elif kind is ReactionEvent:
            identity(ev.actor)
            if platform not in SNAPSHOT_PLATFORMS:
                mid = message_id_for(bridge_id, ev.remote_conversation_id, ev.target_remote_message_id)
                batch.messages.want(mid)
                batch.reactions.want(mid)
        elif kind is MessageMutationEvent:
            batch.messages.want(message_id_for(bridge_id, ev.remote_conversation_id, ev.remote_message_id))
            if hook:
                batch.want_hook(conversation_id_for(bridge_id, ev.remote_conversation_id))
        elif kind is ConversationEvent:
            batch.conversations.want(ev.remote_conversation_id)
            batch.rosters.want_roster(conversation_id_for(bridge_id, ev.remote_conversation_id))
            for part in ev.participants:
                identity(part.identity)


def may_call_hook(batch: Batch, events: list[Any]) -> bool:
    """Whether projecting ``events`` may call the message hook (a new incoming message or
    an edit or delete, in a conversation the hook acts on): the hook reads the store, so
    what earlier frames of the batch changed is flushed before such a frame starts."""
    if batch.hook is None:
        return False
    bridge_id = batch.bridge_id
    for ev in events:
        kind = type(ev)
        if (kind is MessageEvent and ev.direction == "incoming") or kind is MessageMutationEvent:
            if batch.hook_acts_on(conversation_id_for(bridge_id, ev.remote_conversation_id)):
                return True
    return False


class _Snapshot:
    __slots__ = ("message_id", "conversation_id", "entries")

    def __init__(self, message_id: str, conversation_id: str) -> None:
        self.message_id = message_id
        self.conversation_id = conversation_id
        self.entries: dict[str, SnapshotEntry] = {}


class _Frame:
    """The state of one frame's projection: counts, and the per-kind passes."""

    __slots__ = ("tx", "ctx", "batch", "bridge_id", "platform", "now", "conv_ids", "snapshots", "counts", "changed")

    def __init__(self, tx: Tx, ctx: ProjectionContext, batch: Batch) -> None:
        self.tx = tx
        self.ctx = ctx
        self.batch = batch
        self.bridge_id = ctx.bridge_id
        self.platform = ctx.platform
        self.now = ctx.now_ms
        self.conv_ids: dict[str, str] = {}
        self.snapshots: dict[tuple[str, str], _Snapshot] = {}
        self.counts: dict[str, int] = {}
        self.changed = False

    def count(self, name: str, n: int = 1) -> None:
        if n:
            self.counts[name] = self.counts.get(name, 0) + n

    def wrote(self, counter: str, n: int = 1) -> None:
        """Count ``n`` rows written under ``counter``."""
        if n:
            self.counts[counter] = self.counts.get(counter, 0) + n
            self.changed = True

    def conv_id(self, remote_conversation_id: str) -> str:
        cid = self.conv_ids.get(remote_conversation_id)
        if cid is None:
            cid = self.conv_ids[remote_conversation_id] = conversation_id_for(self.bridge_id, remote_conversation_id)
        return cid

    def call_hook(self, change: MessageChange) -> None:
        """Tell the message hook, which reads the store: the frame's rows go first."""
        on_message = self.ctx.on_message
        if on_message is not None:
            self.batch.flush()
            on_message(self.tx, change)

    # -- identities --------------------------------------------------------------------
    def key_of(self, ref: IdentityRef, what: str) -> tuple[str, str]:
        return key_of(self.platform, ref, what)

    def identity(self, ref: IdentityRef, what: str, key: tuple[str, str] | None = None) -> tuple[str, str, str, bool]:
        """Resolve (create or merge) a non-anonymous identity; ``(id, raw, name, is_self)``."""
        if key is None:
            key = self.key_of(ref, what)
        kind, canonical = key
        if kind == "anonymous":
            raise ProjectionError(f"{what}: an anonymous identity ({ref.raw!r}) cannot be {what}")
        raw = ref.raw.strip()
        name = ref.name.strip()
        identities = self.batch.identities
        stored = identities.get(kind, canonical)
        if stored is None:
            iid = identity_id_for(self.bridge_id, kind, canonical)
            self.wrote("identities_written", identities.upsert(
                id=iid, kind=kind, canonical=canonical, raw=raw, display_name=name, is_self=ref.is_self,
                now=self.now,
            ))
            return iid, raw, name, ref.is_self
        new_name = name or stored.display_name
        new_self = stored.is_self or ref.is_self
        self.wrote("identities_written", identities.upsert(  # (writes only a changed row: its guard)
            id=stored.id, kind=kind, canonical=canonical, raw=raw, display_name=new_name, is_self=new_self,
            metadata=stored.metadata, now=self.now,
        ))
        return stored.id, raw, new_name, new_self

    # -- conversations -----------------------------------------------------------------
    def conversation(self, ev: ConversationEvent) -> None:
        remote = ev.remote_conversation_id
        what = f"conversation {remote!r}"
        # Validate the whole roster before writing anything.
        prepared: list[tuple[IdentityRef, tuple[str, str], str, bool]] = []
        seen: dict[tuple[str, str], int] = {}
        for i, part in enumerate(ev.participants):
            role = part.role or "member"
            if role not in ROLES:
                raise ProjectionError(
                    f"{what}: participant {i} has the unknown role {role!r}; expected one of {sorted(ROLES)}"
                )
            key = self.key_of(part.identity, f"{what}: participant {i}")
            if key[0] == "anonymous":
                raise ProjectionError(f"{what}: participant {i} is anonymous ({part.identity.raw!r})")
            if key in seen:
                raise ProjectionError(
                    f"{what}: participants {seen[key]} and {i} are the same identity {key[0]}:{key[1]}; "
                    "a roster names each identity once"
                )
            seen[key] = i
            prepared.append((part.identity, key, role, bool(part.active)))

        conversations = self.batch.conversations
        cid = self.conv_id(remote)
        stored = conversations.get(remote)
        if stored is not None:
            cid = self.conv_ids[remote] = stored.id
        self.wrote("conversations_written", conversations.upsert(  # (writes only a changed row: its guard)
            id=cid, remote_id=remote, kind=ev.kind, title=ev.title, remote_revision=ev.remote_revision,
            now=self.now,
        ))

        rows = [
            RosterRow(self.identity(ref, f"{what}: participant", key)[0], role, ref.name, active)
            for ref, key, role, active in prepared
        ]
        try:
            written = conversations.rosters.sync(conversation_id=cid, rows=rows, touched_at_ms=self.now)
        except RosterError as exc:  # pragma: no cover - the checks above come first
            raise ProjectionError(f"{what}: {exc}") from None
        self.wrote("roster_changes", written)

    # -- messages ----------------------------------------------------------------------
    def messages(self, msgs: list[MessageEvent]) -> None:
        batch, bridge_id, now, platform = self.batch, self.bridge_id, self.now, self.platform
        conversations, messages = batch.conversations, batch.messages
        # One mint-or-bump per conversation, with the newest message time of the frame.
        newest: dict[str, int] = {}
        for ev in msgs:
            at = newest.get(ev.remote_conversation_id)
            if at is None or ev.occurred_at_ms > at:
                newest[ev.remote_conversation_id] = ev.occurred_at_ms
        for remote, at in newest.items():
            self.wrote("conversations_written", conversations.mint_or_bump(
                id=self.conv_id(remote), remote_id=remote, kind=infer_conversation_kind(platform, remote),
                at_ms=at, now=now,
            ))

        sender_roster = platform in SENDER_ROSTER_PLATFORMS
        for index, ev in enumerate(msgs):
            if index:
                self.count("imported")
            remote_conv = ev.remote_conversation_id
            cid = self.conv_id(remote_conv)
            sender = self.identity(ev.sender, f"message {ev.remote_message_id!r}: sender")
            mid = message_id_for(bridge_id, remote_conv, ev.remote_message_id)
            direction = ev.direction
            if direction == "outgoing":  # an incoming echo is claimed by the link hook (bridges/echo.py)
                batch.echoes.claim(conversation_id=cid, message_id=mid, remote_message_id=ev.remote_message_id,
                                   now=now)
            incoming = direction == "incoming"
            result = messages.upsert(
                id=mid, conversation_id=cid, remote_message_id=ev.remote_message_id,
                sender_identity_id=sender[0], direction=direction, body=ev.body,
                reply_to_remote_id=ev.reply_to_remote_id, occurred_at_ms=ev.occurred_at_ms, now=now,
            )
            if result is not None:
                self.wrote("messages_written")
            if result == "inserted":
                batch.reactions.new_message(mid)
                if ev.attachments:  # metadata, with the message only (D61)
                    batch.attachments.add(mid, [attachment_metadata(a) for a in ev.attachments])
            if sender_roster and incoming and not sender[3]:
                self.wrote("roster_changes", conversations.rosters.ensure_and_touch(
                    conversation_id=cid, identity_id=sender[0], display_name=sender[2], now=now,
                ))
            if ev.reactions_snapshot:
                self.snapshots[(remote_conv, ev.remote_message_id)] = _Snapshot(mid, cid)
            if incoming and result == "inserted" and batch.hook_acts_on(cid):
                self.call_hook(MessageChange(
                    kind="new", bridge_id=bridge_id, conversation_id=cid, message_id=mid,
                    remote_message_id=ev.remote_message_id, sender_identity_id=sender[0],
                    direction=direction, body=ev.body, occurred_at_ms=ev.occurred_at_ms,
                ))
                messages.forget(mid)  # the hook may have claimed it as our own echo (made it outgoing)

    # -- mutations ---------------------------------------------------------------------
    def mutation(self, ev: MessageMutationEvent) -> None:
        messages = self.batch.messages
        mid = message_id_for(self.bridge_id, ev.remote_conversation_id, ev.remote_message_id)
        if ev.kind == "edit":
            change = messages.edit(id=mid, body=ev.body, at_ms=ev.occurred_at_ms, now=self.now)
        elif ev.kind == "delete":
            change = messages.delete(id=mid, at_ms=ev.occurred_at_ms, now=self.now)
        else:
            raise ProjectionError(f"mutation of {ev.remote_message_id!r}: unknown kind {ev.kind!r}")
        if change is None:
            if not messages.exists(mid):
                self.count("mutations_orphaned")
            return
        self.count("mutations")
        self.wrote("messages_written")
        cid = self.conv_id(ev.remote_conversation_id)
        if self.batch.hook_acts_on(cid):
            self.call_hook(MessageChange(
                kind=ev.kind, bridge_id=self.bridge_id, conversation_id=cid, message_id=mid,
                remote_message_id=ev.remote_message_id, sender_identity_id=change.sender_identity_id,
                direction=change.direction, body=ev.body if ev.kind == "edit" else "",
                occurred_at_ms=ev.occurred_at_ms,
            ))

    # -- reactions ---------------------------------------------------------------------
    def reactor(self, ref: IdentityRef, what: str) -> tuple[str, str | None, bool]:
        """(reactor_key, identity_id, is_self) of a reaction's actor."""
        key = self.key_of(ref, what)
        if key[0] == "anonymous":
            return key[1], None, False
        ident = self.identity(ref, what, key)
        if ref.is_self:
            return SELF_REACTOR, ident[0], True
        return ident[0], ident[0], False

    def reactions(self, reacts: list[ReactionEvent]) -> None:
        batch, bridge_id, now = self.batch, self.bridge_id, self.now
        reactions, messages = batch.reactions, batch.messages
        snapshot_platform = self.platform in SNAPSHOT_PLATFORMS
        for ev in reacts:
            what = f"reaction on {ev.target_remote_message_id!r}"
            snap = self.snapshots.get((ev.remote_conversation_id, ev.target_remote_message_id))
            if snap is not None:
                if ev.action == "remove":
                    continue  # a snapshot lists present reactions; absence is the removal
                key, identity_id, is_self = self.reactor(ev.actor, what)
                snap.entries[key] = SnapshotEntry(identity_id, is_self, ev.emoji, ev.occurred_at_ms)
                continue
            if snapshot_platform:
                # Snapshot reactions belong to a message of the same frame.
                self.count("reactions_orphaned")
                continue
            mid = message_id_for(bridge_id, ev.remote_conversation_id, ev.target_remote_message_id)
            if not messages.exists(mid):
                self.count("reactions_orphaned")
                continue
            key, identity_id, is_self = self.reactor(ev.actor, what)
            removed = ev.action == "remove"
            self.wrote("reactions_removed" if removed else "reactions_applied", reactions.apply_delta(
                message_id=mid, reactor_key=key, conversation_id=self.conv_id(ev.remote_conversation_id),
                identity_id=identity_id, is_self=is_self, emoji=ev.emoji, removed=removed,
                occurred_at_ms=ev.occurred_at_ms, source_seq_ms=self.ctx.received_at_ms, now=now,
            ))
        seq = self.ctx.received_at_ms
        for snap in self.snapshots.values():
            result = reactions.apply_snapshot(
                message_id=snap.message_id, conversation_id=snap.conversation_id, entries=snap.entries,
                source_seq_ms=seq, now=now,
            )
            self.wrote("reactions_applied", result.applied)
            self.wrote("reactions_removed", result.removed)
            if result.fence_written:
                self.changed = True

    # -- receipts ----------------------------------------------------------------------
    def receipt(self, ev: ReceiptEvent) -> None:
        if ev.status != "read" or not ev.actor.is_self:
            self.count("receipts_dropped")
            return
        messages = self.batch.messages
        home = self.conv_id(ev.remote_conversation_id)
        best: dict[str, tuple[int, str]] = {}  # conversation id -> its newest message named
        for remote_message_id in ev.remote_message_ids:
            conv, mid = home, message_id_for(self.bridge_id, ev.remote_conversation_id, remote_message_id)
            at = messages.occurred_at(mid)
            if at is None and self.platform in RECEIPTS_LOCATE_BY_REMOTE_ID:
                found = messages.locate_remote(remote_message_id)
                if found is not None:
                    mid, conv, at = found
            if at is not None and (conv not in best or (at, mid) > best[conv]):
                best[conv] = (at, mid)
        written = 0
        for conv, (at, mid) in best.items():
            rows = self.batch.cursors.advance(
                conversation_id=conv, message_id=mid, message_at_ms=at, read_at_ms=ev.occurred_at_ms, now=self.now,
            )
            self.wrote("receipts_self", rows)
            written += rows
        if not written:
            self.count("receipts_dropped")
