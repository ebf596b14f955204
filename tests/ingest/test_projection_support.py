"""Helpers shared by the projection tests (no tests here): bridges, event builders, and a
``World`` that projects one hand-built frame per ``store.write()`` transaction, the way
the worker does, without the inbox or the worker.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from tidings.counters import Counters
from tidings.ingest.counters import INGEST_COUNTERS
from tidings.ingest.events import (
    ConversationEvent,
    IdentityRef,
    MessageEvent,
    MessageMutationEvent,
    Participant,
    ReactionEvent,
    ReceiptEvent,
    identity_key,
    validate_event,
)
from tidings.ingest.projection import (
    MessageChange,
    ProjectionContext,
    conversation_id_for,
    identity_id_for,
    message_id_for,
    project_frame,
)
from tidings.store.batch_rows import Journal, Writer
from tidings.store.engine import Store

_seq = itertools.count(1)

PROJECTION_TABLES = (
    "identities",
    "conversations",
    "conversation_participants",
    "bridge_messages",
    "reactions",
    "reaction_fences",
    "read_cursors",
)


def make_account(store: Store, *, kind: str = "human", owner_id: str | None = None, handle: str | None = None) -> str:
    n = next(_seq)
    account_id = f"acc_t{n}_{kind}"
    with store.write() as tx:
        tx.raw(
            "INSERT INTO accounts (id, kind, handle, owner_id, created_at_ms) VALUES ({})".format(
                ", ".join(["?"] * 5) if store.dialect == "sqlite" else ", ".join(["%s"] * 5)
            ),
            (account_id, kind, handle or f"t{n}-{kind}", owner_id, 1),
        )
    return account_id


def make_bridge(store: Store, platform: str = "google", *, owner_id: str | None = None) -> str:
    """A bridge row (and the system account it speaks as), inserted directly."""
    system = make_account(store, kind="system")
    n = next(_seq)
    bridge_id = f"br_t{n}"
    ph = "?" if store.dialect == "sqlite" else "%s"
    with store.write() as tx:
        tx.raw(
            f"INSERT INTO bridges (id, platform, name, owner_id, account_id, created_at_ms) "
            f"VALUES ({ph}, {ph}, {ph}, {ph}, {ph}, {ph})",
            (bridge_id, platform, f"bridge {n}", owner_id, system, 1),
        )
    return bridge_id


def once(tx: Any, family: Any, bridge_id: str, op: Any) -> Any:
    """``op`` on a fresh batch of the table ``family`` (``Identities``, ``Conversations``,
    ``Messages``, ``Reactions``, ``ReadCursors``) for ``bridge_id`` (its rows read when first
    used), then that batch's flush: one operation, as a one-frame batch runs it (D115)."""
    rows = family(tx, Journal(), bridge_id)
    result = op(rows)
    rows.flush(Writer(tx))
    return result


# -- event builders ----------------------------------------------------------------------
def ref(raw: str, name: str = "", *, self_: bool = False, platform: str = "google") -> IdentityRef:
    kind, canonical = identity_key(platform, raw)
    return IdentityRef(raw=raw, name=name, is_self=self_, kind=kind, canonical=canonical)


def member(raw: str, name: str = "", *, role: str = "member", active: bool = True, self_: bool = False,
           platform: str = "google") -> Participant:
    return Participant(identity=ref(raw, name, self_=self_, platform=platform), role=role, active=active)


def conv(remote: str, participants: Iterable[Participant] = (), *, kind: str = "group", title: str = "",
         revision: str | None = None) -> ConversationEvent:
    return ConversationEvent(remote, kind, title, tuple(participants), revision)


def msg(remote_conv: str, remote_msg: str, sender: IdentityRef, *, body: str = "hello", at: int = 1_000,
        direction: str | None = None, reply_to: str | None = None, snapshot: bool = False) -> MessageEvent:
    if direction is None:
        direction = "outgoing" if sender.is_self else "incoming"
    return MessageEvent(remote_conv, remote_msg, sender, direction, body, at, reply_to_remote_id=reply_to,
                        reactions_snapshot=snapshot)


def gmsg(remote_conv: str, remote_msg: str, sender: IdentityRef, **kw: Any) -> MessageEvent:
    """A Google message: always a reaction snapshot."""
    return msg(remote_conv, remote_msg, sender, snapshot=True, **kw)


def react(remote_conv: str, target: str, actor: IdentityRef, emoji: str = "👍", *, action: str = "add",
          at: int = 1_000) -> ReactionEvent:
    return ReactionEvent(remote_conv, target, actor, emoji, action, at)


def edit(remote_conv: str, target: str, body: str, *, at: int = 2_000) -> MessageMutationEvent:
    return MessageMutationEvent(remote_conv, target, "edit", body, at)


def delete(remote_conv: str, target: str, *, at: int = 2_000) -> MessageMutationEvent:
    return MessageMutationEvent(remote_conv, target, "delete", "", at)


def receipt(remote_conv: str, ids: Iterable[str], actor: IdentityRef, *, status: str = "read",
            at: int = 3_000) -> ReceiptEvent:
    return ReceiptEvent(remote_conv, tuple(ids), actor, status, at)


