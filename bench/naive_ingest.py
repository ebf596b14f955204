"""The "before" of the ingest benchmark: a naive per-frame ingest, kept here on purpose.

This is the write pattern the seed (``004_b51c9b32cfba614e.txt``) measured on
``origin/main`` and spec ``ingest-reference.md`` §2.9 and §3 describe as the reference's
pre-PR behaviour. It exists only so ``bench/run.py`` can put our engine next to it.
Nothing in ``src/`` uses it.

What makes it naive (each point is one of the seed's findings):

* **Many commits per frame.** Every write statement is its own autocommit transaction,
  except the two the reference grouped: the first message of a frame is upserted together
  with the inbox mark (``ProjectMessage``), and a roster is replaced in one transaction.
* **Unguarded upserts.** Every sighting of an identity is read, upserted (rewriting the
  row) and read back; a Google conversation snapshot resolves each participant twice.
  Every conversation snapshot rewrites the conversation row and the whole roster
  (``DELETE`` + re-``INSERT``). Every message rewrites the conversation's recency with
  ``MAX`` (``GREATEST`` on PostgreSQL), every re-delivered active message is rewritten,
  every snapshot reaction is rewritten, and the reaction fence is rewritten on every
  Google message.
* **An unpaged drain after every append.** After each appended frame it reads *every*
  unprocessed frame with its payload, in receipt order, and tries each one: four
  attempts 5/10/20 ms apart on a transient error, then the frame is simply left for the
  next drain (no backoff). So a stuck frame is re-read, re-decoded and retried after
  every later frame.

What it keeps from ours, so the comparison is fair (the final rows must be the same,
and ``run.py`` asserts equal row counts and compares the content columns):

* the real frame validation (``ingest.inbox.parse_frame``), the real decoders
  (``decode_frame``), the real identity canonicalisation (``events.identity_key``) and the
  real derived ids (``projection.derive_id`` and friends), and inbox ids of the real shape;
* the merge rules (a name only replaces with a non-empty one, ``is_self`` only turns on),
  last-writer-wins edits, terminal deletes, the delta-reaction time order, the snapshot
  fence's rejection of an older snapshot, forward-only read cursors, and the conditions
  under which a frame is quarantined. A frame is checked for what would make ours reject
  it before anything is written, so a quarantined frame leaves no partial rows (the
  reference did leave some: that flaw is not what this benchmark measures).

Time: like the replay harness, "now" is each frame's own ``received_at_ms``, so both runs
stamp the same times.

``NaiveIngest(url, bridges)``: ``append(raw, platform)`` appends one frame and drains;
``drain()`` is one pass; ``stuck_ids`` names frames whose every attempt fails transiently
after decoding (the stuck-backlog baseline). With ``contention`` (the replay harness's
``Contention``, the very fault ours gets) the failure is a real transient database error
provoked inside a write transaction of the attempt, as for ours; without it, a plain
exception. Counters: ``commits``, ``statements``, ``decodes``, ``stuck_decodes``,
``requested_sleep_s``.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tidings.errors import TidingsError
from tidings.ingest.decoders import DECODERS, decode_frame
from tidings.ingest.events import (
    ConversationEvent,
    IdentityRef,
    InvalidEvent,
    MessageEvent,
    MessageMutationEvent,
    ReactionEvent,
    ReceiptEvent,
    identity_key,
)
from tidings.ingest.inbox import new_inbox_id, parse_frame
from tidings.ingest.projection import (
    RECEIPTS_LOCATE_BY_REMOTE_ID,
    ROLES,
    SENDER_ROSTER_PLATFORMS,
    conversation_id_for,
    identity_id_for,
    infer_conversation_kind,
    message_id_for,
)
from tidings.store.engine import is_transient, normalize_url

ATTEMPTS = 4
SLEEPS_MS = (5, 10, 20)
SELF_REACTOR = "self"

# -- statements (":name" parameters; rewritten to "%(name)s" for PostgreSQL) ---------------------
SQL: dict[str, str | dict[str, str]] = {
    "inbox_insert": (
        "INSERT INTO inbox (inbox_id, bridge_id, dedupe_key, codec, codec_version, received_at_ms, "
        "client_received_at_ms, payload) VALUES (:inbox_id, :bridge_id, :dedupe_key, :codec, :codec_version, "
        ":received, :client_received, :payload) "
        "ON CONFLICT (bridge_id, dedupe_key) WHERE dedupe_key <> '' DO NOTHING"
    ),
    "inbox_by_key": (
        "SELECT inbox_id, codec, codec_version, payload FROM inbox "
        "WHERE bridge_id = :bridge_id AND dedupe_key = :dedupe_key AND dedupe_key <> ''"
    ),
    # The pre-PR drain: every unprocessed frame, payload included, no page, no cursor.
    "inbox_unprocessed": (
        "SELECT inbox_id, bridge_id, codec, codec_version, received_at_ms, payload FROM inbox "
        "WHERE processed_at_ms IS NULL ORDER BY received_at_ms, inbox_id"
    ),
    "inbox_applied": (
        "UPDATE inbox SET processed_at_ms = :now, outcome = 'applied' "
        "WHERE inbox_id = :inbox_id AND processed_at_ms IS NULL"
    ),
    "inbox_quarantined": (
        "UPDATE inbox SET processed_at_ms = :now, outcome = 'quarantined', cause = :cause "
        "WHERE inbox_id = :inbox_id AND processed_at_ms IS NULL"
    ),
    "bridge_platforms": "SELECT id, platform FROM bridges",
    "identity_by_key": (
        "SELECT id, raw, display_name, is_self FROM identities "
        "WHERE bridge_id = :bridge_id AND kind = :kind AND canonical = :canonical"
    ),
    "identity_upsert": (
        "INSERT INTO identities (id, bridge_id, kind, canonical, raw, display_name, is_self, metadata, "
        "created_at_ms, updated_at_ms) VALUES (:id, :bridge_id, :kind, :canonical, :raw, :name, :is_self, '{}', "
        ":now, :now) ON CONFLICT (bridge_id, kind, canonical) DO UPDATE SET raw = excluded.raw, "
        "display_name = excluded.display_name, is_self = excluded.is_self, updated_at_ms = excluded.updated_at_ms"
    ),
    "conversation_by_key": (
        "SELECT id FROM conversations WHERE bridge_id = :bridge_id AND remote_conversation_id = :remote"
    ),
    "conversation_upsert": (
        "INSERT INTO conversations (id, bridge_id, remote_conversation_id, kind, title, remote_revision, "
        "last_message_at_ms, created_at_ms, updated_at_ms) VALUES (:id, :bridge_id, :remote, :kind, :title, "
        ":revision, 0, :now, :now) ON CONFLICT (bridge_id, remote_conversation_id) DO UPDATE SET "
        "kind = excluded.kind, title = excluded.title, remote_revision = excluded.remote_revision, "
        "updated_at_ms = excluded.updated_at_ms"
    ),
    "conversation_mint": (
        "INSERT INTO conversations (id, bridge_id, remote_conversation_id, kind, title, remote_revision, "
        "last_message_at_ms, created_at_ms, updated_at_ms) VALUES (:id, :bridge_id, :remote, :kind, '', NULL, "
        ":at, :now, :now) ON CONFLICT (bridge_id, remote_conversation_id) DO NOTHING"
    ),
    "conversation_recency": {
        "sqlite": "UPDATE conversations SET last_message_at_ms = MAX(last_message_at_ms, :at) WHERE id = :id",
        "postgresql": "UPDATE conversations SET last_message_at_ms = GREATEST(last_message_at_ms, :at) WHERE id = :id",
    },
    "roster_delete": "DELETE FROM conversation_participants WHERE conversation_id = :cid",
    "roster_insert": (
        "INSERT INTO conversation_participants (conversation_id, identity_id, bridge_id, role, display_name, "
        "is_active) VALUES (:cid, :identity_id, :bridge_id, :role, :name, :active)"
    ),
    "participant_ensure": (
        "INSERT INTO conversation_participants (conversation_id, identity_id, bridge_id, role, display_name, "
        "is_active) VALUES (:cid, :identity_id, :bridge_id, 'member', :name, :active) "
        "ON CONFLICT (conversation_id, identity_id) DO NOTHING"
    ),
    "message_upsert": (
        "INSERT INTO bridge_messages (id, bridge_id, conversation_id, remote_message_id, sender_identity_id, "
        "direction, body, reply_to_remote_id, state, occurred_at_ms, created_at_ms, updated_at_ms) VALUES "
        "(:id, :bridge_id, :cid, :remote_id, :sender, :direction, :body, :reply_to, 'active', :occurred, :now, :now) "
        "ON CONFLICT (id) DO UPDATE SET sender_identity_id = excluded.sender_identity_id, "
        "direction = excluded.direction, body = excluded.body, reply_to_remote_id = excluded.reply_to_remote_id, "
        "occurred_at_ms = excluded.occurred_at_ms, updated_at_ms = excluded.updated_at_ms "
        "WHERE bridge_messages.state = 'active'"
    ),
    "message_edit": (
        "UPDATE bridge_messages SET body = :body, state = 'edited', mutated_at_ms = :at, updated_at_ms = :now "
        "WHERE id = :id AND state <> 'deleted' AND (mutated_at_ms IS NULL OR mutated_at_ms <= :at)"
    ),
    "message_delete": (
        "UPDATE bridge_messages SET body = '', state = 'deleted', mutated_at_ms = :at, updated_at_ms = :now "
        "WHERE id = :id"
    ),
    "message_exists": "SELECT 1 FROM bridge_messages WHERE id = :id",
    "message_occurred": "SELECT occurred_at_ms FROM bridge_messages WHERE id = :id",
    "message_by_remote": "SELECT id, conversation_id, occurred_at_ms FROM bridge_messages "
                         "WHERE bridge_id = :bridge_id AND remote_message_id = :rid",
    "reaction_delta": (
        "INSERT INTO reactions (message_id, reactor_key, bridge_id, conversation_id, reactor_identity_id, "
        "reactor_is_self, emoji, state, occurred_at_ms, source_seq_ms, created_at_ms, updated_at_ms) VALUES "
        "(:mid, :key, :bridge_id, :cid, :identity_id, :is_self, :emoji, :state, :occurred, :seq, :now, :now) "
        "ON CONFLICT (message_id, reactor_key) DO UPDATE SET reactor_identity_id = excluded.reactor_identity_id, "
        "reactor_is_self = excluded.reactor_is_self, "
        "emoji = CASE WHEN excluded.state = 'removed' THEN reactions.emoji ELSE excluded.emoji END, "
        "state = excluded.state, occurred_at_ms = excluded.occurred_at_ms, source_seq_ms = excluded.source_seq_ms, "
        "updated_at_ms = excluded.updated_at_ms WHERE excluded.occurred_at_ms >= reactions.occurred_at_ms"
    ),
    "fence_get": "SELECT source_seq_ms FROM reaction_fences WHERE message_id = :mid",
    "reaction_get": (
        "SELECT reactor_identity_id, reactor_is_self, emoji, state FROM reactions "
        "WHERE message_id = :mid AND reactor_key = :key"
    ),
    "reactions_active": "SELECT reactor_key FROM reactions WHERE message_id = :mid AND state = 'active'",
    "reaction_snapshot_upsert": (
        "INSERT INTO reactions (message_id, reactor_key, bridge_id, conversation_id, reactor_identity_id, "
        "reactor_is_self, emoji, state, occurred_at_ms, source_seq_ms, created_at_ms, updated_at_ms) VALUES "
        "(:mid, :key, :bridge_id, :cid, :identity_id, :is_self, :emoji, 'active', :occurred, :seq, :now, :now) "
        "ON CONFLICT (message_id, reactor_key) DO UPDATE SET reactor_identity_id = excluded.reactor_identity_id, "
        "reactor_is_self = excluded.reactor_is_self, emoji = excluded.emoji, state = excluded.state, "
        "occurred_at_ms = excluded.occurred_at_ms, source_seq_ms = excluded.source_seq_ms, "
        "updated_at_ms = excluded.updated_at_ms"
    ),
    "reaction_tombstone": (
        "UPDATE reactions SET state = 'removed', occurred_at_ms = :now, source_seq_ms = :seq, updated_at_ms = :now "
        "WHERE message_id = :mid AND reactor_key = :key AND state = 'active'"
    ),
    "fence_upsert": (
        "INSERT INTO reaction_fences (message_id, bridge_id, source_seq_ms, updated_at_ms) "
        "VALUES (:mid, :bridge_id, :seq, :now) ON CONFLICT (message_id) DO UPDATE SET "
        "source_seq_ms = excluded.source_seq_ms, updated_at_ms = excluded.updated_at_ms"
    ),
    "cursor_advance": (
        "INSERT INTO read_cursors (conversation_id, bridge_id, last_read_message_id, last_read_message_at_ms, "
        "last_read_at_ms, updated_at_ms) VALUES (:cid, :bridge_id, :mid, :mat, :read_at, :now) "
        "ON CONFLICT (conversation_id) DO UPDATE SET last_read_message_id = excluded.last_read_message_id, "
        "last_read_message_at_ms = excluded.last_read_message_at_ms, last_read_at_ms = excluded.last_read_at_ms, "
        "updated_at_ms = excluded.updated_at_ms "
        "WHERE excluded.last_read_message_at_ms > read_cursors.last_read_message_at_ms "
        "OR (excluded.last_read_message_at_ms = read_cursors.last_read_message_at_ms "
        "AND excluded.last_read_message_id > read_cursors.last_read_message_id)"
    ),
}

_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


def _compile(dialect: str) -> dict[str, str]:
    out = {}
    for name, text in SQL.items():
        sql = text[dialect] if isinstance(text, dict) else text
        if dialect == "postgresql":
            sql = _PARAM.sub(r"%(\1)s", sql)
        out[name] = sql
    return out


class Transient(Exception):
    """The stuck-frame fault of the naive drain without ``contention``."""


class _RawTx:
    """What ``Contention.error`` needs of a transaction: ``execute(stmt, params)`` on it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, stmt: Any, params: Any = None) -> Any:
        return self.conn.execute(stmt.compiled("postgresql")[0], params)


