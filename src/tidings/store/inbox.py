"""Bridges and the ingest inbox: rows only, no policy.

The drain's two hot statements are ``UNPROCESSED_AFTER`` (positions only, a row-value range
seek over the partial index ``inbox_unprocessed_idx``) and ``LOAD_UNPROCESSED`` (one frame
by primary key). ``MARK_APPLIED`` / ``MARK_QUARANTINED`` only touch a row that is still
unprocessed, so a frame is finished at most once whoever races for it.
"""

from __future__ import annotations

from typing import Any, cast

from .batch_rows import Read, Write, Writer
from .engine import Tx
from .sql import PerDialect, Stmt, in_list, list_param

# -- bridges -----------------------------------------------------------------------------
BRIDGE_COLUMNS = "b.id, b.platform, b.name, b.owner_id, b.account_id, b.created_at_ms, a.handle"

INSERT_BRIDGE = Stmt(
    "INSERT INTO bridges (id, platform, name, owner_id, account_id, created_at_ms) "
    "VALUES (:id, :platform, :name, :owner_id, :account_id, :now)",
    name="insert_bridge",
)
BRIDGE_BY_ID = Stmt(
    f"SELECT {BRIDGE_COLUMNS} FROM bridges b JOIN accounts a ON a.id = b.account_id WHERE b.id = :id", name="bridge_by_id"
)
ALL_BRIDGES = Stmt(
    f"SELECT {BRIDGE_COLUMNS} FROM bridges b JOIN accounts a ON a.id = b.account_id ORDER BY b.created_at_ms, b.id",
    name="all_bridges",
)
BRIDGES_OWNED_BY = Stmt(
    f"SELECT {BRIDGE_COLUMNS} FROM bridges b JOIN accounts a ON a.id = b.account_id "
    "WHERE b.owner_id = :owner_id ORDER BY b.created_at_ms, b.id",
    name="bridges_owned_by",
)
BRIDGE_PLATFORM = Stmt("SELECT platform FROM bridges WHERE id = :id", name="bridge_platform")
BRIDGE_IDS = Stmt("SELECT id FROM bridges ORDER BY id", name="bridge_ids")

# -- inbox: append -------------------------------------------------------------------------
INSERT_FRAME = Stmt(
    "INSERT INTO inbox (inbox_id, bridge_id, dedupe_key, codec, codec_version, received_at_ms, "
    "client_received_at_ms, payload, processed_at_ms, outcome, cause) VALUES (:inbox_id, :bridge_id, "
    ":dedupe_key, :codec, :codec_version, :received_at_ms, :client_received_at_ms, :payload, "
    ":processed_at_ms, :outcome, :cause) "
    "ON CONFLICT (bridge_id, dedupe_key) WHERE dedupe_key <> '' DO NOTHING",
    name="inbox.insert_frame",
)
# ``dedupe_key <> ''`` repeats the unique index's predicate so the planner may use that
# partial index; without it this lookup scans the whole inbox.
FRAME_BY_DEDUPE = Stmt(
    "SELECT inbox_id, codec, codec_version, payload FROM inbox "
    "WHERE bridge_id = :bridge_id AND dedupe_key = :dedupe_key AND dedupe_key <> ''",
    name="inbox.frame_by_dedupe",
)

# A request applied on append (D113, D115): one read of the frames stored under the request's
# dedupe keys (a JSON array of them), and its inbox rows in one insert (PostgreSQL: a JSON
# array of row objects, sent behind, with the COMMIT). No ON CONFLICT: the
# bridge's append lock keeps every applying append of the bridge out, so a conflict is an
# append that does not apply racing this one, and its unique violation loses the whole
# transaction, which is then appended again the plain way (``WriteBehindFailed``).
STORED_BY_DEDUPE_KEYS = Read(
    # ``dedupe_key <> ''`` repeats the unique index's predicate so the planner may use it.
    "inbox.stored_by_dedupe_keys", "inbox", "dedupe_key, inbox_id, codec, codec_version, payload", "dedupe_key",
    "bridge_id = :bridge_id AND dedupe_key <> ''",
)
INSERT_FRAMES = Write(
    "inbox.insert_frames",
    "INSERT INTO inbox (inbox_id, bridge_id, dedupe_key, codec, codec_version, received_at_ms, "
    "client_received_at_ms, payload, processed_at_ms, outcome, cause) "
    "SELECT r.inbox_id, :bridge_id, r.dedupe_key, r.codec, r.codec_version, :received_at_ms, "
    "r.client_received_at_ms, r.payload, r.processed_at_ms, r.outcome, r.cause FROM {rows}",
    "inbox_id text, dedupe_key text, codec text, codec_version integer, client_received_at_ms bigint, "
    "payload text, processed_at_ms bigint, outcome text, cause text",
)

