"""Bridge conversations and their rosters: rows, guarded writes, and the read queries.

``Conversations`` and ``Rosters`` hold what a batch of frames reads and writes of one
bridge's conversations (``store/batch_rows.py``, D115), with the write guards:

* ``upsert`` updates kind, title and remote_revision only when one of them differs, so
  ``updated_at_ms`` is the time of the last content change;
* ``mint_or_bump`` creates a conversation first seen in a message, or moves
  ``last_message_at_ms`` forwards, and only when strictly newer (an equal or older message
  writes nothing). Recency never moves ``updated_at_ms``;
* ``Rosters.sync`` confirms an unchanged roster without a write, writes only the
  difference otherwise, rejects a repeated identity, and then advances the conversation's
  ``updated_at_ms`` (monotonically: never backwards);
* ``Rosters.ensure_and_touch`` adds an observed sender to a roster (insert-if-absent) and
  touches the conversation when it did.

A flush writes the changed conversations, then the roster differences, then the
conversations whose only change is the touch of a roster that changed (so a touch never
lands without the roster change that is its reason), one statement each.

The read functions at the end (``list_of_bridge``, ``participants_of``, ``by_id``) serve the
HTTP API and the MCP tools.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

from .batch_rows import Journal, Read, Table, Write, Writer, read_all
from .engine import Tx
from .sql import Stmt

FAR_FUTURE_MS = 2**62  # "no upper bound" for before_ms reads


class Conversation(NamedTuple):
    """A stored conversation (the key, its remote id, is the ``Table``'s)."""

    id: str
    kind: str
    title: str
    remote_revision: str | None
    last_message_at_ms: int
    created_at_ms: int
    updated_at_ms: int

    def content(self) -> tuple[Any, ...]:
        return (self.kind, self.title, self.remote_revision, self.last_message_at_ms)


class RosterRow(NamedTuple):
    """One roster entry as the projection wants it stored."""

    identity_id: str
    role: str
    display_name: str
    is_active: bool


class RosterError(ValueError):
    """A roster that cannot be stored (a repeated identity, a missing conversation)."""


#: A stored participant: (role, display_name, is_active).
Participant = tuple[str, str, bool]

READ_BY_REMOTE_IDS = Read(
    "conversations.read_by_remote_ids", "conversations",
    "remote_conversation_id, id, kind, title, remote_revision, last_message_at_ms, created_at_ms, updated_at_ms",
    "remote_conversation_id", "bridge_id = :bridge_id",
)
# The one guard of this table's writes: every column an update sets.
CONVERSATION_GUARD = (
    "(conversations.kind, conversations.title, conversations.remote_revision, conversations.last_message_at_ms, "
    "conversations.updated_at_ms) IS DISTINCT FROM (excluded.kind, excluded.title, excluded.remote_revision, "
    "excluded.last_message_at_ms, excluded.updated_at_ms)"
)
WRITE_ROWS = Write(
    "conversations.write_rows",
    "INSERT INTO conversations (id, bridge_id, remote_conversation_id, kind, title, remote_revision, "
    "last_message_at_ms, created_at_ms, updated_at_ms) SELECT r.id, :bridge_id, r.remote_conversation_id, "
    "r.kind, r.title, r.remote_revision, r.last_message_at_ms, r.created_at_ms, r.updated_at_ms "
    "FROM {rows} WHERE true ON CONFLICT (bridge_id, remote_conversation_id) DO UPDATE SET "
    "kind = excluded.kind, title = excluded.title, remote_revision = excluded.remote_revision, "
    "last_message_at_ms = excluded.last_message_at_ms, updated_at_ms = excluded.updated_at_ms "
    f"WHERE {CONVERSATION_GUARD}",
    "id text, remote_conversation_id text, kind text, title text, remote_revision text, "
    "last_message_at_ms bigint, created_at_ms bigint, updated_at_ms bigint",
)
_PARTICIPANT_COLUMNS = "conversation_id, identity_id, role, display_name, is_active"
READ_ROSTERS = Read("participants.read_rosters", "conversation_participants", _PARTICIPANT_COLUMNS,
                    "conversation_id")
READ_MEMBERS = Read("participants.read_members", "conversation_participants", _PARTICIPANT_COLUMNS,
                    "conversation_id, identity_id")
WRITE_PARTICIPANTS = Write(
    "participants.write_rows",
    "INSERT INTO conversation_participants (conversation_id, identity_id, bridge_id, role, display_name, "
    "is_active) SELECT r.conversation_id, r.identity_id, :bridge_id, r.role, r.display_name, r.is_active "
    "FROM {rows} WHERE true ON CONFLICT (conversation_id, identity_id) DO UPDATE SET role = excluded.role, "
    "display_name = excluded.display_name, is_active = excluded.is_active "
    "WHERE (conversation_participants.role, conversation_participants.display_name, "
    "conversation_participants.is_active) IS DISTINCT FROM (excluded.role, excluded.display_name, "
    "excluded.is_active)",
    "conversation_id text, identity_id text, role text, display_name text, is_active boolean",
)
DELETE_PARTICIPANTS = Write(
    "participants.delete_rows",
    "DELETE FROM conversation_participants WHERE (conversation_id, identity_id) IN "
    "(SELECT r.conversation_id, r.identity_id FROM {rows})",
    "conversation_id text, identity_id text",
)


class Conversations:
    """The conversations of one bridge that a batch reads and writes, by remote id."""

    __slots__ = ("tx", "journal", "bridge_id", "table", "ids", "rosters", "__weakref__")

    def __init__(self, tx: Tx, journal: Journal, bridge_id: str) -> None:
        self.tx = tx
        self.journal = journal
        self.bridge_id = bridge_id
        self.table = Table(journal)
        self.ids: dict[str, str] = {}  # conversation id -> remote id, of every known row
        # (a proxy: a batch's families hold no cycle, so they are freed when the batch is, not
        # by the garbage collector)
        self.rosters = Rosters(tx, journal, bridge_id, weakref.proxy(self))

    def want(self, remote_id: str) -> None:
        self.table.want(remote_id)

    def reads(self) -> list[Any]:
        keys = self.table.take_wanted()
        if not keys:
            return []

        def take(rows: list[tuple[Any, ...]]) -> None:
            found = {r[0]: Conversation(r[1], r[2], r[3], r[4], r[5], r[6], r[7]) for r in rows}
            self.table.load_found(keys, found)
            for key, row in found.items():
                self.ids[row.id] = key  # a load, not a change: never taken back (``Table.load``)

        return [(*READ_BY_REMOTE_IDS.of(keys, bridge_id=self.bridge_id), take)]

    def get(self, remote_id: str) -> Conversation | None:
        """The conversation as the batch has it (read now if the batch has not read it)."""
        row: Conversation | None = self.table.fetch(remote_id, self.tx, self.reads)
        return row

    def exists(self, conversation_id: str) -> bool:
        remote = self.ids.get(conversation_id)
        return remote is not None and self.table.rows.get(remote) is not None

    def _insert(self, remote_id: str, row: Conversation) -> None:
        self.table.put(remote_id, row)
        self.journal.put(self.ids, row.id, remote_id)
        self.rosters.new_conversation(row.id)

    def upsert(self, *, id: str, remote_id: str, kind: str, title: str, remote_revision: str | None,
               now: int) -> int:
        """Insert (``last_message_at_ms`` 0), or update kind/title/revision when one
        differs; the rows written. A stored conversation keeps its id, creation time and
        recency."""
        have = self.get(remote_id)
        if have is None:
            self._insert(remote_id, Conversation(id, kind, title, remote_revision, 0, now, now))
            return 1
        if (have.kind, have.title, have.remote_revision) == (kind, title, remote_revision):
            return 0
        self.table.put(remote_id, have._replace(kind=kind, title=title, remote_revision=remote_revision,
                                                updated_at_ms=now))
        return 1

    def mint_or_bump(self, *, id: str, remote_id: str, kind: str, at_ms: int, now: int) -> int:
        """Create the conversation with ``last_message_at_ms = at_ms``, or raise its recency
        to ``at_ms`` when strictly newer; the rows written."""
        have = self.get(remote_id)
        if have is None:
            self._insert(remote_id, Conversation(id, kind, "", None, at_ms, now, now))
            return 1
        if have.last_message_at_ms >= at_ms:
            return 0
        self.table.put(remote_id, have._replace(last_message_at_ms=at_ms))
        return 1

    def touch(self, conversation_id: str, now: int) -> int:
        """Advance ``updated_at_ms`` to ``now``, never backwards; the rows written."""
        remote = self.ids.get(conversation_id)
        have = None if remote is None else self.table.rows.get(remote)
        if have is None or have.updated_at_ms >= now:
            return 0
        self.table.put(remote, have._replace(updated_at_ms=now))
        return 1

    def flush(self, send: Writer) -> None:
        """Write the changed conversations, then the rosters, then the conversations
        whose only change is a touch, when their roster changed (see the module docstring)."""
        table = self.table
        content, touched = [], []
        for key, was, row in table.changed():
            if was is None or was.content() != row.content():
                content.append((key, row))
            else:
                touched.append((key, was, row))
        self._send(send, content)
        rostered = self.rosters.flush(send)
        touches = []
        for key, was, row in touched:
            if row.id in rostered:
                touches.append((key, row))
            else:
                table.put(key, was)  # a touch whose roster change did not last: not written
        self._send(send, touches)

    def _send(self, send: Writer, changed: list[tuple[str, Conversation]]) -> None:
        if not changed:
            return
        rows = [{"id": row.id, "remote_conversation_id": key, "kind": row.kind, "title": row.title,
                 "remote_revision": row.remote_revision, "last_message_at_ms": row.last_message_at_ms,
                 "created_at_ms": row.created_at_ms, "updated_at_ms": row.updated_at_ms} for key, row in changed]
        send(WRITE_ROWS, rows, bridge_id=self.bridge_id)
        self.table.written(key for key, _ in changed)


class Rosters:
    """The rosters a batch reads and writes: whole ones (``want_roster``, for a roster
    snapshot) and single members (``want_member``, for a sender joining one)."""

    __slots__ = ("tx", "journal", "bridge_id", "conversations", "members", "whole")

    def __init__(self, tx: Tx, journal: Journal, bridge_id: str, conversations: Conversations) -> None:
        self.tx = tx
        self.journal = journal
        self.bridge_id = bridge_id
        self.conversations = conversations
        # (conversation id, identity id) -> Participant, or None: not a member
        self.members = Table(journal)
        # conversation id -> frozenset of its members' identity ids, for rosters read whole
        self.whole = Table(journal)

    def want_roster(self, conversation_id: str) -> None:
        self.whole.want(conversation_id)

    def want_member(self, conversation_id: str, identity_id: str) -> None:
        if not self.whole.known(conversation_id):
            self.members.want((conversation_id, identity_id))

    def new_conversation(self, conversation_id: str) -> None:
        """A conversation the batch inserts has no members yet."""
        self.whole.load(conversation_id, frozenset())

    def reads(self) -> list[Any]:
        out: list[Any] = []
        whole = self.whole.take_wanted()
        if whole:
            def take_whole(rows: list[tuple[Any, ...]]) -> None:
                ids: dict[str, list[str]] = {cid: [] for cid in whole}
                for cid, iid, role, name, active in rows:
                    ids[cid].append(iid)
                    self.members.load((cid, iid), (role, name, bool(active)))
                for cid in whole:
                    self.whole.load(cid, frozenset(ids[cid]))

            out.append((*READ_ROSTERS.of(whole), take_whole))
        points = [key for key in self.members.take_wanted() if key[0] not in whole]
        if points:
            def take_points(rows: list[tuple[Any, ...]]) -> None:
                self.members.load_found(points, {(r[0], r[1]): (r[2], r[3], bool(r[4])) for r in rows})

            out.append((*READ_MEMBERS.of(points), take_points))
        return out

    def roster(self, conversation_id: str) -> dict[str, Participant]:
        """The whole roster, {identity id: participant} (read now if not read yet)."""
        members = self.members.rows
        out = {}
        for iid in self.whole.fetch(conversation_id, self.tx, self.reads):
            value = members.get((conversation_id, iid))
            if value is not None:
                out[iid] = value
        return out

    def member(self, conversation_id: str, identity_id: str) -> Participant | None:
        key = (conversation_id, identity_id)
        members = self.members
        if members.known(key):
            value: Participant | None = members.get(key)
            return value
        if self.whole.known(conversation_id):
            return None  # a roster read whole names every member
        members.want(key)
        read_all(self.tx, self.reads())
        value = members.get(key)
        return value

    def _set(self, conversation_id: str, identity_id: str, value: Participant | None) -> None:
        self.members.put((conversation_id, identity_id), value)
        whole = self.whole
        if whole.known(conversation_id):
            ids = whole.get(conversation_id)
            whole.put(conversation_id, ids | {identity_id} if value is not None else ids - {identity_id})

    def sync(self, *, conversation_id: str, rows: list[RosterRow], touched_at_ms: int = 0) -> int:
        """Make the roster equal ``rows``, writing only the difference; the roster rows
        written (0: unchanged). When something was written and ``touched_at_ms > 0`` the
        conversation's ``updated_at_ms`` advances to it (never back). Raises
        :class:`RosterError` for a repeated identity or a missing conversation, before
        changing anything."""
        if not self.conversations.exists(conversation_id):
            raise RosterError(f"conversation {conversation_id!r} does not exist")
        stored = self.roster(conversation_id)
        if _matches(stored, rows):
            return 0
        wanted: dict[str, RosterRow] = {}
        for row in rows:
            if row.identity_id in wanted:
                raise RosterError(f"identity {row.identity_id!r} appears twice in the roster")
            wanted[row.identity_id] = row
        written = 0
        for identity_id in stored:
            if identity_id not in wanted:
                self._set(conversation_id, identity_id, None)
                written += 1
        for identity_id, row in wanted.items():
            values = (row.role, row.display_name, bool(row.is_active))
            if stored.get(identity_id) != values:
                self._set(conversation_id, identity_id, values)
                written += 1
        if written and touched_at_ms > 0:
            self.conversations.touch(conversation_id, touched_at_ms)
        return written

    def ensure_and_touch(self, *, conversation_id: str, identity_id: str, display_name: str, now: int) -> int:
        """Add ``identity_id`` as an active member unless it is one already, and then touch
        the conversation at ``now``; the roster rows written (0 or 1)."""
        if self.member(conversation_id, identity_id) is not None:
            return 0
        self._set(conversation_id, identity_id, ("member", display_name, True))
        self.conversations.touch(conversation_id, now)
        return 1

    def flush(self, send: Writer) -> set[str]:
        """Write the roster differences (a delete, then an upsert statement); the
        conversations whose roster was written."""
        upserts, deletes, keys = [], [], []
        for key, _was, row in self.members.changed():
            cid, iid = key
            keys.append(key)
            if row is None:
                deletes.append({"conversation_id": cid, "identity_id": iid})
            else:
                upserts.append({"conversation_id": cid, "identity_id": iid, "role": row[0],
                                "display_name": row[1], "is_active": row[2]})
        if deletes:
            send(DELETE_PARTICIPANTS, deletes)
        if upserts:
            send(WRITE_PARTICIPANTS, upserts, bridge_id=self.bridge_id)
        self.members.written(keys)
        self.whole.written([cid for cid, _, _ in self.whole.changed()])
        return {cid for cid, _ in keys}


def _matches(stored: dict[str, Participant], rows: list[RosterRow]) -> bool:
    """True when ``stored`` equals ``rows`` exactly; a roster that repeats an identity
    never matches (each stored identity is matched at most once)."""
    if len(rows) != len(stored):
        return False
    seen: set[str] = set()
    for row in rows:
        if row.identity_id in seen:
            return False
        seen.add(row.identity_id)
        if stored.get(row.identity_id) != (row.role, row.display_name, bool(row.is_active)):
            return False
    return True


# -- reads -------------------------------------------------------------------------------
CONVERSATION_COLUMNS = (
    "id, bridge_id, remote_conversation_id, kind, title, remote_revision, last_message_at_ms, "
    "created_at_ms, updated_at_ms"
)
BY_ID = Stmt(f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = :id", name="conversations.by_id")
_LISTED = (
    "SELECT id FROM conversations WHERE bridge_id = :bridge_id "
    "AND (last_message_at_ms, id) < (:before_ms, :before_id) "
    "ORDER BY last_message_at_ms DESC, id DESC LIMIT :limit"
)
LIST_OF_BRIDGE = Stmt(
    f"SELECT {CONVERSATION_COLUMNS} FROM conversations "
    "WHERE bridge_id = :bridge_id AND (last_message_at_ms, id) < (:before_ms, :before_id) "
    "ORDER BY last_message_at_ms DESC, id DESC LIMIT :limit",
    name="conversations.list_of_bridge",
)
PARTICIPANTS_OF_LISTED = Stmt(
    "SELECT p.conversation_id, p.identity_id, i.kind, i.canonical, i.raw, i.display_name AS identity_name, "
    "i.is_self, p.role, p.display_name, p.is_active FROM conversation_participants p "
    "JOIN identities i ON i.id = p.identity_id "
    f"WHERE p.conversation_id IN ({_LISTED}) "
    "ORDER BY p.conversation_id, i.kind, i.canonical",
    name="conversations.participants_of_listed",
)
PARTICIPANTS_OF = Stmt(
    "SELECT p.conversation_id, p.identity_id, i.kind, i.canonical, i.raw, i.display_name AS identity_name, "
    "i.is_self, p.role, p.display_name, p.is_active FROM conversation_participants p "
    "JOIN identities i ON i.id = p.identity_id WHERE p.conversation_id = :conversation_id "
    "ORDER BY i.kind, i.canonical",
    name="conversations.participants_of",
)
BRIDGE_OWNER = Stmt("SELECT owner_id FROM bridges WHERE id = :id", name="bridges.owner")
CONVERSATION_OWNER = Stmt(
    "SELECT c.bridge_id, b.owner_id FROM conversations c JOIN bridges b ON b.id = c.bridge_id WHERE c.id = :id",
    name="conversations.owner",
)


def bridge_owner(tx: Tx, bridge_id: str) -> tuple[bool, str | None]:
    """(the bridge exists, its owner's account id or None)."""
    row = tx.one(BRIDGE_OWNER, {"id": bridge_id})
    return (False, None) if row is None else (True, row[0])


def conversation_owner(tx: Tx, conversation_id: str) -> tuple[str, str | None] | None:
    """(bridge id, the bridge owner's account id or None) of a conversation, or None."""
    row = tx.one(CONVERSATION_OWNER, {"id": conversation_id})
    return None if row is None else (row[0], row[1])


def by_id(tx: Tx, conversation_id: str) -> dict[str, Any] | None:
    return tx.mapping(BY_ID, {"id": conversation_id})


def list_of_bridge(
    tx: Tx, bridge_id: str, *, limit: int = 100, before_ms: int | None = None, before_id: str = ""
) -> list[dict[str, Any]]:
    """Conversations of a bridge, most recent message first (then id), each with
    ``participants``.

    Keyset paging on ``(last_message_at_ms, id)``: ``before_ms`` alone keeps conversations
    whose last message is strictly older (``before_id`` ``""`` sorts below every id);
    with the last row's ``before_id`` too, the next page resumes right after that row, so
    conversations sharing a millisecond across a page boundary are neither skipped nor
    repeated.
    """
    params = {
        "bridge_id": bridge_id,
        "limit": limit,
        "before_ms": FAR_FUTURE_MS if before_ms is None else before_ms,
        "before_id": before_id,
    }
    rows = tx.mappings(LIST_OF_BRIDGE, params)
    if not rows:
        return rows
    by_conv: dict[str, list[dict[str, Any]]] = {r["id"]: [] for r in rows}
    for p in tx.mappings(PARTICIPANTS_OF_LISTED, params):
        bucket = by_conv.get(p["conversation_id"])
        if bucket is not None:
            bucket.append(_participant(p))
    for r in rows:
        r["participants"] = by_conv[r["id"]]
    return rows


def participants_of(tx: Tx, conversation_id: str) -> list[dict[str, Any]]:
    return [_participant(p) for p in tx.mappings(PARTICIPANTS_OF, {"conversation_id": conversation_id})]


def _participant(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "identity_id": p["identity_id"],
        "kind": p["kind"],
        "canonical": p["canonical"],
        "raw": p["raw"],
        "name": p["display_name"] or p["identity_name"],
        "is_self": bool(p["is_self"]),
        "role": p["role"],
        "is_active": bool(p["is_active"]),
    }
