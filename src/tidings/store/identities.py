"""Bridge identities: who a network says did something, one row per (bridge, kind, canonical).

Rows only; the merge rule (which values a new sighting may change) lives in
``tidings.ingest.projection``. The upsert is guarded: on a natural-key conflict it updates
only when a content column (raw, display_name, is_self, metadata) differs, so an unchanged
identity costs no row write and its ``updated_at_ms`` stays the time of its last change.
"""

from __future__ import annotations

from typing import Any

from .engine import Rows, Tx
from .sql import Stmt

# The one guard predicate of this table: every content column the upsert sets.
IDENTITY_GUARD = (
    "identities.raw IS DISTINCT FROM excluded.raw"
    " OR identities.display_name IS DISTINCT FROM excluded.display_name"
    " OR identities.is_self IS DISTINCT FROM excluded.is_self"
    " OR identities.metadata IS DISTINCT FROM excluded.metadata"
)

UPSERT = Stmt(
    "INSERT INTO identities (id, bridge_id, kind, canonical, raw, display_name, is_self, metadata, "
    "created_at_ms, updated_at_ms) VALUES (:id, :bridge_id, :kind, :canonical, :raw, :display_name, "
    ":is_self, :metadata, :now, :now) "
    "ON CONFLICT (bridge_id, kind, canonical) DO UPDATE SET raw = excluded.raw, "
    "display_name = excluded.display_name, is_self = excluded.is_self, metadata = excluded.metadata, "
    "updated_at_ms = excluded.updated_at_ms "
    f"WHERE {IDENTITY_GUARD}",
    name="identities.upsert",
)
BY_KEY = Stmt(
    "SELECT id, raw, display_name, is_self, metadata FROM identities "
    "WHERE bridge_id = :bridge_id AND kind = :kind AND canonical = :canonical",
    name="identities.by_key",
)
COLUMNS = "id, bridge_id, kind, canonical, raw, display_name, is_self, metadata, created_at_ms, updated_at_ms"
OF_BRIDGE = Stmt(f"SELECT {COLUMNS} FROM identities WHERE bridge_id = :bridge_id ORDER BY kind, canonical", name="of_bridge")
BY_ID = Stmt(f"SELECT {COLUMNS} FROM identities WHERE id = :id", name="by_id")


def upsert(
    tx: Tx,
    *,
    id: str,
    bridge_id: str,
    kind: str,
    canonical: str,
    raw: str,
    display_name: str,
    is_self: bool,
    now: int,
    metadata: str = "{}",
) -> Rows:
    """Insert, or update the content columns when one differs; the rows written (true
    when one was; a write that may go behind, ``Tx.later``).

    A conflict keeps the stored ``id`` and ``created_at_ms``.
    """
    return tx.later(
            UPSERT,
            {
                "id": id,
                "bridge_id": bridge_id,
                "kind": kind,
                "canonical": canonical,
                "raw": raw,
                "display_name": display_name,
                "is_self": is_self,
                "metadata": metadata,
                "now": now,
            },
    )


def by_key(tx: Tx, bridge_id: str, kind: str, canonical: str) -> tuple[Any, ...] | None:
    """``(id, raw, display_name, is_self, metadata)`` of the stored identity, or None."""
    return tx.one(BY_KEY, {"bridge_id": bridge_id, "kind": kind, "canonical": canonical})


def read_ahead_by_key(tx: Tx, bridge_id: str, kind: str, canonical: str) -> None:
    """Announce a ``by_key`` read (``Tx.read_ahead``): the caller must not write this
    identity before it reads it."""
    tx.read_ahead(BY_KEY, {"bridge_id": bridge_id, "kind": kind, "canonical": canonical})


def of_bridge(tx: Tx, bridge_id: str) -> list[dict[str, Any]]:
    return tx.mappings(OF_BRIDGE, {"bridge_id": bridge_id})


def by_id(tx: Tx, identity_id: str) -> dict[str, Any] | None:
    return tx.mapping(BY_ID, {"id": identity_id})