# -- inbox: drain ----------------------------------------------------------------------------
UNPROCESSED_AFTER = Stmt(
    "SELECT received_at_ms, inbox_id FROM inbox "
    "WHERE processed_at_ms IS NULL AND (received_at_ms, inbox_id) > (:after_ms, :after_id) "
    "ORDER BY received_at_ms, inbox_id LIMIT :limit",
    name="inbox.unprocessed_after",
)
LOAD_UNPROCESSED = Stmt(
    "SELECT bridge_id, codec, codec_version, received_at_ms, payload FROM inbox "
    "WHERE inbox_id = :inbox_id AND processed_at_ms IS NULL",
    name="inbox.load_unprocessed",
)
# The drain's load and its applied mark in one statement: the frame's transaction marks it
# first and rolls the mark back with everything else if the frame fails.
CLAIM_UNPROCESSED = Stmt(
    "UPDATE inbox SET processed_at_ms = :now, outcome = 'applied' "
    "WHERE inbox_id = :inbox_id AND processed_at_ms IS NULL "
    "RETURNING bridge_id, codec, codec_version, received_at_ms, payload",
    name="inbox.claim_unprocessed",
)
OLDER_UNPROCESSED = Stmt(
    "SELECT inbox_id FROM inbox WHERE processed_at_ms IS NULL AND bridge_id = :bridge_id "
    "AND (received_at_ms, inbox_id) < (:received_at_ms, :inbox_id) LIMIT :limit",
    name="inbox.older_unprocessed",
)
# PostgreSQL only: appends that apply on append take this per-bridge lock first, so two of
# them for one bridge never apply side by side out of receipt order (SQLite's single
# writer gives the same).
LOCK_BRIDGE_APPENDS = Stmt(
    "SELECT pg_advisory_xact_lock(hashtextextended(:bridge_id, 7466133002))",
    name="inbox.lock_bridge_appends",
)
# A drain group's claim (D118): every listed frame still unprocessed, loaded and marked
# applied in one statement; a frame of the group that fails is marked quarantined after.
CLAIM_MANY = PerDialect(
    name="inbox.claim_many",
    **{dialect: "UPDATE inbox SET processed_at_ms = :now, outcome = 'applied' "
                f"WHERE inbox_id {frag} AND processed_at_ms IS NULL "
                "RETURNING inbox_id, bridge_id, codec, codec_version, received_at_ms, payload"
       for dialect, frag in in_list("ids", "text").items()},
)
UNPROCESSED_BRIDGES = PerDialect(
    name="inbox.unprocessed_bridges",
    **{dialect: f"SELECT DISTINCT bridge_id FROM inbox WHERE inbox_id {frag} AND processed_at_ms IS NULL "
                "ORDER BY bridge_id"
       for dialect, frag in in_list("ids", "text").items()},
)
RELEASE_CLAIMED = PerDialect(
    name="inbox.release_claimed",
    **{dialect: f"UPDATE inbox SET processed_at_ms = NULL, outcome = NULL WHERE inbox_id {frag} "
                "AND outcome = 'applied'"
       for dialect, frag in in_list("ids", "text").items()},
)
QUARANTINE_CLAIMED = Stmt(
    "UPDATE inbox SET processed_at_ms = :now, outcome = 'quarantined', cause = :cause "
    "WHERE inbox_id = :inbox_id AND outcome = 'applied'",
    name="inbox.quarantine_claimed",
)
MARK_APPLIED = Stmt(
    "UPDATE inbox SET processed_at_ms = :now, outcome = 'applied' "
    "WHERE inbox_id = :inbox_id AND processed_at_ms IS NULL",
    name="inbox.mark_applied",
)
MARK_QUARANTINED = Stmt(
    "UPDATE inbox SET processed_at_ms = :now, outcome = 'quarantined', cause = :cause "
    "WHERE inbox_id = :inbox_id AND processed_at_ms IS NULL",
    name="inbox.mark_quarantined",
)

# -- inbox: status and inspection -------------------------------------------------------------
BACKLOG = Stmt("SELECT count(*) FROM inbox WHERE processed_at_ms IS NULL", name="backlog")
BACKLOG_BY_BRIDGE = Stmt(
    "SELECT bridge_id, count(*) FROM inbox WHERE processed_at_ms IS NULL GROUP BY bridge_id",
    name="backlog_by_bridge",
)
QUARANTINED_COUNT_BY_BRIDGE = Stmt(
    "SELECT bridge_id, count(*) FROM inbox WHERE outcome = 'quarantined' GROUP BY bridge_id",
    name="quarantined_count_by_bridge",
)
QUARANTINED_OF_BRIDGE = Stmt(
    "SELECT inbox_id, codec, cause, received_at_ms FROM inbox "
    "WHERE bridge_id = :bridge_id AND outcome = 'quarantined' "
    "ORDER BY received_at_ms DESC, inbox_id DESC LIMIT :limit",
    name="quarantined_of_bridge",
)
FRAME_STATE = Stmt(
    "SELECT inbox_id, bridge_id, dedupe_key, codec, codec_version, received_at_ms, client_received_at_ms, "
    "processed_at_ms, outcome, cause FROM inbox WHERE inbox_id = :inbox_id",
    name="frame_state",
)


