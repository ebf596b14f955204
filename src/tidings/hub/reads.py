"""Reads the agent tools compose inside one read transaction: messages by id, the LIKE
text scans (the baseline the full-text index of ``hub.search`` is measured against), the
bridges a caller may read, and the accounts bridges post as. The edges (HTTP, MCP) reach
the store through these, never directly."""

from __future__ import annotations

from typing import Any

from ..store import bridge_messages as bridge_messages_store
from ..store import inbox as inbox_store
from ..store import like_search
from ..store import messages as messages_store
from ..store.engine import Tx


def message(tx: Tx, message_id: str) -> dict[str, Any] | None:
    """A hub message row by id (None when unknown); visibility is the caller's check."""
    return messages_store.message(tx, message_id)


def search_channel_messages(tx: Tx, account_id: str, query: str, limit: int) -> list[dict[str, Any]]:
    return like_search.search_channel_messages(tx, account_id, query, limit)


def search_bridge_messages(tx: Tx, query: str, *, limit: int, owner_id: str | None) -> list[dict[str, Any]]:
    return bridge_messages_store.search(tx, query, limit=limit, owner_id=owner_id)


def bridge_account_ids(tx: Tx) -> frozenset[str]:
    return like_search.bridge_account_ids(tx)


def bridges_of_owner(tx: Tx, owner_id: str | None) -> list[dict[str, Any]]:
    """The bridges of ``owner_id`` (every bridge for None)."""
    return inbox_store.bridges(tx, owner_id)
