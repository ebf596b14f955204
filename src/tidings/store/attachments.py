"""Attachment metadata of bridge messages, and what bridges uploaded (migration 0010).

``attachments``: one row per (bridge message, ordinal), inserted with the message (never
rewritten: ``ON CONFLICT DO NOTHING``, so a re-delivered frame writes nothing).
``attachment_uploads``: bytes a bridge uploaded for one of its attachments, by the codec's
``remote_id`` (an upload that names none is recorded under its own sha256, which is the
``remote_id`` of an attachment whose codec gave its hash, WhatsApp's). An attachment's
content address is its own ``sha256`` (known up front for WhatsApp) or, else, its
bridge's upload of that ``remote_id``, whichever order the frame and the upload came in.
"""

from __future__ import annotations

import json
from typing import Any

from .batch_rows import Journal, Write, Writer
from .engine import Tx
from .sql import PerDialect, Stmt

_COLUMNS = (
    "a.message_id, a.ordinal, a.bridge_id, a.name, a.content_type, a.size_bytes, a.width, a.height, a.caption, "
    "a.remote_id, COALESCE(a.sha256, u.sha256) AS sha256, "
    "CASE WHEN u.sha256 IS NOT NULL AND (a.sha256 IS NULL OR a.sha256 = u.sha256) THEN 1 ELSE 0 END AS uploaded"
)
_FROM = (
    "FROM attachments a LEFT JOIN attachment_uploads u "
    "ON u.bridge_id = a.bridge_id AND u.remote_id = a.remote_id AND a.remote_id <> '' "
)
OF_MESSAGES = PerDialect(
    name="attachments.of_messages",
    sqlite=f"SELECT {_COLUMNS} {_FROM}WHERE a.message_id IN (SELECT value FROM json_each(:ids)) "
    "ORDER BY a.message_id, a.ordinal",
    postgresql=f"SELECT {_COLUMNS} {_FROM}WHERE a.message_id = ANY(CAST(:ids AS text[])) "
    "ORDER BY a.message_id, a.ordinal",
)
ONE = Stmt(f"SELECT {_COLUMNS} {_FROM}WHERE a.message_id = :message_id AND a.ordinal = :ordinal",
           name="attachments.one")
UPSERT_UPLOAD = Stmt(
    "INSERT INTO attachment_uploads (bridge_id, remote_id, sha256, size_bytes, uploaded_at_ms) "
    "VALUES (:bridge_id, :remote_id, :sha256, :size_bytes, :now) ON CONFLICT (bridge_id, remote_id) DO UPDATE "
    "SET sha256 = excluded.sha256, size_bytes = excluded.size_bytes, uploaded_at_ms = excluded.uploaded_at_ms "
    "WHERE attachment_uploads.sha256 <> excluded.sha256",
    name="attachments.upsert_upload",
)


INSERT_ROWS = Write(
    "attachments.insert_rows",
    "INSERT INTO attachments (message_id, ordinal, bridge_id, name, content_type, size_bytes, width, height, "
    "caption, remote_id, sha256) SELECT r.message_id, r.ordinal, :bridge_id, r.name, r.content_type, "
    "r.size_bytes, r.width, r.height, r.caption, r.remote_id, r.sha256 FROM {rows} WHERE true "
    "ON CONFLICT DO NOTHING",
    "message_id text, ordinal integer, name text, content_type text, size_bytes bigint, width integer, "
    "height integer, caption text, remote_id text, sha256 text",
)


class NewAttachments:
    """The attachments of the messages a batch inserts (``store/batch_rows.py``), written
    with its flush in one statement."""

    __slots__ = ("journal", "bridge_id", "rows")

    def __init__(self, journal: Journal, bridge_id: str) -> None:
        self.journal = journal
        self.bridge_id = bridge_id
        self.rows: dict[tuple[str, int], dict[str, Any]] = {}

    def reads(self) -> list[Any]:
        """Nothing: a new message's attachments are new rows (the batch asks every family)."""
        return []

    def add(self, message_id: str, metas: list[dict[str, Any]]) -> int:
        """A new message's attachments (ordinal = position); the number added."""
        for ordinal, meta in enumerate(metas):
            self.journal.put(self.rows, (message_id, ordinal), {"message_id": message_id, "ordinal": ordinal, **meta})
        return len(metas)

    def flush(self, send: Writer) -> None:
        if self.rows:
            send(INSERT_ROWS, list(self.rows.values()), bridge_id=self.bridge_id)
            for key in list(self.rows):
                self.journal.drop(self.rows, key)


def of_messages(tx: Tx, message_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """``{bridge message id: [attachment rows by ordinal]}`` of those that have any."""
    if not message_ids:
        return {}
    ids: Any = json.dumps(message_ids) if tx.dialect == "sqlite" else list(message_ids)
    out: dict[str, list[dict[str, Any]]] = {}
    for row in tx.mappings(OF_MESSAGES, {"ids": ids}):
        out.setdefault(row["message_id"], []).append(row)
    return out


def one(tx: Tx, message_id: str, ordinal: int) -> dict[str, Any] | None:
    return tx.mapping(ONE, {"message_id": message_id, "ordinal": ordinal})


def record_upload(tx: Tx, *, bridge_id: str, remote_id: str, sha256: str, size_bytes: int, now: int) -> None:
    tx.execute(UPSERT_UPLOAD, {"bridge_id": bridge_id, "remote_id": remote_id, "sha256": sha256,
                               "size_bytes": size_bytes, "now": now})
