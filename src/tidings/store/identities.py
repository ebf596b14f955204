"""Bridge identities: who a network says did something, one row per (bridge, kind, canonical).

Rows only; the merge rule (which values a new sighting may change) lives in
``tidings.ingest.projection``. ``Identities`` holds a batch's identities of one bridge
(``store/batch_rows.py``, D115): read once, by key, with the batch's other reads; an
upsert writes only when a content column (raw, display_name, is_self, metadata) differs,
so an unchanged identity costs no row write and its ``updated_at_ms`` stays the time of
its last change. The flush writes every changed identity in one statement, whose
``ON CONFLICT`` update carries the same guard (``IDENTITY_GUARD``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .batch_rows import Journal, Read, Table, Write, Writer
from .engine import Tx
from .sql import Stmt


class Identity(NamedTuple):
    """A stored identity (the key ``(kind, canonical)`` is the ``Table``'s)."""

    id: str
    raw: str
    display_name: str
    is_self: bool
    metadata: str
    created_at_ms: int
    updated_at_ms: int

    def content(self) -> tuple[Any, ...]:
        return (self.raw, self.display_name, self.is_self, self.metadata)


# The one guard predicate of this table: every content column the upsert sets.
IDENTITY_GUARD = (
    "(identities.raw, identities.display_name, identities.is_self, identities.metadata) IS DISTINCT FROM "
    "(excluded.raw, excluded.display_name, excluded.is_self, excluded.metadata)"
)
READ_BY_KEYS = Read(
    "identities.read_by_keys", "identities",
    "kind, canonical, id, raw, display_name, is_self, metadata, created_at_ms, updated_at_ms", "kind, canonical",
    "bridge_id = :bridge_id",
)
WRITE_ROWS = Write(
    "identities.write_rows",
    "INSERT INTO identities (id, bridge_id, kind, canonical, raw, display_name, is_self, metadata, "
    "created_at_ms, updated_at_ms) SELECT r.id, :bridge_id, r.kind, r.canonical, r.raw, r.display_name, "
    "r.is_self, r.metadata, r.created_at_ms, r.updated_at_ms FROM {rows} WHERE true "
    "ON CONFLICT (bridge_id, kind, canonical) DO UPDATE SET raw = excluded.raw, "
    "display_name = excluded.display_name, is_self = excluded.is_self, metadata = excluded.metadata, "
    f"updated_at_ms = excluded.updated_at_ms WHERE {IDENTITY_GUARD}",
    "id text, kind text, canonical text, raw text, display_name text, is_self boolean, metadata text, "
    "created_at_ms bigint, updated_at_ms bigint",
)
COLUMNS = "id, bridge_id, kind, canonical, raw, display_name, is_self, metadata, created_at_ms, updated_at_ms"
OF_BRIDGE = Stmt(f"SELECT {COLUMNS} FROM identities WHERE bridge_id = :bridge_id ORDER BY kind, canonical", name="of_bridge")
BY_ID = Stmt(f"SELECT {COLUMNS} FROM identities WHERE id = :id", name="by_id")


class Identities:
    """The identities of one bridge that a batch reads and writes, by ``(kind, canonical)``."""

    __slots__ = ("tx", "bridge_id", "table")

    def __init__(self, tx: Tx, journal: Journal, bridge_id: str) -> None:
        self.tx = tx
        self.bridge_id = bridge_id
        self.table = Table(journal)

    def want(self, kind: str, canonical: str) -> None:
        self.table.want((kind, canonical))

    def reads(self) -> list[Any]:
        """The batch's read of the identities asked for (``batch_rows.read_all``)."""
        keys = self.table.take_wanted()
        if not keys:
            return []
        table = self.table

        def take(rows: list[tuple[Any, ...]]) -> None:
            table.load_found(keys, {(r[0], r[1]): Identity(r[2], r[3], r[4], bool(r[5]), r[6], r[7], r[8])
                                    for r in rows})

        return [(*READ_BY_KEYS.of(keys, bridge_id=self.bridge_id), take)]

    def get(self, kind: str, canonical: str) -> Identity | None:
        """The identity as the batch has it (read now if the batch has not read it)."""
        row: Identity | None = self.table.fetch((kind, canonical), self.tx, self.reads)
        return row

    def upsert(self, *, id: str, kind: str, canonical: str, raw: str, display_name: str, is_self: bool,
               now: int, metadata: str = "{}") -> int:
        """Insert, or update the content columns when one differs; the rows written (0 or
        1). A stored identity keeps its ``id`` and ``created_at_ms``."""
        have = self.get(kind, canonical)
        if have is None:
            self.table.put((kind, canonical), Identity(id, raw, display_name, is_self, metadata, now, now))
            return 1
        if have.content() == (raw, display_name, is_self, metadata):
            return 0
        self.table.put((kind, canonical), have._replace(raw=raw, display_name=display_name, is_self=is_self,
                                                        metadata=metadata, updated_at_ms=now))
        return 1

    def flush(self, send: Writer) -> None:
        """Write every identity whose content changed, in one statement."""
        rows, written = [], []
        table = self.table
        for key, was, row in table.changed():
            if was is not None and was.content() == row.content():
                table.put(key, was)  # changed and changed back: nothing to write
                continue
            kind, canonical = key
            rows.append({"id": row.id, "kind": kind, "canonical": canonical, "raw": row.raw,
                         "display_name": row.display_name, "is_self": row.is_self, "metadata": row.metadata,
                         "created_at_ms": row.created_at_ms, "updated_at_ms": row.updated_at_ms})
            written.append(key)
        if rows:
            send(WRITE_ROWS, rows, bridge_id=self.bridge_id)
            table.written(written)


def of_bridge(tx: Tx, bridge_id: str) -> list[dict[str, Any]]:
    return tx.mappings(OF_BRIDGE, {"bridge_id": bridge_id})


def by_id(tx: Tx, identity_id: str) -> dict[str, Any] | None:
    return tx.mapping(BY_ID, {"id": identity_id})