class Rejected(Exception):
    """A frame ours would quarantine; ``str(exc)`` is the cause."""


class _Db:
    """One connection in autocommit mode; counts statements and commits."""

    def __init__(self, url: str) -> None:
        self.dialect, _ = normalize_url(url)
        self.sql = _compile(self.dialect)
        self.commits = 0
        self.statements = 0
        self._in_tx = False
        if self.dialect == "sqlite":
            path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else url
            self.conn: Any = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
            for pragma in ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=5000", "synchronous=NORMAL"):
                self.conn.execute(f"PRAGMA {pragma}")
        else:
            import psycopg

            self.conn = psycopg.connect(url, autocommit=True)

    def read(self, name: str, params: dict[str, Any]) -> list[tuple]:
        self.statements += 1
        cur = self.conn.execute(self.sql[name], params)
        rows = cur.fetchall()
        cur.close()
        return rows

    def one(self, name: str, params: dict[str, Any]) -> tuple | None:
        rows = self.read(name, params)
        return rows[0] if rows else None

    def write(self, name: str, params: dict[str, Any]) -> int:
        self.statements += 1
        cur = self.conn.execute(self.sql[name], params)
        n = cur.rowcount
        cur.close()
        if not self._in_tx:
            self.commits += 1
        return n

    @contextmanager
    def transaction(self) -> Iterator[None]:
        if self.dialect == "sqlite":
            self.conn.execute("BEGIN IMMEDIATE")
            self._in_tx = True
            try:
                yield
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            finally:
                self._in_tx = False
            self.conn.execute("COMMIT")
        else:
            self._in_tx = True
            try:
                with self.conn.transaction():
                    yield
            finally:
                self._in_tx = False
        self.commits += 1

    def close(self) -> None:
        self.conn.close()


