"""Bridges: one connected network login (Signal, WhatsApp, Google Messages) per bridge.

Creating a bridge makes, in one transaction: the bridge row, a ``system``-kind hub account
that speaks for it (what linked conversations will post as), and a bridge-scope token,
stored hashed and shown once. The account's handle is derived from the platform and the
name (``signal-alice-phone``), always in the handle grammar, never reserved, made unique
with a numeric suffix.

Who sees a bridge: the admin, and its owner (a human). A bridge token can only append
frames to its own bridge; it sees nothing else.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import BadRequest, Forbidden, NotFound
from ..hub.accounts import HANDLE_CHARS, MAX_HANDLE, RESERVED_HANDLES, check_handle
from ..hub.tokens import Principal, issue_token
from ..ids import new_id
from ..ingest.events import PLATFORMS
from ..store import accounts as accounts_store
from ..store import inbox as inbox_store
from ..store.engine import Store, Tx, is_integrity_error

MAX_NAME = 200
_SLUG_DROP = re.compile(rf"[^{HANDLE_CHARS}]+")


def bridge_handle_base(platform: str, name: str) -> str:
    """``<platform>-<slug of name>``: lowercase, in the handle grammar, at most 56 chars."""
    slug = _SLUG_DROP.sub("-", name.lower()).strip("-._")
    slug = re.sub(r"-{2,}", "-", slug)
    base = f"{platform}-{slug}" if slug else f"{platform}-bridge"
    return base[: MAX_HANDLE - 8].rstrip("-._")


def _free_handle(tx: Tx, base: str) -> str:
    handle, n = base, 1
    while handle in RESERVED_HANDLES or accounts_store.handle_taken(tx, handle):
        n += 1
        handle = f"{base}-{n}"
    return check_handle(handle)


def public_bridge(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "platform": row["platform"],
        "name": row["name"],
        "owner": row["owner_id"],
        "account_id": row["account_id"],
        "handle": row["handle"],
        "created_at_ms": row["created_at_ms"],
    }


def create_bridge(store: Store, *, platform: Any, name: Any, owner: Any = None) -> dict[str, Any]:
    """Create a bridge, its account and its token; the result carries the token once."""
    if platform not in PLATFORMS:
        raise BadRequest(f"platform must be one of {list(PLATFORMS)}", code="bad_platform")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME or "\x00" in name:
        raise BadRequest(f"name must be a non-empty string of at most {MAX_NAME} characters", code="bad_name")
    name = name.strip()
    if owner is not None and not isinstance(owner, str):
        raise BadRequest("owner must be a human account id", code="bad_owner")
    for _ in range(3):  # a concurrent create may take the derived handle first
        try:
            with store.write() as tx:
                now = store.now_ms()
                if owner is not None:
                    row = accounts_store.account(tx, owner)
                    if row is None:
                        raise NotFound(f"owner {owner!r} does not exist", code="unknown_owner")
                    if row["kind"] != "human":
                        raise BadRequest("a bridge's owner must be a human account", code="bad_owner")
                handle = _free_handle(tx, bridge_handle_base(platform, name))
                account_id = new_id("acc")
                accounts_store.insert_account(
                    tx,
                    id=account_id,
                    kind="system",
                    handle=handle,
                    display_name=f"{name} ({platform})",
                    owner_id=None,
                    wake_json=None,
                    now=now,
                )
                bridge_id = new_id("br")
                inbox_store.insert_bridge(
                    tx, id=bridge_id, platform=platform, name=name, owner_id=owner, account_id=account_id, now=now
                )
                token = issue_token(
                    tx, scope="bridge", account_id=account_id, bridge_id=bridge_id, label=handle, now=now
                )
                row = inbox_store.bridge(tx, bridge_id)
        except Exception as exc:
            if is_integrity_error(exc):
                continue
            raise
        assert row is not None
        return {**public_bridge(row), "token": token}
    raise BadRequest("could not find a free handle for this bridge; try another name", code="handle_taken")


def load_bridge(store: Store, bridge_id: str) -> dict[str, Any]:
    with store.read() as tx:
        row = inbox_store.bridge(tx, bridge_id)
    if row is None:
        raise NotFound(f"no bridge {bridge_id!r}", code="unknown_bridge")
    return row


def can_manage(who: Principal, row: dict[str, Any]) -> bool:
    """The admin or the bridge's owner."""
    return who.is_admin or (who.scope == "account" and who.account_id is not None and who.account_id == row["owner_id"])


def visible_bridge(store: Store, who: Principal, bridge_id: str) -> dict[str, Any]:
    """The bridge, if ``who`` may see it; otherwise the same 404 as an unknown one."""
    if who.scope == "bridge":
        raise Forbidden("a bridge token may only append frames to its own bridge", code="bridge_token")
    with store.read() as tx:
        row = inbox_store.bridge(tx, bridge_id)
    if row is None or not can_manage(who, row):
        raise NotFound(f"no bridge {bridge_id!r}", code="unknown_bridge")
    return row


def check_frame_writer(who: Principal, bridge_id: str) -> None:
    """Only this bridge's own token appends frames: others get 403, a foreign bridge 404."""
    if who.scope != "bridge":
        raise Forbidden("frames are appended with the bridge's own token", code="bridge_only")
    if who.bridge_id != bridge_id:
        raise NotFound(f"no bridge {bridge_id!r}", code="unknown_bridge")


def list_bridges(store: Store, who: Principal) -> list[dict[str, Any]]:
    if who.scope == "bridge":
        raise Forbidden("a bridge token may only append frames to its own bridge", code="bridge_token")
    with store.read() as tx:
        if who.is_admin:
            rows = inbox_store.bridges(tx)
        elif who.scope == "account" and who.kind == "human":
            rows = inbox_store.bridges(tx, who.account_id)
        else:
            rows = []
        backlog = inbox_store.backlog_by_bridge(tx) if rows else {}
        quarantined = inbox_store.quarantined_count_by_bridge(tx) if rows else {}
    out = []
    for row in rows:
        item = public_bridge(row)
        item["backlog"] = backlog.get(row["id"], 0)
        item["quarantined_total"] = quarantined.get(row["id"], 0)
        out.append(item)
    return out


def quarantine(store: Store, who: Principal, bridge_id: str, limit: Any = None) -> list[dict[str, Any]]:
    visible_bridge(store, who, bridge_id)
    if limit is None or limit == "":
        n = 100
    else:
        try:
            n = int(limit)
        except (TypeError, ValueError):
            raise BadRequest("limit must be an integer", code="bad_limit") from None
        if not 1 <= n <= 1000:
            raise BadRequest("limit must be between 1 and 1000", code="bad_limit")
    with store.read() as tx:
        return inbox_store.quarantined(tx, bridge_id, n)