# -- helpers -----------------------------------------------------------------------------------
def insert_bridge(
    tx: Tx, *, id: str, platform: str, name: str, owner_id: str | None, account_id: str, now: int
) -> None:
    tx.execute(
        INSERT_BRIDGE,
        {"id": id, "platform": platform, "name": name, "owner_id": owner_id, "account_id": account_id, "now": now},
    )


def bridge(tx: Tx, bridge_id: str) -> dict[str, Any] | None:
    return tx.mapping(BRIDGE_BY_ID, {"id": bridge_id})


def bridges(tx: Tx, owner_id: str | None = None) -> list[dict[str, Any]]:
    if owner_id is None:
        return tx.mappings(ALL_BRIDGES)
    return tx.mappings(BRIDGES_OWNED_BY, {"owner_id": owner_id})


def bridge_platform(tx: Tx, bridge_id: str) -> str | None:
    return cast("str | None", tx.scalar(BRIDGE_PLATFORM, {"id": bridge_id}))


def bridge_ids(tx: Tx) -> list[str]:
    return [r[0] for r in tx.all(BRIDGE_IDS)]


def insert_frame(
    tx: Tx,
    *,
    inbox_id: str,
    bridge_id: str,
    dedupe_key: str,
    codec: str,
    codec_version: int,
    received_at_ms: int,
    client_received_at_ms: int | None,
    payload: str,
    processed_at_ms: int | None = None,
    outcome: str | None = None,
    cause: str | None = None,
) -> bool:
    """Insert one frame, unprocessed unless an outcome is given (apply on append inserts
    it already applied or quarantined); False when (bridge, non-empty dedupe_key) is
    already stored."""
    n = tx.rowcount(
        INSERT_FRAME,
        {
            "inbox_id": inbox_id,
            "bridge_id": bridge_id,
            "dedupe_key": dedupe_key,
            "codec": codec,
            "codec_version": codec_version,
            "received_at_ms": received_at_ms,
            "client_received_at_ms": client_received_at_ms,
            "payload": payload,
            "processed_at_ms": processed_at_ms,
            "outcome": outcome,
            "cause": cause,
        },
    )
    return n == 1


def frame_by_dedupe(tx: Tx, bridge_id: str, dedupe_key: str) -> tuple[Any, ...] | None:
    """(inbox_id, codec, codec_version, payload) of the stored frame with this key."""
    return tx.one(FRAME_BY_DEDUPE, {"bridge_id": bridge_id, "dedupe_key": dedupe_key})


def read_ahead_stored_by_dedupe_keys(tx: Tx, bridge_id: str, keys: list[str]) -> None:
    """Announce ``stored_by_dedupe_keys`` (``Tx.read_ahead``)."""
    tx.read_ahead(*STORED_BY_DEDUPE_KEYS.of(keys, bridge_id=bridge_id))


def stored_by_dedupe_keys(tx: Tx, bridge_id: str, keys: list[str]) -> dict[str, tuple[Any, ...]]:
    """dedupe key -> (inbox_id, codec, codec_version, payload) of the bridge's stored frames
    under ``keys`` (not empty)."""
    rows = tx.all(*STORED_BY_DEDUPE_KEYS.of(keys, bridge_id=bridge_id))
    return {r[0]: tuple(r[1:]) for r in rows}


def insert_frames(tx: Tx, bridge_id: str, received_at_ms: int, rows: list[dict[str, Any]]) -> None:
    """Insert the inbox rows ``rows`` (dicts of ``inbox_id``, ``dedupe_key``, ``codec``,
    ``codec_version``, ``client_received_at_ms``, ``payload``, ``processed_at_ms``,
    ``outcome``, ``cause``), all of ``bridge_id`` received at ``received_at_ms``
    (``batch_rows.Writer``: one statement, behind when the transaction writes behind)."""
    Writer(tx)(INSERT_FRAMES, rows, bridge_id=bridge_id, received_at_ms=received_at_ms)


def unprocessed_after(tx: Tx, after_ms: int, after_id: str, limit: int) -> list[tuple[int, str]]:
    """Positions ``(received_at_ms, inbox_id)`` of unprocessed frames after the cursor."""
    return tx.all(UNPROCESSED_AFTER, {"after_ms": after_ms, "after_id": after_id, "limit": limit})


