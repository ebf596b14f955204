"""The projection: one decoded frame's events applied to the bridge tables, writing only
what changed (the write guards themselves live in the ``tidings.store`` modules
``identities``, ``conversations``, ``bridge_messages``, ``reactions``, ``read_cursors``).

The worker calls :func:`project_frame` inside the frame's one transaction and marks the
frame processed in that same transaction, so a frame is applied whole or not at all.
Database errors propagate raw (the worker retries transient ones and quarantines the
rest); bad data the decoders let through raises :class:`ProjectionError`, whose text is
the quarantine cause.

Order within a frame, whatever the decoded order: conversations, messages, mutations,
reactions, receipts.

* **Ids** are derived (:func:`derive_id`): sha256 of the entity, the bridge and the
  natural key, so replaying the same frames into a fresh store reproduces every id.
* **Identities** are canonicalised by ``tidings.ingest.events.identity_key`` (the one
  implementation), once per sighting: a ref the decoder built with ``identity_ref`` for
  this platform carries its proven ``kind``/``canonical``, any other is canonicalised
  here. Merge rule of a new sighting: ``raw`` is replaced,
  ``display_name`` only by a non-empty name, ``is_self`` only turns on. An unchanged
  identity is not written (the check uses the row read once per frame); a changed one goes
  through the guarded upsert. Anonymous reactors (``anon:<emoji>``) never get a row.
* **Conversations**: a ``ConversationEvent`` (Google) writes kind/title/revision only
  when one differs, then diffs the roster (one read; no write when unchanged; only the
  difference otherwise; a repeated identity or an unknown role is a ``ProjectionError``);
  a roster change advances ``updated_at_ms`` monotonically. Messages mint their
  conversation when it is new (kind inferred from the remote id) and otherwise raise
  ``last_message_at_ms`` only when strictly newer: one statement per conversation per
  frame. On Signal and WhatsApp, which send no rosters, an incoming message's sender is
  added to the roster when absent.
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

from ..bridges import echo
from ..counters import Counters
from ..store import attachments, bridge_messages, conversations, identities, reactions, read_cursors
from ..store.conversations import RosterError, RosterRow
from ..store.engine import NO_ROWS, Rows, Tx
from ..store.reactions import SELF_REACTOR, SnapshotEntry
from .attachments import metadata as attachment_metadata
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
    "announce_reads",
    "ProjectionError",
    "ROLES",
    "conversation_id_for",
    "derive_id",
    "identity_id_for",
    "infer_conversation_kind",
    "message_id_for",
    "project_frame",
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
    # edit or delete. A hook may also have ``acts_on(tx, conversation_id) -> bool`` (False:
    # it does nothing for that conversation, so its messages may go behind) and
    # ``announce(tx, conversation_id)`` (announces the read ``acts_on`` makes); one without
    # them is taken to act on every conversation.
    on_message: Callable[[Tx, MessageChange], None] | None = None


# -- ids ---------------------------------------------------------------------------------
def derive_id(prefix: str, entity: str, bridge_id: str, *natural_key: str) -> str:
    """``prefix_`` + the first 32 hex digits of sha256 over the entity, the bridge and the
    natural key. Each part is length-prefixed, so distinct keys never share a preimage."""
    text = "\x1f".join([f"{len(part)}:{part}" for part in (entity, bridge_id, *natural_key)])
    return f"{prefix}_{sha256(text.encode()).hexdigest()[:32]}"


def identity_id_for(bridge_id: str, kind: str, canonical: str) -> str:
    return derive_id("idn", "identity", bridge_id, kind, canonical)


# Platforms whose read receipts may name a message outside the conversation they name:
# signal-cli's read syncs carry the sender, never the group, and a Signal message id
# (``<author>:<timestamp>``) is unique on its bridge, so a miss in the named conversation
# is looked up by remote id across the bridge (one match, or nothing).
RECEIPTS_LOCATE_BY_REMOTE_ID = frozenset({"signal"})


# Pure functions of their arguments, asked again and again for the same conversations
# (and for the messages that mutations, reactions and receipts target): remembered.
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


def project_frame(tx: Tx, ctx: ProjectionContext, events: list[Event]) -> bool | Rows:
    """Apply one frame's events in ``tx``; truthy when any row changed. With writes sent
    behind (``Tx.later``) whose outcome decides it, a ``Rows`` that tells when read (reading
    it before the commit costs a round trip; apply on append never reads it)."""
    if ctx.platform not in PLATFORMS:
        raise ProjectionError(f"unknown platform {ctx.platform!r}; expected one of {sorted(PLATFORMS)}")
    buckets: tuple[list[Any], list[Any], list[Any], list[Any], list[Any]] = ([], [], [], [], [])
    convs, msgs, muts, reacts, receipts = buckets
    for i, ev in enumerate(events):
        index = _BUCKET.get(type(ev))
        if index is None:
            raise ProjectionError(f"event {i} is a {type(ev).__name__}, not one of the five event kinds")
        buckets[index].append(ev)

    frame = _Frame(tx, ctx)
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

    counts, behind = frame.counts, frame.behind
    if counts or behind:
        counters = ctx.counters

        def add_counts() -> None:
            for name, rows, if_none in behind:  # every write has run: the commit did
                n = int(rows)
                if if_none:
                    n = 0 if n else 1
                if n:
                    counts[name] = counts.get(name, 0) + n
            for name, n in counts.items():
                counters.incr(name, n)

        tx.after_commit(add_counts)
    if frame.changed or not frame.pending:
        return frame.changed
    return sum(frame.pending, NO_ROWS)


def key_of(platform: str, ref: IdentityRef, what: str) -> tuple[str, str]:
    """The identity key (kind, canonical) of ``ref`` on ``platform``."""
    if ref.platform == platform:
        # Proven by events.identity_ref: kind/canonical are identity_key(platform, raw).
        return ref.kind, ref.canonical
    try:
        return identity_key(platform, ref.raw)
    except InvalidEvent as exc:
        raise ProjectionError(f"{what}: {exc}") from None


def announce_reads(tx: Tx, bridge_id: str, platform: str, events: list[Event], hook: Any = None) -> None:
    """Announce (``Tx.read_ahead``, PostgreSQL) the reads ``project_frame`` will make of
    ``events`` whose answers nothing the frame writes before them can change, so they ride
    in the round trip of an earlier statement (apply on append: the frame's inbox insert).

    They are: the identities of the senders, of the roster entries and of the reactors
    (the frame writes an identity only after reading it), each conversation snapshot's
    row (the conversation pass reads it first), each snapshot message's fence and
    reactions (no earlier pass writes them), an outgoing message's echo lock and read, the
    messages that mutations and delta reactions name and receipts read (unless the frame
    writes them first), and a conversation snapshot's roster (withdrawn when the
    conversation's row is written before the roster is read). With a message ``hook``
    that can say which conversations it acts on: that read, for each conversation whose
    incoming messages (without attachments) or mutations the frame carries.
    A read that the projection does not make after all is forgotten when the frame's
    savepoint ends (``Tx.savepoint``), so it never answers a later frame."""
    if tx.dialect != "postgresql" or platform not in PLATFORMS:
        return  # (an unknown platform is ``project_frame``'s to reject)
    keys: list[tuple[str, str]] = []
    refs: list[IdentityRef] = []
    # Messages this frame writes: a read of one of them must wait for that write.
    written = {message_id_for(bridge_id, ev.remote_conversation_id, ev.remote_message_id)
               for ev in events if isinstance(ev, MessageEvent)}
    targets: list[str] = []  # rows the frame reads, each by id, before any write of its own
    for ev in events:
        if isinstance(ev, MessageMutationEvent):
            targets.append(message_id_for(bridge_id, ev.remote_conversation_id, ev.remote_message_id))
        elif isinstance(ev, ReactionEvent) and platform not in SNAPSHOT_PLATFORMS:
            mid = message_id_for(bridge_id, ev.remote_conversation_id, ev.target_remote_message_id)
            if mid not in written and mid not in targets:
                bridge_messages.read_ahead_exists(tx, mid)
        elif isinstance(ev, ReceiptEvent) and ev.status == "read" and ev.actor.is_self:
            for remote_message_id in ev.remote_message_ids:
                mid = message_id_for(bridge_id, ev.remote_conversation_id, remote_message_id)
                if mid not in written and mid not in targets:
                    bridge_messages.read_ahead_occurred_at(tx, mid)
    for mid in targets:
        if mid not in written:
            bridge_messages.read_ahead_exists(tx, mid)
    announce_hook = getattr(hook, "announce", None)  # (with ``acts_on``, which reads it)
    if announce_hook is not None:
        hooked: set[str] = set()
        for ev in events:
            if (isinstance(ev, MessageEvent) and ev.direction == "incoming" and not ev.attachments) or (
                isinstance(ev, MessageMutationEvent) and ev.kind in ("edit", "delete")
            ):
                cid = conversation_id_for(bridge_id, ev.remote_conversation_id)
                if cid not in hooked:
                    hooked.add(cid)
                    announce_hook(tx, cid)
    for ev in events:
        if isinstance(ev, MessageEvent):
            refs.append(ev.sender)
            if ev.reactions_snapshot and platform in SNAPSHOT_PLATFORMS:
                reactions.read_ahead_snapshot(tx, message_id_for(bridge_id, ev.remote_conversation_id,
                                                                 ev.remote_message_id))
            if ev.direction == "outgoing":
                echo.announce(tx, bridge_id=bridge_id, conversation_id=conversation_id_for(
                    bridge_id, ev.remote_conversation_id), remote_message_id=ev.remote_message_id)
        elif isinstance(ev, ReactionEvent):
            refs.append(ev.actor)
        elif isinstance(ev, ConversationEvent):
            refs.extend(part.identity for part in ev.participants)
            conversations.read_ahead_by_key(tx, bridge_id, ev.remote_conversation_id)
            conversations.read_ahead_roster(tx, conversation_id_for(bridge_id, ev.remote_conversation_id))
    seen: set[tuple[str, str]] = set()
    for ref in refs:
        try:
            key = key_of(platform, ref, "")
        except ProjectionError:
            continue  # the projection rejects it, in order
        if key[0] != "anonymous" and key not in seen:
            seen.add(key)
            keys.append(key)
    for kind_, canonical in keys:
        identities.read_ahead_by_key(tx, bridge_id, kind_, canonical)


class _Snapshot:
    __slots__ = ("message_id", "conversation_id", "new", "entries")

    def __init__(self, message_id: str, conversation_id: str, new: bool) -> None:
        self.message_id = message_id
        self.conversation_id = conversation_id
        self.new = new
        self.entries: dict[str, SnapshotEntry] = {}


class _Frame:
    """The state of one frame's projection: caches, counts, and the per-kind passes."""

    __slots__ = ("tx", "ctx", "bridge_id", "platform", "now", "idents", "conv_ids", "snapshots", "counts", "changed",
                 "behind", "pending", "write_behind", "hooked")

    def __init__(self, tx: Tx, ctx: ProjectionContext) -> None:
        self.tx = tx
        self.ctx = ctx
        self.bridge_id = ctx.bridge_id
        self.platform = ctx.platform
        self.now = ctx.now_ms
        # (kind, canonical) -> [id, raw, display_name, is_self, metadata], as stored now
        self.idents: dict[tuple[str, str], list[Any]] = {}
        self.conv_ids: dict[str, str] = {}
        self.snapshots: dict[tuple[str, str], _Snapshot] = {}
        self.counts: dict[str, int] = {}
        self.changed = False
        # Counts of writes still waiting behind (``Tx.later``): (counter, rows, if_none),
        # resolved once the transaction has committed (``project_frame``).
        self.behind: list[tuple[str, Rows, bool]] = []
        self.pending: list[Rows] = []  # writes whose outcome decides ``changed``, not run yet
        self.write_behind = tx is not None and tx.write_behind and tx.dialect == "postgresql"
        self.hooked: dict[str, bool] = {}  # conversation id -> whether the message hook acts on it

    def hook_acts_on(self, conversation_id: str) -> bool:
        """Whether the message hook (``ctx.on_message``) acts on this conversation's
        messages: False without a hook, True for a hook that cannot tell. Read once a frame."""
        hook = self.ctx.on_message
        if hook is None:
            return False
        acts_on = getattr(hook, "acts_on", None)
        if acts_on is None:
            return True
        known = self.hooked.get(conversation_id)
        if known is None:
            known = self.hooked[conversation_id] = bool(acts_on(self.tx, conversation_id))
        return known

    def count(self, name: str, n: int = 1) -> None:
        if n:
            self.counts[name] = self.counts.get(name, 0) + n

    def wrote(self, counter: str, n: int | Rows = 1) -> None:
        """Count ``n`` rows written under ``counter``. ``Rows`` not known yet (writes waiting
        behind) are counted after the commit."""
        if isinstance(n, Rows):
            if not n.known():
                self.behind.append((counter, n, False))
                self.pending.append(n)
                return
            n = int(n)
        if n:
            self.counts[counter] = self.counts.get(counter, 0) + n
            self.changed = True

    def conv_id(self, remote_conversation_id: str) -> str:
        cid = self.conv_ids.get(remote_conversation_id)
        if cid is None:
            cid = self.conv_ids[remote_conversation_id] = conversation_id_for(self.bridge_id, remote_conversation_id)
        return cid

    # -- identities --------------------------------------------------------------------
    def key_of(self, ref: IdentityRef, what: str) -> tuple[str, str]:
        return key_of(self.platform, ref, what)

    def identity(self, ref: IdentityRef, what: str, key: tuple[str, str] | None = None) -> list[Any]:
        """Resolve (create or merge) a non-anonymous identity; ``[id, raw, name, is_self, metadata]``."""
        if key is None:
            key = self.key_of(ref, what)
        kind, canonical = key
        if kind == "anonymous":
            raise ProjectionError(f"{what}: an anonymous identity ({ref.raw!r}) cannot be {what}")
        raw = ref.raw.strip()
        name = ref.name.strip()
        stored = self.idents.get(key)
        if stored is None:
            row = identities.by_key(self.tx, self.bridge_id, kind, canonical)
            if row is None:
                iid = identity_id_for(self.bridge_id, kind, canonical)
                self.wrote("identities_written", identities.upsert(
                    self.tx, id=iid, bridge_id=self.bridge_id, kind=kind, canonical=canonical, raw=raw,
                    display_name=name, is_self=ref.is_self, now=self.now,
                ))
                stored = self.idents[key] = [iid, raw, name, ref.is_self, "{}"]
                return stored
            stored = self.idents[key] = [row[0], row[1], row[2], bool(row[3]), row[4]]
        new_name = name or stored[2]
        new_self = stored[3] or ref.is_self
        if raw != stored[1] or new_name != stored[2] or new_self != stored[3]:
            self.wrote("identities_written", identities.upsert(
                self.tx, id=stored[0], bridge_id=self.bridge_id, kind=kind, canonical=canonical, raw=raw,
                display_name=new_name, is_self=new_self, metadata=stored[4], now=self.now,
            ))
            stored[1], stored[2], stored[3] = raw, new_name, new_self
        return stored

    def read_ahead_senders(self, msgs: list[MessageEvent]) -> None:
        """Announce the stored rows of the senders not read yet: on PostgreSQL they come
        back in the recency bump's round trip (``read_ahead_identities``). A sender whose
        key is bad is left to ``identity`` to reject, in order."""
        keys = []
        for ev in msgs:
            try:
                keys.append(self.key_of(ev.sender, "sender"))
            except ProjectionError:
                continue
        self.read_ahead_identities(keys)

    def read_ahead_identities(self, keys: list[tuple[str, str]]) -> None:
        """Announce the stored rows of these identities not read yet (``Tx.read_ahead``):
        on PostgreSQL they ride with the frame's next statement. Safe because this frame
        writes an identity only after it has read it (``identity``), and a write of one
        identity changes no other's row. SQLite: nothing (a read costs no round trip)."""
        if self.tx.dialect != "postgresql":
            return
        for kind, canonical in keys:
            if kind != "anonymous" and (kind, canonical) not in self.idents:
                identities.read_ahead_by_key(self.tx, self.bridge_id, kind, canonical)

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

        # The participants' identities come back in the conversation read's round trip.
        self.read_ahead_identities([key for _ref, key, _role, _active in prepared])
        cid = self.conv_id(remote)
        stored = conversations.by_key(self.tx, self.bridge_id, remote)
        if stored is not None:
            cid = self.conv_ids[remote] = stored[0]
        if stored is None or (stored[1], stored[2], stored[3]) != (ev.kind, ev.title, ev.remote_revision):
            self.wrote("conversations_written", conversations.upsert(
                self.tx, id=cid, bridge_id=self.bridge_id, remote_id=remote, kind=ev.kind, title=ev.title,
                remote_revision=ev.remote_revision, now=self.now,
            ))
            conversations.drop_roster_ahead(self.tx, cid)  # announced before this write: read afresh

        rows = [
            RosterRow(self.identity(ref, f"{what}: participant", key)[0], role, ref.name, active)
            for ref, key, role, active in prepared
        ]
        try:
            written = conversations.sync_roster(
                self.tx, conversation_id=cid, bridge_id=self.bridge_id, rows=rows, touched_at_ms=self.now
            )
        except RosterError as exc:  # pragma: no cover - the checks above come first
            raise ProjectionError(f"{what}: {exc}") from None
        self.wrote("roster_changes", written)

    # -- messages ----------------------------------------------------------------------
    def messages(self, msgs: list[MessageEvent]) -> None:
        tx, bridge_id, now, platform = self.tx, self.bridge_id, self.now, self.platform
        self.read_ahead_senders(msgs)
        # One mint-or-bump per conversation, with the newest message time of the frame.
        newest: dict[str, int] = {}
        for ev in msgs:
            at = newest.get(ev.remote_conversation_id)
            if at is None or ev.occurred_at_ms > at:
                newest[ev.remote_conversation_id] = ev.occurred_at_ms
        for remote, at in newest.items():
            self.wrote("conversations_written", conversations.mint_or_bump(
                tx, id=self.conv_id(remote), bridge_id=bridge_id, remote_id=remote,
                kind=infer_conversation_kind(platform, remote), at_ms=at, now=now,
            ))

        sender_roster = platform in SENDER_ROSTER_PLATFORMS
        on_message = self.ctx.on_message
        for index, ev in enumerate(msgs):
            if index:
                self.count("imported")
            remote_conv = ev.remote_conversation_id
            cid = self.conv_id(remote_conv)
            sender = self.identity(ev.sender, f"message {ev.remote_message_id!r}: sender")
            mid = message_id_for(bridge_id, remote_conv, ev.remote_message_id)
            direction = ev.direction
            if direction == "outgoing":  # an incoming echo is claimed by the link hook (bridges/echo.py)
                echo.claim(tx, bridge_id=bridge_id, conversation_id=cid, message_id=mid,
                           remote_message_id=ev.remote_message_id, now=now,
                           announced=self.write_behind and cid == conversation_id_for(bridge_id, remote_conv))
            incoming = direction == "incoming"
            ensure = sender_roster and incoming and not sender[3]
            # Sent behind, the upsert's outcome is not known until the commit: fine unless
            # attachments or the link hook depend on "inserted" (a reaction snapshot then
            # reads the message's reactions and fence, empty for a new message: same rows).
            behind = self.write_behind and not ev.attachments and not (incoming and self.hook_acts_on(cid))
            if ensure and not behind and tx.dialect == "postgresql":
                # Independent of the message row: rides in the upsert's round trip.
                conversations.ensure_participant_ahead(
                    tx, conversation_id=cid, identity_id=sender[0], bridge_id=bridge_id, display_name=sender[2],
                    now=now,
                )
            fields = {
                "id": mid, "bridge_id": bridge_id, "conversation_id": cid, "remote_message_id": ev.remote_message_id,
                "sender_identity_id": sender[0], "direction": direction, "body": ev.body,
                "reply_to_remote_id": ev.reply_to_remote_id, "occurred_at_ms": ev.occurred_at_ms, "now": now,
            }
            result: str | None = None
            if behind:
                self.wrote("messages_written", bridge_messages.upsert_behind(tx, **fields))
            else:
                result = bridge_messages.upsert(tx, **fields)
                if result is not None:
                    self.wrote("messages_written")
            if result == "inserted" and ev.attachments:  # metadata, with the message only (D61)
                attachments.insert_all(tx, mid, bridge_id, [attachment_metadata(a) for a in ev.attachments])
            if ensure:
                self.wrote("roster_changes", conversations.ensure_and_touch(
                    tx, conversation_id=cid, identity_id=sender[0], bridge_id=bridge_id, display_name=sender[2],
                    now=now,
                ))
            if ev.reactions_snapshot:
                self.snapshots[(remote_conv, ev.remote_message_id)] = _Snapshot(mid, cid, result == "inserted")
            if on_message is not None and incoming and result == "inserted":  # (never when behind)
                on_message(
                    tx,
                    MessageChange(
                        kind="new", bridge_id=bridge_id, conversation_id=cid, message_id=mid,
                        remote_message_id=ev.remote_message_id, sender_identity_id=sender[0],
                        direction=direction, body=ev.body, occurred_at_ms=ev.occurred_at_ms,
                    ),
                )

    # -- mutations ---------------------------------------------------------------------
    def mutation(self, ev: MessageMutationEvent) -> None:
        mid = message_id_for(self.bridge_id, ev.remote_conversation_id, ev.remote_message_id)
        if self.write_behind and ev.kind in ("edit", "delete") and not self.hook_acts_on(
            self.conv_id(ev.remote_conversation_id)
        ):
            # Only counts depend on it: the existence read (announced with the inbox insert)
            # first, then the write behind; a missing message is left unwritten, as the
            # guarded write would leave it.
            if not bridge_messages.exists(self.tx, mid):
                self.count("mutations_orphaned")
                return
            if ev.kind == "edit":
                rows = bridge_messages.edit_behind(self.tx, id=mid, body=ev.body, at_ms=ev.occurred_at_ms, now=self.now)
            else:
                rows = bridge_messages.delete_behind(self.tx, id=mid, at_ms=ev.occurred_at_ms, now=self.now)
            self.wrote("mutations", rows)
            self.wrote("messages_written", rows)
            return
        if ev.kind == "edit":
            change = bridge_messages.edit(self.tx, id=mid, body=ev.body, at_ms=ev.occurred_at_ms, now=self.now)
        elif ev.kind == "delete":
            change = bridge_messages.delete(self.tx, id=mid, at_ms=ev.occurred_at_ms, now=self.now)
        else:
            raise ProjectionError(f"mutation of {ev.remote_message_id!r}: unknown kind {ev.kind!r}")
        if change is None:
            if not bridge_messages.exists(self.tx, mid):
                self.count("mutations_orphaned")
            return
        self.count("mutations")
        self.wrote("messages_written")
        if self.ctx.on_message is not None:
            self.ctx.on_message(
                self.tx,
                MessageChange(
                    kind=ev.kind, bridge_id=self.bridge_id, conversation_id=self.conv_id(ev.remote_conversation_id),
                    message_id=mid, remote_message_id=ev.remote_message_id,
                    sender_identity_id=change.sender_identity_id, direction=change.direction,
                    body=ev.body if ev.kind == "edit" else "", occurred_at_ms=ev.occurred_at_ms,
                ),
            )

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
        tx, bridge_id, now = self.tx, self.bridge_id, self.now
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
            if not bridge_messages.exists(tx, mid):
                self.count("reactions_orphaned")
                continue
            key, identity_id, is_self = self.reactor(ev.actor, what)
            removed = ev.action == "remove"
            self.wrote("reactions_removed" if removed else "reactions_applied", reactions.apply_delta(
                tx, message_id=mid, reactor_key=key, bridge_id=bridge_id,
                conversation_id=self.conv_id(ev.remote_conversation_id), identity_id=identity_id,
                is_self=is_self, emoji=ev.emoji, removed=removed, occurred_at_ms=ev.occurred_at_ms,
                source_seq_ms=self.ctx.received_at_ms, now=now,
            ))
        seq = self.ctx.received_at_ms
        for snap in self.snapshots.values():
            result = reactions.apply_snapshot(
                tx, message_id=snap.message_id, bridge_id=bridge_id, conversation_id=snap.conversation_id,
                entries=snap.entries, source_seq_ms=seq, now=now, new_message=snap.new,
            )
            self.wrote("reactions_applied", result.applied)
            self.wrote("reactions_removed", result.removed)
            if not result.fence_written.known():
                self.pending.append(result.fence_written)
            elif result.fence_written:
                self.changed = True

    # -- receipts ----------------------------------------------------------------------
    def receipt(self, ev: ReceiptEvent) -> None:
        if ev.status != "read" or not ev.actor.is_self:
            self.count("receipts_dropped")
            return
        home = self.conv_id(ev.remote_conversation_id)
        best: dict[str, tuple[int, str]] = {}  # conversation id -> its newest message named
        for remote_message_id in ev.remote_message_ids:
            conv, mid = home, message_id_for(self.bridge_id, ev.remote_conversation_id, remote_message_id)
            at = bridge_messages.occurred_at(self.tx, mid)
            if at is None and self.platform in RECEIPTS_LOCATE_BY_REMOTE_ID:
                found = bridge_messages.locate_remote(self.tx, self.bridge_id, remote_message_id)
                if found is not None:
                    mid, conv, at = found
            if at is not None and (conv not in best or (at, mid) > best[conv]):
                best[conv] = (at, mid)
        written = NO_ROWS
        for conv, (at, mid) in best.items():
            rows = read_cursors.advance(
                self.tx, conversation_id=conv, bridge_id=self.bridge_id,
                message_id=mid, message_at_ms=at, read_at_ms=ev.occurred_at_ms, now=self.now,
            )
            self.wrote("receipts_self", rows)
            written += rows
        if not written.known():
            self.behind.append(("receipts_dropped", written, True))
        elif not written:
            self.count("receipts_dropped")
