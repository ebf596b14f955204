"""Read cursors: how far our own side has read each bridge conversation.

Moved only by our own read receipts (the projection decides that), and only forwards: the
cursor names the newest message read, ordered by (occurrence time, id). A receipt for an
older or the same message writes nothing. ``ReadCursors`` holds a batch's cursors of one
bridge (``store/batch_rows.py``, D115); its flush writes the moved ones in one statement,
whose update carries the same forwards-only guard.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .batch_rows import Journal, Read, Table, Write, Writer, probe, rows_json
from .engine import Tx
from .sql import PerDialect, Stmt


class Cursor(NamedTuple):
    last_read_message_id: str
    last_read_message_at_ms: int
    last_read_at_ms: int
    updated_at_ms: int


_CURSOR_COLUMNS = "last_read_message_id, last_read_message_at_ms, last_read_at_ms, updated_at_ms"
READ_BY_CONVERSATIONS = Read("read_cursors.read_by_conversations", "read_cursors",
                             f"conversation_id, {_CURSOR_COLUMNS}", "conversation_id")
# The cursors of the conversations holding the bridge's messages with these remote ids (a
# Signal read receipt may name a message outside the conversation it names); one row per
# such conversation, with NULLs where it has no cursor yet.
_HOLDING = probe("bridge_messages", "conversation_id", "remote_message_id", "bridge_id = :bridge_id")
READ_OF_REMOTE_MESSAGES = PerDialect(
    name="read_cursors.read_of_remote_messages",
    **{dialect: "SELECT m.conversation_id, " + ", ".join(f"rc.{c.strip()}" for c in _CURSOR_COLUMNS.split(","))
                + f" FROM (SELECT DISTINCT conversation_id FROM ({holding}) h) m LEFT JOIN read_cursors rc "
                "ON rc.conversation_id = m.conversation_id"
       for dialect, holding in _HOLDING.items()},
)
WRITE_ROWS = Write(
    "read_cursors.write_rows",
    "INSERT INTO read_cursors (conversation_id, bridge_id, last_read_message_id, last_read_message_at_ms, "
    "last_read_at_ms, updated_at_ms) SELECT r.conversation_id, :bridge_id, r.last_read_message_id, "
    "r.last_read_message_at_ms, r.last_read_at_ms, r.updated_at_ms FROM {rows} WHERE true "
    "ON CONFLICT (conversation_id) DO UPDATE SET last_read_message_id = excluded.last_read_message_id, "
    "last_read_message_at_ms = excluded.last_read_message_at_ms, last_read_at_ms = excluded.last_read_at_ms, "
    "updated_at_ms = excluded.updated_at_ms "
    "WHERE (excluded.last_read_message_at_ms, excluded.last_read_message_id) > "
    "(read_cursors.last_read_message_at_ms, read_cursors.last_read_message_id)",
    "conversation_id text, last_read_message_id text, last_read_message_at_ms bigint, last_read_at_ms bigint, "
    "updated_at_ms bigint",
)
GET = Stmt(
    "SELECT conversation_id, bridge_id, last_read_message_id, last_read_message_at_ms, last_read_at_ms, "
    "updated_at_ms FROM read_cursors WHERE conversation_id = :conversation_id",
    name="read_cursors.get",
)


class ReadCursors:
    """The read cursors of one bridge's conversations that a batch reads and writes."""

    __slots__ = ("tx", "bridge_id", "table", "remote")

    def __init__(self, tx: Tx, journal: Journal, bridge_id: str) -> None:
        self.tx = tx
        self.bridge_id = bridge_id
        self.table = Table(journal)
        self.remote: set[str] = set()  # remote message ids whose conversations' cursors to read

    def want(self, conversation_id: str) -> None:
        self.table.want(conversation_id)

    def want_of_remote(self, remote_message_id: str) -> None:
        """Ask for the cursors of the conversations holding messages with this remote id."""
        self.remote.add(remote_message_id)
        self.table.journal.asked = True

    def reads(self) -> list[Any]:
        out: list[Any] = []
        keys = self.table.take_wanted()
        if keys:
            def take(rows: list[tuple[Any, ...]]) -> None:
                self.table.load_found(keys, {r[0]: Cursor(r[1], r[2], r[3], r[4]) for r in rows})

            out.append((*READ_BY_CONVERSATIONS.of(keys), take))
        remote = sorted(self.remote)
        self.remote.clear()
        if remote:
            def take_remote(rows: list[tuple[Any, ...]]) -> None:
                for cid, mid, at, read_at, updated in rows:
                    self.table.load(cid, None if mid is None else Cursor(mid, at, read_at, updated))

            out.append((READ_OF_REMOTE_MESSAGES, {"bridge_id": self.bridge_id, "keys": rows_json(remote)},
                        take_remote))
        return out

    def advance(self, *, conversation_id: str, message_id: str, message_at_ms: int, read_at_ms: int,
                now: int) -> int:
        """Move the cursor to ``message_id`` when it is newer than the stored one, by
        (occurrence time, id); the rows written."""
        table = self.table
        have: Cursor | None = table.fetch(conversation_id, self.tx, self.reads)
        if have is not None and (message_at_ms, message_id) <= (have.last_read_message_at_ms,
                                                                 have.last_read_message_id):
            return 0
        table.put(conversation_id, Cursor(message_id, message_at_ms, read_at_ms, now))
        return 1

    def flush(self, send: Writer) -> None:
        rows, written = [], []
        for key, _was, row in self.table.changed():
            rows.append({"conversation_id": key, "last_read_message_id": row.last_read_message_id,
                         "last_read_message_at_ms": row.last_read_message_at_ms,
                         "last_read_at_ms": row.last_read_at_ms, "updated_at_ms": row.updated_at_ms})
            written.append(key)
        if rows:
            send(WRITE_ROWS, rows, bridge_id=self.bridge_id)
            self.table.written(written)


def get(tx: Tx, conversation_id: str) -> dict[str, Any] | None:
    return tx.mapping(GET, {"conversation_id": conversation_id})
