"""Bridge conversation reads: who may read them, their shapes, and keyset paging.

The HTTP routes (``api/conversations.py``) and the MCP tools both use these:

* ``GET /api/v1/bridges/{id}/conversations[?limit=&before_ms=&before_id=]`` — the
  bridge's conversations, most recent message first (``limit`` default 100, at most 1000;
  ``before_ms`` keeps conversations whose last message is strictly older);
* ``GET /api/v1/conversations/{id}/messages[?limit=&before_ms=&before_id=]`` — newest
  first, ``limit`` default 100, at most 1000, ``before_ms`` strictly older; active
  reactions only.

Both answers add ``next_before_ms`` and ``next_before_id`` (None on the last page): passed
back together they resume right after the last row shown, on ``(time, id)``, so rows that
share a millisecond across a page boundary are neither skipped nor repeated (``before_ms``
alone would skip the rest of the tie).

Who may read: the admin, the bridge's owner, and agents whose owner is the bridge's owner.
Everyone else (other humans, other agents, bridge tokens) gets 404, exactly as for an
unknown id, so nothing leaks about what exists.

The access rule is exposed (``may_read_bridge``, ``readable_owner``) for the MCP tools.
"""

from __future__ import annotations

from typing import Any

from ..errors import BadRequest, NotFound
from ..hub import attachments as attachments_hub
from ..hub.tokens import Principal
from ..params import int_param as _int_param
from ..store import accounts as accounts_store
from ..store import bridge_messages, conversations, reactions
from ..store.engine import Store, Tx

MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
MAX_BEFORE_MS = bridge_messages.FAR_FUTURE_MS
MAX_ID_LEN = 200
NOBODY = "\x00nobody"  # readable_owner() of a caller who may read no bridge


# -- access ------------------------------------------------------------------------------
def readable_owner(tx: Tx, who: Principal) -> str | None:
    """The owner whose bridges ``who`` may read: None for the admin (every bridge), the
    caller for a human, the agent's owner for an agent, ``NOBODY`` for anyone else."""
    if who.is_admin:
        return None
    if who.scope != "account" or not who.account_id:
        return NOBODY
    if who.kind == "agent":
        row = accounts_store.account(tx, who.account_id)
        owner = row.get("owner_id") if row else None
        return owner or NOBODY
    return who.account_id


def may_read_bridge(tx: Tx, who: Principal, bridge_owner_id: str | None) -> bool:
    owner = readable_owner(tx, who)
    return owner is None or (bridge_owner_id is not None and owner == bridge_owner_id)


def _visible_bridge(tx: Tx, who: Principal, bridge_id: str) -> None:
    exists, owner = conversations.bridge_owner(tx, bridge_id)
    if not exists or not may_read_bridge(tx, who, owner):
        raise NotFound("unknown bridge", code="unknown_bridge")


def _visible_conversation(tx: Tx, who: Principal, conversation_id: str) -> None:
    found = conversations.conversation_owner(tx, conversation_id)
    if found is None or not may_read_bridge(tx, who, found[1]):
        raise NotFound("unknown conversation", code="unknown_conversation")


# -- shapes ------------------------------------------------------------------------------
def public_conversation(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "bridge_id": row["bridge_id"],
        "remote_id": row["remote_conversation_id"],
        "kind": row["kind"],
        "title": row["title"],
        "participants": [
            {
                "identity_id": p["identity_id"],
                "raw": p["raw"],
                "name": p["name"],
                "is_self": p["is_self"],
                "role": p["role"],
                "is_active": p["is_active"],
            }
            for p in row.get("participants", [])
        ],
        "last_message_at_ms": row["last_message_at_ms"],
        "updated_at_ms": row["updated_at_ms"],
    }


def _person(identity_id: str | None, raw: str | None, name: str | None, is_self: Any) -> dict[str, Any]:
    return {"identity_id": identity_id, "raw": raw or "", "name": name or "", "is_self": bool(is_self)}