class NaiveIngest:
    def __init__(
        self,
        url: str,
        *,
        sleep: Callable[[float], None] | None = None,
        stuck_ids: set[str] | None = None,
        contention: Any = None,
    ) -> None:
        self.db = _Db(url)
        self.sleep = sleep
        self.stuck_ids = stuck_ids if stuck_ids is not None else set()
        self.contention = contention
        self.platforms = {row[0]: row[1] for row in self.db.read("bridge_platforms", {})}
        self.codec_platforms = {codec: dec.platform for codec, dec in DECODERS.items()}
        self.decodes = 0
        self.stuck_decodes = 0
        self.requested_sleep_s = 0.0
        self.rejected = 0
        self.deduplicated = 0
        self.now = 0

    @property
    def commits(self) -> int:
        return self.db.commits

    @property
    def statements(self) -> int:
        return self.db.statements

    def close(self) -> None:
        self.db.close()

    # -- append -------------------------------------------------------------------------------
    def append(self, raw: Any, bridge_id: str, platform: str, drain: bool = True) -> str | None:
        """Validate and insert one frame (autocommit), then drain. The new inbox id, or None
        for a rejected or deduplicated frame."""
        received = raw.get("received_at_ms") if isinstance(raw, dict) else None
        if type(received) is int and received > 0:
            self.now = received
        try:
            frame = parse_frame(raw, 0, platform=platform, codec_platforms=self.codec_platforms)
        except TidingsError:
            self.rejected += 1
            return None
        inbox_id = new_inbox_id(self.now)
        inserted = self.db.write("inbox_insert", {
            "inbox_id": inbox_id, "bridge_id": bridge_id, "dedupe_key": frame.dedupe_key, "codec": frame.codec,
            "codec_version": frame.codec_version, "received": self.now,
            "client_received": frame.client_received_at_ms, "payload": frame.payload,
        })
        if not inserted:
            self.db.one("inbox_by_key", {"bridge_id": bridge_id, "dedupe_key": frame.dedupe_key})
            self.deduplicated += 1
            inbox_id = None
        if drain:
            self.drain()
        return inbox_id

    # -- the drain ------------------------------------------------------------------------------
    def drain(self) -> int:
        """Try every unprocessed frame once (with in-call retries); how many are left."""
        left = 0
        for inbox_id, bridge_id, codec, version, received, payload in self.db.read("inbox_unprocessed", {}):
            if not self._frame(inbox_id, bridge_id, codec, version, received, payload):
                left += 1
        return left

    def _frame(self, inbox_id: str, bridge_id: str, codec: str, version: int, received: int, payload: str) -> bool:
        for attempt in range(ATTEMPTS):
            if attempt:
                delay = SLEEPS_MS[attempt - 1] / 1000.0
                self.requested_sleep_s += delay
                if self.sleep is not None:
                    self.sleep(delay)
            try:
                self._attempt(inbox_id, bridge_id, codec, version, received, payload)
                return True
            except Transient:
                continue
            except Rejected as exc:
                self.db.write("inbox_quarantined", {"inbox_id": inbox_id, "now": received, "cause": str(exc)})
                return True
        return False  # left unprocessed; the next drain tries it again, no backoff

    def _attempt(self, inbox_id: str, bridge_id: str, codec: str, version: int, received: int, payload: str) -> None:
        platform = self.platforms[bridge_id]
        self.decodes += 1
        try:
            events = decode_frame(codec, version, payload)
        except Exception as exc:  # noqa: BLE001 - every decode failure is a quarantine
            raise Rejected(f"decode: {exc}") from None
        if inbox_id in self.stuck_ids:
            self.stuck_decodes += 1
            if self.contention is None:
                raise Transient("database is locked (stuck frame)")
            try:
                with self.db.transaction():  # holds the write lock (SQLite) while the fault fires
                    raise self.contention.error(_RawTx(self.db.conn))
            except Exception as exc:
                if is_transient(exc):
                    raise Transient(str(exc)) from None
                raise
        _precheck(platform, events)
        _Frame(self.db, bridge_id, platform, inbox_id, received).apply(events)