def load_unprocessed(tx: Tx, inbox_id: str) -> tuple[Any, ...] | None:
    """(bridge_id, codec, codec_version, received_at_ms, payload), or None once processed."""
    return tx.one(LOAD_UNPROCESSED, {"inbox_id": inbox_id})


def claim_unprocessed(tx: Tx, inbox_id: str, now: int) -> tuple[Any, ...] | None:
    """Mark an unprocessed frame applied and return what ``load_unprocessed`` returns; None
    when it is processed already. Only inside the transaction that applies the frame."""
    return tx.one(CLAIM_UNPROCESSED, {"inbox_id": inbox_id, "now": now})


def claim_many(tx: Tx, inbox_ids: list[str], now: int) -> dict[str, tuple[Any, ...]]:
    """``claim_unprocessed`` for several frames in one statement: inbox id ->
    (bridge_id, codec, codec_version, received_at_ms, payload) of those still unprocessed."""
    rows = tx.all(CLAIM_MANY, {"ids": list_param(tx, inbox_ids), "now": now})
    return {r[0]: tuple(r[1:]) for r in rows}


def unprocessed_bridges(tx: Tx, inbox_ids: list[str]) -> list[str]:
    """The bridges of those of ``inbox_ids`` still unprocessed, sorted."""
    return [r[0] for r in tx.all(UNPROCESSED_BRIDGES, {"ids": list_param(tx, inbox_ids)})]


def release_claimed(tx: Tx, inbox_ids: list[str]) -> None:
    """Frames this transaction claimed and will not apply: unprocessed again at its commit."""
    tx.execute(RELEASE_CLAIMED, {"ids": list_param(tx, inbox_ids)})


def quarantine_claimed(tx: Tx, inbox_id: str, now: int, cause: str) -> None:
    """A frame this transaction claimed (marked applied) failed: mark it quarantined instead."""
    tx.execute(QUARANTINE_CLAIMED, {"inbox_id": inbox_id, "now": now, "cause": cause})


def older_unprocessed(tx: Tx, bridge_id: str, received_at_ms: int, inbox_id: str, limit: int) -> list[str]:
    """Up to ``limit`` ids of ``bridge_id``'s unprocessed frames before ``(received_at_ms, inbox_id)``."""
    params = {"bridge_id": bridge_id, "received_at_ms": received_at_ms, "inbox_id": inbox_id, "limit": limit}
    return [r[0] for r in tx.all(OLDER_UNPROCESSED, params)]


def read_ahead_older_unprocessed(tx: Tx, bridge_id: str, received_at_ms: int, inbox_id: str, limit: int) -> None:
    """Announce an ``older_unprocessed`` call with these arguments (``Tx.read_ahead``)."""
    params = {"bridge_id": bridge_id, "received_at_ms": received_at_ms, "inbox_id": inbox_id, "limit": limit}
    tx.read_ahead(OLDER_UNPROCESSED, params)


def lock_bridge_appends(tx: Tx, bridge_id: str) -> None:
    """PostgreSQL: serialise this bridge's applying appends until ``tx`` ends. Deferred
    (``Tx.defer``): taken in the round trip of the transaction's next statement, before it."""
    if tx.dialect == "postgresql":
        tx.defer(LOCK_BRIDGE_APPENDS, {"bridge_id": bridge_id})


def mark_applied(tx: Tx, inbox_id: str, now: int) -> bool:
    return tx.rowcount(MARK_APPLIED, {"inbox_id": inbox_id, "now": now}) == 1


def mark_quarantined(tx: Tx, inbox_id: str, now: int, cause: str) -> bool:
    return tx.rowcount(MARK_QUARANTINED, {"inbox_id": inbox_id, "now": now, "cause": cause}) == 1


def backlog(tx: Tx) -> int:
    return int(tx.scalar(BACKLOG) or 0)


def backlog_by_bridge(tx: Tx) -> dict[str, int]:
    return {r[0]: int(r[1]) for r in tx.all(BACKLOG_BY_BRIDGE)}


def quarantined_count_by_bridge(tx: Tx) -> dict[str, int]:
    return {r[0]: int(r[1]) for r in tx.all(QUARANTINED_COUNT_BY_BRIDGE)}


def quarantined(tx: Tx, bridge_id: str, limit: int) -> list[dict[str, Any]]:
    return tx.mappings(QUARANTINED_OF_BRIDGE, {"bridge_id": bridge_id, "limit": limit})


def frame_state(tx: Tx, inbox_id: str) -> dict[str, Any] | None:
    return tx.mapping(FRAME_STATE, {"inbox_id": inbox_id})
