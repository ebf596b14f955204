"""Reactions on bridge messages: one row per (message, reactor), removals as tombstones.

``Reactions`` holds what a batch of frames reads and writes of one bridge's reactions and
reaction fences (``store/batch_rows.py``, D115). Two modes:

* **delta** (Signal, WhatsApp) — ``apply_delta``: last writer wins by occurrence time. A
  strictly newer event always writes; an equal time writes only when the content differs
  (state, the emoji of an active reaction, the reactor's identity or self flag); an older
  one never. A removal that arrives before any add inserts a tombstone, which fences the
  stale add that may follow.
* **snapshot** (Google) — ``apply_snapshot``: the frame carries the complete set of a
  message's reactions. A per-message fence holds the receipt time (``source_seq_ms``) of
  the newest snapshot applied. A strictly older snapshot is rejected whole; an equal or
  newer one writes only the reactions that changed, tombstones every absent reactor, and
  advances the fence, **even when the snapshot is empty** (the fence is what keeps a
  retried older snapshot from bringing a reaction back). A fence write at the fence's own
  sequence is skipped.

The flush writes every changed reaction in one upsert and every changed fence in another;
each carries its guard (the content differs; the fence moves forwards).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .batch_rows import Journal, Read, Table, Write, Writer, read_all
from .engine import Tx
from .sql import Stmt

SELF_REACTOR = "self"


class Reaction(NamedTuple):
    """A stored reaction (its key, (message, reactor), is the batch's)."""

    conversation_id: str
    reactor_identity_id: str | None
    reactor_is_self: bool
    emoji: str
    state: str
    occurred_at_ms: int
    source_seq_ms: int
    created_at_ms: int
    updated_at_ms: int

    def content(self) -> tuple[Any, ...]:
        return (self.reactor_identity_id, self.reactor_is_self, self.emoji, self.state, self.occurred_at_ms,
                self.source_seq_ms)


#: A stored fence: (source_seq_ms, updated_at_ms).
Fence = tuple[int, int]

READ_OF_MESSAGES = Read(
    "reactions.read_of_messages", "reactions",
    "message_id, reactor_key, conversation_id, reactor_identity_id, reactor_is_self, emoji, state, occurred_at_ms, "
    "source_seq_ms, created_at_ms, updated_at_ms", "message_id",
)
READ_FENCES = Read("fences.read", "reaction_fences", "message_id, source_seq_ms, updated_at_ms", "message_id")
WRITE_ROWS = Write(
    "reactions.write_rows",
    "INSERT INTO reactions (message_id, reactor_key, bridge_id, conversation_id, reactor_identity_id, "
    "reactor_is_self, emoji, state, occurred_at_ms, source_seq_ms, created_at_ms, updated_at_ms) "
    "SELECT r.message_id, r.reactor_key, :bridge_id, r.conversation_id, r.reactor_identity_id, "
    "r.reactor_is_self, r.emoji, r.state, r.occurred_at_ms, r.source_seq_ms, r.created_at_ms, r.updated_at_ms "
    "FROM {rows} WHERE true ON CONFLICT (message_id, reactor_key) DO UPDATE SET "
    "reactor_identity_id = excluded.reactor_identity_id, reactor_is_self = excluded.reactor_is_self, "
    "emoji = excluded.emoji, state = excluded.state, occurred_at_ms = excluded.occurred_at_ms, "
    "source_seq_ms = excluded.source_seq_ms, updated_at_ms = excluded.updated_at_ms "
    "WHERE (reactions.reactor_identity_id, reactions.reactor_is_self, reactions.emoji, reactions.state, "
    "reactions.occurred_at_ms, reactions.source_seq_ms) IS DISTINCT FROM (excluded.reactor_identity_id, "
    "excluded.reactor_is_self, excluded.emoji, excluded.state, excluded.occurred_at_ms, "
    "excluded.source_seq_ms)",
    "message_id text, reactor_key text, conversation_id text, reactor_identity_id text, reactor_is_self boolean, "
    "emoji text, state text, occurred_at_ms bigint, source_seq_ms bigint, created_at_ms bigint, "
    "updated_at_ms bigint",
)
WRITE_FENCES = Write(
    "fences.write_rows",
    "INSERT INTO reaction_fences (message_id, bridge_id, source_seq_ms, updated_at_ms) "
    "SELECT r.message_id, :bridge_id, r.source_seq_ms, r.updated_at_ms FROM {rows} WHERE true "
    "ON CONFLICT (message_id) DO UPDATE SET source_seq_ms = excluded.source_seq_ms, "
    "updated_at_ms = excluded.updated_at_ms WHERE excluded.source_seq_ms > reaction_fences.source_seq_ms",
    "message_id text, source_seq_ms bigint, updated_at_ms bigint",
)


class SnapshotEntry(NamedTuple):
    """One reactor's reaction in a snapshot."""

    identity_id: str | None
    is_self: bool
    emoji: str
    occurred_at_ms: int


class SnapshotResult(NamedTuple):
    accepted: bool  # False: strictly older than the fence, rejected whole (nothing written)
    applied: int  # reaction rows written as active
    removed: int  # reaction rows tombstoned
    fence_written: int


class Reactions:
    """The reactions and fences of one bridge's messages that a batch reads and writes:
    a message's reactions are read whole (``want``), with its fence."""

    __slots__ = ("tx", "bridge_id", "table", "fences")

    def __init__(self, tx: Tx, journal: Journal, bridge_id: str) -> None:
        self.tx = tx
        self.bridge_id = bridge_id
        # message id -> {reactor_key: Reaction}, the message's every reaction (never mutated in place)
        self.table = Table(journal)
        self.fences = Table(journal)  # message id -> Fence, or None

    def want(self, message_id: str) -> None:
        self.table.want(message_id)
        self.fences.want(message_id)

    def new_message(self, message_id: str) -> None:
        """A message the batch inserts has neither reactions nor a fence yet."""
        self.table.load(message_id, {})
        self.fences.load(message_id, None)

    def reads(self) -> list[Any]:
        out: list[Any] = []
        ids = self.table.take_wanted()
        if ids:
            def take(rows: list[tuple[Any, ...]]) -> None:
                found: dict[str, dict[str, Reaction]] = {mid: {} for mid in ids}
                for r in rows:
                    found[r[0]][r[1]] = Reaction(r[2], r[3], bool(r[4]), r[5], r[6], r[7], r[8], r[9], r[10])
                for mid in ids:
                    self.table.load(mid, found[mid])

            out.append((*READ_OF_MESSAGES.of(ids), take))
        fences = self.fences.take_wanted()
        if fences:
            def take_fences(rows: list[tuple[Any, ...]]) -> None:
                self.fences.load_found(fences, {r[0]: (r[1], r[2]) for r in rows})

            out.append((*READ_FENCES.of(fences), take_fences))
        return out

    def of_message(self, message_id: str) -> dict[str, Reaction]:
        table = self.table
        if not table.known(message_id) or not self.fences.known(message_id):
            self.want(message_id)
            read_all(self.tx, self.reads())
        found: dict[str, Reaction] = table.get(message_id)
        return found

    def fence(self, message_id: str) -> int | None:
        self.of_message(message_id)
        fence = self.fences.get(message_id)
        return None if fence is None else int(fence[0])

    def _put(self, message_id: str, reactor_key: str, row: Reaction) -> None:
        self.table.put(message_id, {**self.table.get(message_id), reactor_key: row})

    def apply_delta(self, *, message_id: str, reactor_key: str, conversation_id: str, identity_id: str | None,
                    is_self: bool, emoji: str, removed: bool, occurred_at_ms: int, source_seq_ms: int,
                    now: int) -> int:
        """Apply one add/switch (``removed=False``) or remove; the rows written. A remove
        inserts ``emoji=''`` when there is no row yet, and keeps the stored emoji otherwise.
        The message must exist (the caller checks; the foreign key enforces it)."""
        state = "removed" if removed else "active"
        have = self.of_message(message_id).get(reactor_key)
        if have is None:
            self._put(message_id, reactor_key, Reaction(conversation_id, identity_id, is_self, "" if removed else emoji,
                                                        state, occurred_at_ms, source_seq_ms, now, now))
            return 1
        if occurred_at_ms < have.occurred_at_ms or (occurred_at_ms == have.occurred_at_ms and not (
            have.state != state or (not removed and have.emoji != emoji)
            or have.reactor_identity_id != identity_id or have.reactor_is_self != is_self
        )):
            return 0
        self._put(message_id, reactor_key, have._replace(
            reactor_identity_id=identity_id, reactor_is_self=is_self, emoji=have.emoji if removed else emoji,
            state=state, occurred_at_ms=occurred_at_ms, source_seq_ms=source_seq_ms, updated_at_ms=now,
        ))
        return 1

    def apply_snapshot(self, *, message_id: str, conversation_id: str, entries: dict[str, SnapshotEntry],
                       source_seq_ms: int, now: int) -> SnapshotResult:
        """Make the message's active reactions equal ``entries`` ({reactor_key: entry})."""
        current = self.of_message(message_id)
        current_fence = self.fence(message_id)
        if current_fence is not None and source_seq_ms < current_fence:
            return SnapshotResult(False, 0, 0, 0)
        applied = removed = 0
        for reactor_key, entry in entries.items():
            have = current.get(reactor_key)
            if (have is not None and have.state == "active" and have.emoji == entry.emoji
                    and have.reactor_identity_id == entry.identity_id and have.reactor_is_self == entry.is_self):
                continue
            if have is None:
                row = Reaction(conversation_id, entry.identity_id, entry.is_self, entry.emoji, "active",
                               entry.occurred_at_ms, source_seq_ms, now, now)
            else:
                row = have._replace(reactor_identity_id=entry.identity_id, reactor_is_self=entry.is_self,
                                    emoji=entry.emoji, state="active", occurred_at_ms=entry.occurred_at_ms,
                                    source_seq_ms=source_seq_ms, updated_at_ms=now)
            self._put(message_id, reactor_key, row)
            applied += 1
        for reactor_key, have in current.items():
            if have.state == "active" and reactor_key not in entries:
                self._put(message_id, reactor_key, have._replace(
                    state="removed", occurred_at_ms=now, source_seq_ms=source_seq_ms, updated_at_ms=now))
                removed += 1
        fence_written = 0
        if current_fence is None or source_seq_ms > current_fence:
            fence_written = self.advance_fence(message_id, source_seq_ms, now)
        return SnapshotResult(True, applied, removed, fence_written)

    def advance_fence(self, message_id: str, source_seq_ms: int, now: int) -> int:
        """Create the fence, or move it to ``source_seq_ms`` when strictly newer; the rows
        written."""
        self.of_message(message_id)
        have = self.fences.get(message_id)
        if have is not None and have[0] >= source_seq_ms:
            return 0
        self.fences.put(message_id, (source_seq_ms, now))
        return 1

    def flush(self, send: Writer) -> None:
        """Write the changed reactions (one upsert) and fences (another)."""
        rows, written = [], []
        for mid, was, reactions in self.table.changed():
            was = was or {}
            kept = dict(reactions)
            for key, row in reactions.items():
                old = was.get(key)
                if old is not None and old.content() == row.content():
                    kept[key] = old  # changed and changed back: nothing to write
                    continue
                rows.append({"message_id": mid, "reactor_key": key, "conversation_id": row.conversation_id,
                             "reactor_identity_id": row.reactor_identity_id, "reactor_is_self": row.reactor_is_self,
                             "emoji": row.emoji, "state": row.state, "occurred_at_ms": row.occurred_at_ms,
                             "source_seq_ms": row.source_seq_ms, "created_at_ms": row.created_at_ms,
                             "updated_at_ms": row.updated_at_ms})
            if kept != reactions:
                self.table.put(mid, kept)
            written.append(mid)
        if rows:
            send(WRITE_ROWS, rows, bridge_id=self.bridge_id)
        self.table.written(written)
        fences, moved = [], []
        for mid, was, fence in self.fences.changed():
            if was is None or fence[0] > was[0]:
                fences.append({"message_id": mid, "source_seq_ms": fence[0], "updated_at_ms": fence[1]})
            moved.append(mid)
        if fences:
            send(WRITE_FENCES, fences, bridge_id=self.bridge_id)
        self.fences.written(moved)


# Reads.
ACTIVE_OF_LISTED = Stmt(
    "SELECT r.message_id, r.emoji, r.reactor_key, r.reactor_identity_id, r.reactor_is_self, i.raw, "
    "i.display_name FROM reactions r LEFT JOIN identities i ON i.id = r.reactor_identity_id "
    "WHERE r.state = 'active' AND r.message_id IN ("
    "SELECT id FROM bridge_messages WHERE conversation_id = :conversation_id "
    "AND (occurred_at_ms, id) < (:before_ms, :before_id) "
    "ORDER BY occurred_at_ms DESC, id DESC LIMIT :limit) "
    "ORDER BY r.message_id, r.occurred_at_ms, r.reactor_key",
    name="reactions.active_of_listed",
)
ACTIVE_OF_MESSAGE = Stmt(
    "SELECT r.message_id, r.emoji, r.reactor_key, r.reactor_identity_id, r.reactor_is_self, i.raw, "
    "i.display_name FROM reactions r LEFT JOIN identities i ON i.id = r.reactor_identity_id "
    "WHERE r.state = 'active' AND r.message_id = :message_id ORDER BY r.occurred_at_ms, r.reactor_key",
    name="reactions.active_of_message",
)


# -- reads -------------------------------------------------------------------------------
def active_of_listed(
    tx: Tx, conversation_id: str, *, limit: int, before_ms: int, before_id: str = ""
) -> dict[str, list[dict[str, Any]]]:
    """Active reactions of the messages ``bridge_messages.of_conversation`` lists with the
    same arguments, grouped by message id."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in tx.all(
        ACTIVE_OF_LISTED,
        {"conversation_id": conversation_id, "limit": limit, "before_ms": before_ms, "before_id": before_id},
    ):
        out.setdefault(row[0], []).append(_reaction(row))
    return out


def active_of_message(tx: Tx, message_id: str) -> list[dict[str, Any]]:
    return [_reaction(r) for r in tx.all(ACTIVE_OF_MESSAGE, {"message_id": message_id})]


def _reaction(row: tuple[Any, ...]) -> dict[str, Any]:
    _, emoji, reactor_key, identity_id, is_self, raw, name = row
    return {
        "emoji": emoji,
        "reactor_key": reactor_key,
        "reactor_identity_id": identity_id,
        "reactor_is_self": bool(is_self),
        "reactor_raw": raw if raw is not None else (reactor_key if identity_id is None else ""),
        "reactor_name": name or "",
    }