def _precheck(platform: str, events: list) -> None:
    """What would make ours reject the frame in its projection, checked before any write."""
    for ev in events:
        if isinstance(ev, ConversationEvent):
            seen: set[tuple[str, str]] = set()
            for i, part in enumerate(ev.participants):
                if (part.role or "member") not in ROLES:
                    raise Rejected(f"conversation {ev.remote_conversation_id!r}: participant {i} has an unknown role")
                key = _key(platform, part.identity)
                if key[0] == "anonymous":
                    raise Rejected(f"conversation {ev.remote_conversation_id!r}: participant {i} is anonymous")
                if key in seen:
                    raise Rejected(f"conversation {ev.remote_conversation_id!r}: repeated identity")
                seen.add(key)
        elif isinstance(ev, MessageEvent):
            if _key(platform, ev.sender)[0] == "anonymous":
                raise Rejected(f"message {ev.remote_message_id!r}: anonymous sender")


def _key(platform: str, ref: IdentityRef) -> tuple[str, str]:
    try:
        return identity_key(platform, ref.raw)
    except InvalidEvent as exc:
        raise Rejected(f"identity: {exc}") from None


class _Frame:
    """One frame's events, applied the naive way (see the module docstring)."""

    def __init__(self, db: _Db, bridge_id: str, platform: str, inbox_id: str, received: int) -> None:
        self.db = db
        self.bridge_id = bridge_id
        self.platform = platform
        self.inbox_id = inbox_id
        self.now = received
        self.marked = False

    def apply(self, events: list) -> None:
        convs = [e for e in events if isinstance(e, ConversationEvent)]
        msgs = [e for e in events if isinstance(e, MessageEvent)]
        muts = [e for e in events if isinstance(e, MessageMutationEvent)]
        reacts = [e for e in events if isinstance(e, ReactionEvent)]
        receipts = [e for e in events if isinstance(e, ReceiptEvent)]
        for ev in convs:
            self.conversation(ev)
        snapshots: dict[tuple[str, str], tuple[str, str]] = {}
        for ev in msgs:
            self.message(ev, snapshots)
        for ev in muts:
            self.mutation(ev)
        self.reactions(reacts, snapshots)
        for ev in receipts:
            self.receipt(ev)
        if not self.marked:
            self.db.write("inbox_applied", {"inbox_id": self.inbox_id, "now": self.now})

    # Identities: read, upsert (always), read back.
    def identity(self, ref: IdentityRef) -> tuple[str, str, bool]:
        kind, canonical = identity_key(self.platform, ref.raw)
        params = {"bridge_id": self.bridge_id, "kind": kind, "canonical": canonical}
        stored = self.db.one("identity_by_key", params)
        raw, name = ref.raw.strip(), ref.name.strip()
        if stored is None:
            iid, new_name, new_self = identity_id_for(self.bridge_id, kind, canonical), name, bool(ref.is_self)
        else:
            iid, new_name, new_self = stored[0], name or stored[2], bool(stored[3]) or bool(ref.is_self)
        self.db.write("identity_upsert", {
            **params, "id": iid, "raw": raw, "name": new_name, "is_self": new_self, "now": self.now,
        })
        row = self.db.one("identity_by_key", params)
        assert row is not None
        return row[0], row[2], bool(row[3])

    def conversation(self, ev: ConversationEvent) -> None:
        for part in ev.participants:  # the reference resolved every participant twice
            self.identity(part.identity)
        remote = ev.remote_conversation_id
        self.db.write("conversation_upsert", {
            "id": conversation_id_for(self.bridge_id, remote), "bridge_id": self.bridge_id, "remote": remote,
            "kind": ev.kind, "title": ev.title, "revision": ev.remote_revision, "now": self.now,
        })
        cid = self.db.one("conversation_by_key", {"bridge_id": self.bridge_id, "remote": remote})[0]
        rows = [
            (self.identity(part.identity)[0], part.role or "member", part.identity.name, bool(part.active))
            for part in ev.participants
        ]
        with self.db.transaction():
            self.db.write("roster_delete", {"cid": cid})
            for identity_id, role, name, active in rows:
                self.db.write("roster_insert", {
                    "cid": cid, "identity_id": identity_id, "bridge_id": self.bridge_id, "role": role,
                    "name": name, "active": active,
                })

    def message(self, ev: MessageEvent, snapshots: dict[tuple[str, str], tuple[str, str]]) -> None:
        remote = ev.remote_conversation_id
        row = self.db.one("conversation_by_key", {"bridge_id": self.bridge_id, "remote": remote})
        if row is None:
            cid = conversation_id_for(self.bridge_id, remote)
            self.db.write("conversation_mint", {
                "id": cid, "bridge_id": self.bridge_id, "remote": remote,
                "kind": infer_conversation_kind(self.platform, remote), "at": ev.occurred_at_ms, "now": self.now,
            })
        else:
            cid = row[0]
        sender_id, sender_name, sender_self = self.identity(ev.sender)
        mid = message_id_for(self.bridge_id, remote, ev.remote_message_id)
        params = {
            "id": mid, "bridge_id": self.bridge_id, "cid": cid, "remote_id": ev.remote_message_id,
            "sender": sender_id, "direction": ev.direction, "body": ev.body, "reply_to": ev.reply_to_remote_id,
            "occurred": ev.occurred_at_ms, "now": self.now,
        }
        if not self.marked:  # ProjectMessage: the first message and the inbox mark, one transaction
            with self.db.transaction():
                self.db.write("message_upsert", params)
                self.db.write("inbox_applied", {"inbox_id": self.inbox_id, "now": self.now})
            self.marked = True
        else:  # ImportMessage
            self.db.write("message_upsert", params)
        self.db.write("conversation_recency", {"id": cid, "at": ev.occurred_at_ms})
        if self.platform in SENDER_ROSTER_PLATFORMS and ev.direction == "incoming" and not sender_self:
            self.db.write("participant_ensure", {
                "cid": cid, "identity_id": sender_id, "bridge_id": self.bridge_id, "name": sender_name, "active": True,
            })
        if ev.reactions_snapshot:
            snapshots[(remote, ev.remote_message_id)] = (mid, cid)

    def mutation(self, ev: MessageMutationEvent) -> None:
        mid = message_id_for(self.bridge_id, ev.remote_conversation_id, ev.remote_message_id)
        if ev.kind == "edit":
            self.db.write("message_edit", {"id": mid, "body": ev.body, "at": ev.occurred_at_ms, "now": self.now})
        else:
            self.db.write("message_delete", {"id": mid, "at": ev.occurred_at_ms, "now": self.now})

    def reactor(self, ref: IdentityRef) -> tuple[str, str | None, bool]:
        kind, canonical = identity_key(self.platform, ref.raw)
        if kind == "anonymous":
            return canonical, None, False
        identity_id = self.identity(ref)[0]
        if ref.is_self:
            return SELF_REACTOR, identity_id, True
        return identity_id, identity_id, False

    def reactions(self, reacts: list[ReactionEvent], snapshots: dict[tuple[str, str], tuple[str, str]]) -> None:
        entries: dict[tuple[str, str], dict[str, tuple[str | None, bool, str, int]]] = {k: {} for k in snapshots}
        for ev in reacts:
            target = (ev.remote_conversation_id, ev.target_remote_message_id)
            if target in entries:
                if ev.action != "remove":
                    key, identity_id, is_self = self.reactor(ev.actor)
                    entries[target][key] = (identity_id, is_self, ev.emoji, ev.occurred_at_ms)
                continue
            if self.platform == "google":
                continue  # orphaned
            mid = message_id_for(self.bridge_id, *target)
            if self.db.one("message_exists", {"id": mid}) is None:
                continue  # orphaned
            key, identity_id, is_self = self.reactor(ev.actor)
            removed = ev.action == "remove"
            self.db.write("reaction_delta", {
                "mid": mid, "key": key, "bridge_id": self.bridge_id,
                "cid": conversation_id_for(self.bridge_id, ev.remote_conversation_id), "identity_id": identity_id,
                "is_self": is_self, "emoji": "" if removed else ev.emoji, "state": "removed" if removed else "active",
                "occurred": ev.occurred_at_ms, "seq": self.now, "now": self.now,
            })
        for target, (mid, cid) in snapshots.items():
            self.snapshot(mid, cid, entries[target])

    def snapshot(self, mid: str, cid: str, entries: dict[str, tuple[str | None, bool, str, int]]) -> None:
        """ReplaceEmbeddedReactions before the PR: one transaction, every row rewritten."""
        seq = self.now
        with self.db.transaction():
            fence = self.db.one("fence_get", {"mid": mid})
            if fence is not None and seq < fence[0]:
                return
            for key, (identity_id, is_self, emoji, occurred) in entries.items():
                self.db.one("reaction_get", {"mid": mid, "key": key})
                self.db.write("reaction_snapshot_upsert", {
                    "mid": mid, "key": key, "bridge_id": self.bridge_id, "cid": cid, "identity_id": identity_id,
                    "is_self": is_self, "emoji": emoji, "occurred": occurred, "seq": seq, "now": self.now,
                })
            for (key,) in self.db.read("reactions_active", {"mid": mid}):
                if key not in entries:
                    self.db.write("reaction_tombstone", {"mid": mid, "key": key, "seq": seq, "now": self.now})
            self.db.write("fence_upsert", {"mid": mid, "bridge_id": self.bridge_id, "seq": seq, "now": self.now})

    def receipt(self, ev: ReceiptEvent) -> None:
        """The same rule as ours (D38): a read not in the named conversation is found by
        remote id across the bridge on Signal; each conversation's cursor moves."""
        if ev.status != "read" or not ev.actor.is_self:
            return
        home = conversation_id_for(self.bridge_id, ev.remote_conversation_id)
        best: dict[str, tuple[int, str]] = {}
        for remote_message_id in ev.remote_message_ids:
            conv, mid = home, message_id_for(self.bridge_id, ev.remote_conversation_id, remote_message_id)
            row = self.db.one("message_occurred", {"id": mid})
            at = row[0] if row is not None else None
            if at is None and self.platform in RECEIPTS_LOCATE_BY_REMOTE_ID:
                rows = self.db.read("message_by_remote", {"bridge_id": self.bridge_id, "rid": remote_message_id})
                if len(rows) == 1:
                    mid, conv, at = rows[0]
            if at is not None and (conv not in best or (at, mid) > best[conv]):
                best[conv] = (at, mid)
        for conv, (at, mid) in best.items():
            self.db.write("cursor_advance", {
                "cid": conv, "bridge_id": self.bridge_id,
                "mid": mid, "mat": at, "read_at": ev.occurred_at_ms, "now": self.now,
            })


def wall_sleep(seconds: float) -> None:
    time.sleep(seconds)