# -- the world ---------------------------------------------------------------------------
class World:
    """One bridge on a store; ``frame(events)`` projects them in one write transaction.

    ``World.behind`` (set per test by ``test_projection.py``'s ``projection_mode``): the
    transaction sends its writes behind, with the ``COMMIT``, as apply on append does on
    PostgreSQL (D105, D115); every projection rule must hold either way."""

    behind = False

    def __init__(self, store: Store, platform: str = "google", *, owner_id: str | None = None,
                 bridge_id: str | None = None) -> None:
        self.store = store
        self.platform = platform
        self.bridge_id = bridge_id or make_bridge(store, platform, owner_id=owner_id)
        self.counters = Counters(INGEST_COUNTERS)
        self.changes: list[MessageChange] = []
        self.frames = 0

    @property
    def now(self) -> int:
        return self.store.clock.now_ms()

    def frame(self, events: Iterable[Any], *, received_at_ms: int | None = None, validate: bool = True) -> bool:
        events = list(events)
        if validate:
            for ev in events:
                validate_event(ev)
        self.frames += 1
        now = self.now
        ctx = ProjectionContext(
            bridge_id=self.bridge_id,
            platform=self.platform,
            inbox_id=f"in_frame{self.frames}",
            received_at_ms=now if received_at_ms is None else received_at_ms,
            now_ms=now,
            counters=self.counters,
            on_message=lambda tx, change: self.changes.append(change),
        )
        with self.store.write() as tx:
            if self.behind:
                tx.write_behind = True
            return project_frame(tx, ctx, events)

    def counts(self) -> dict[str, int]:
        return {k: v for k, v in self.counters.snapshot().items() if v}

    # ids
    def conv_id(self, remote: str) -> str:
        return conversation_id_for(self.bridge_id, remote)

    def msg_id(self, remote_conv: str, remote_msg: str) -> str:
        return message_id_for(self.bridge_id, remote_conv, remote_msg)

    def ident_id(self, raw: str) -> str:
        kind, canonical = identity_key(self.platform, raw)
        return identity_id_for(self.bridge_id, kind, canonical)

    # reads
    def rows(self, sql: str, *params: Any) -> list[tuple]:
        if self.store.dialect != "sqlite":
            sql = sql.replace("?", "%s")
        with self.store.read() as tx:
            return [tuple(r) for r in tx.raw(sql, params).fetchall()]

    def one(self, sql: str, *params: Any) -> tuple | None:
        rows = self.rows(sql, *params)
        return rows[0] if rows else None

    def conversation(self, remote: str) -> dict[str, Any] | None:
        row = self.one(
            "SELECT id, kind, title, remote_revision, last_message_at_ms, created_at_ms, updated_at_ms "
            "FROM conversations WHERE bridge_id = ? AND remote_conversation_id = ?", self.bridge_id, remote)
        if row is None:
            return None
        keys = ("id", "kind", "title", "remote_revision", "last_message_at_ms", "created_at_ms", "updated_at_ms")
        return dict(zip(keys, row))

    def roster(self, remote: str) -> dict[str, tuple[str, str, bool]]:
        """{canonical: (role, display_name, is_active)}"""
        return {
            r[0]: (r[1], r[2], bool(r[3]))
            for r in self.rows(
                "SELECT i.canonical, p.role, p.display_name, p.is_active FROM conversation_participants p "
                "JOIN identities i ON i.id = p.identity_id WHERE p.conversation_id = ?", self.conv_id(remote))
        }

    def identity(self, raw: str) -> dict[str, Any] | None:
        row = self.one(
            "SELECT id, raw, display_name, is_self, created_at_ms, updated_at_ms FROM identities WHERE id = ?",
            self.ident_id(raw))
        if row is None:
            return None
        return dict(zip(("id", "raw", "display_name", "is_self", "created_at_ms", "updated_at_ms"),
                        (*row[:3], bool(row[3]), *row[4:])))

    def message(self, remote_conv: str, remote_msg: str) -> dict[str, Any] | None:
        row = self.one(
            "SELECT body, state, sender_identity_id, direction, occurred_at_ms, reply_to_remote_id, updated_at_ms "
            "FROM bridge_messages WHERE id = ?", self.msg_id(remote_conv, remote_msg))
        if row is None:
            return None
        return dict(zip(("body", "state", "sender_identity_id", "direction", "occurred_at_ms", "reply_to",
                         "updated_at_ms"), row))

    def reactions(self, remote_conv: str, remote_msg: str, *, active_only: bool = True) -> dict[str, str]:
        """{reactor_key: emoji} (active only by default; else {key: (state, emoji)})."""
        rows = self.rows(
            "SELECT reactor_key, emoji, state FROM reactions WHERE message_id = ?", self.msg_id(remote_conv, remote_msg))
        if active_only:
            return {k: e for k, e, s in rows if s == "active"}
        return {k: (s, e) for k, e, s in rows}

    def fence(self, remote_conv: str, remote_msg: str) -> int | None:
        row = self.one("SELECT source_seq_ms FROM reaction_fences WHERE message_id = ?",
                       self.msg_id(remote_conv, remote_msg))
        return None if row is None else row[0]

    def dump(self) -> dict[str, list[tuple]]:
        """Every projection table of this bridge, sorted (for "nothing changed" checks)."""
        out = {}
        for table in PROJECTION_TABLES:
            out[table] = sorted(self.rows(f"SELECT * FROM {table} WHERE bridge_id = ?", self.bridge_id), key=repr)
        return out