def public_message(row: dict[str, Any], reactions_of: list[dict[str, Any]]) -> dict[str, Any]:
    sender = None
    if row["sender_identity_id"] is not None:
        sender = _person(row["sender_identity_id"], row["sender_raw"], row["sender_name"], row["sender_is_self"])
    return {
        "id": row["id"],
        "conversation_id": row["conversation_id"],
        "remote_message_id": row["remote_message_id"],
        "sender": sender,
        "direction": row["direction"],
        "body": row["body"],
        "state": row["state"],
        "occurred_at_ms": row["occurred_at_ms"],
        "reply_to_remote_id": row["reply_to_remote_id"],
        "reactions": [
            {
                "emoji": r["emoji"],
                "reactor": _person(r["reactor_identity_id"], r["reactor_raw"], r["reactor_name"], r["reactor_is_self"]),
            }
            for r in reactions_of
        ],
    }


# -- use cases (also for the MCP tools) --------------------------------------------------
def list_conversations(tx: Tx, who: Principal, bridge_id: str, *, limit: int = DEFAULT_LIMIT,
                       before_ms: int | None = None, before_id: str = "") -> list[dict[str, Any]]:
    _visible_bridge(tx, who, bridge_id)
    rows = conversations.list_of_bridge(tx, bridge_id, limit=limit, before_ms=before_ms, before_id=before_id)
    return [public_conversation(r) for r in rows]


def conversation_messages(tx: Tx, who: Principal, conversation_id: str, *, limit: int = DEFAULT_LIMIT,
                          before_ms: int | None = None, before_id: str = "") -> list[dict[str, Any]]:
    _visible_conversation(tx, who, conversation_id)
    rows = bridge_messages.of_conversation(tx, conversation_id, limit=limit, before_ms=before_ms, before_id=before_id)
    if not rows:
        return []
    by_message = reactions.active_of_listed(
        tx, conversation_id, limit=limit,
        before_ms=bridge_messages.FAR_FUTURE_MS if before_ms is None else before_ms, before_id=before_id,
    )
    out = [public_message(r, by_message.get(r["id"], [])) for r in rows]
    attachments_hub.add_to_bridge_messages(tx, out)
    return out


def next_page(rows: list[dict[str, Any]], limit: int, time_key: str) -> dict[str, Any]:
    """The cursor of the page after ``rows``: the last row's time and id, to pass back as
    ``before_ms`` and ``before_id``; both None when the page was not full (nothing older)."""
    if len(rows) < limit or not rows:
        return {"next_before_ms": None, "next_before_id": None}
    last = rows[-1]
    return {"next_before_ms": last[time_key] or 0, "next_before_id": last["id"]}


def paging_params(limit: str | None, before_ms: str | None, before_id: str | None) -> tuple[int, int | None, str]:
    """``limit``, ``before_ms`` and ``before_id`` of a request, checked (a 400 otherwise)."""
    lim = _int_param(limit, "limit", default=DEFAULT_LIMIT, lo=1, hi=MAX_LIMIT)
    before = _int_param(before_ms, "before_ms", default=None, lo=0, hi=MAX_BEFORE_MS)
    if before_id is not None:
        if before is None:
            raise BadRequest("before_id needs before_ms (pass back next_before_ms and next_before_id together)")
        if not before_id or len(before_id) > MAX_ID_LEN:
            raise BadRequest(f"before_id must be 1 to {MAX_ID_LEN} characters")
    return lim, before, before_id or ""


def conversations_page(store: Store, who: Principal, bridge_id: str, limit: str | None, before_ms: str | None,
                       before_id: str | None) -> dict[str, Any]:
    """One page of a bridge's conversations with the cursor of the next (the HTTP answer)."""
    lim, before, after_row = paging_params(limit, before_ms, before_id)
    with store.read() as tx:
        convs = list_conversations(tx, who, bridge_id, limit=lim, before_ms=before, before_id=after_row)
    return {"conversations": convs, **next_page(convs, lim, "last_message_at_ms")}


def messages_page(store: Store, who: Principal, conversation_id: str, limit: str | None, before_ms: str | None,
                  before_id: str | None) -> dict[str, Any]:
    """One page of a conversation's messages with the cursor of the next (the HTTP answer)."""
    lim, before, after_row = paging_params(limit, before_ms, before_id)
    with store.read() as tx:
        msgs = conversation_messages(tx, who, conversation_id, limit=lim, before_ms=before, before_id=after_row)
    return {"messages": msgs, **next_page(msgs, lim, "occurred_at_ms")}
