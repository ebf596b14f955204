"""Search, the use case behind ``GET /api/v1/search`` and the MCP ``search_messages`` tool.

Invariant: a search returns exactly the messages that match (``store.search``'s rule) and
that the caller may read, and never anything else:

* hub messages of channels the caller is a member of (every channel for the admin: the
  same visibility as ``hub.channels.visible_channel``);
* bridge messages of the bridges the caller may read (``bridges.conversations.readable_owner``:
  the admin every bridge, a human its own, an agent its owner's, anyone else none).

Filters narrow it: ``channel_id`` (hub messages of that channel only), ``conversation_id``
(bridge messages of that conversation only), ``author`` (an account id for hub messages,
a sender identity id for bridge messages), ``before_ms`` / ``after_ms`` (exclusive bounds on
the shown time: a message's network time when it has one). A channel or conversation the
caller cannot read is a 404, exactly as when it does not exist.

Hits come best first (``score`` higher is better), each kind limited to ``limit`` and the
merged list cut to ``limit``. ``snippet`` is HTML-escaped text with each match in
``<mark>…</mark>``, safe to insert as markup.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from ..bridges.conversations import NOBODY, _visible_conversation, readable_owner
from ..bridges.conversations import public_message as conversation_message
from ..errors import BadRequest
from ..params import int_param
from ..store import search as search_store
from ..store import search_index
from ..store.engine import Store, Tx
from . import attachments as attachments_hub
from . import channels as channels_hub
from .tokens import Principal

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
MAX_QUERY = 200
MAX_ID = 200
MAX_MS = 2**62


@dataclass(frozen=True, slots=True)
class SearchRequest:
    query: str
    words: tuple[str, ...]
    limit: int = DEFAULT_LIMIT
    channel_id: str | None = None
    conversation_id: str | None = None
    author: str | None = None
    before_ms: int | None = None
    after_ms: int | None = None


def parse_request(
    q: Any,
    *,
    limit: Any = None,
    channel_id: Any = None,
    conversation_id: Any = None,
    author: Any = None,
    before_ms: Any = None,
    after_ms: Any = None,
    field: str = "q",
) -> SearchRequest:
    """A checked request (a 400 ``bad_query`` / ``bad_request`` otherwise); ``field`` names
    the query in error messages."""
    query = q.strip() if isinstance(q, str) else ""
    if not query or len(query) > MAX_QUERY:
        raise BadRequest(f"{field} must be 1 to {MAX_QUERY} characters", code="bad_query")
    words = search_store.query_words(query)
    if not words:
        raise BadRequest(f"{field} has no word to search for (letters or digits)", code="bad_query")
    for name, value in (("channel_id", channel_id), ("conversation_id", conversation_id), ("author", author)):
        if value is not None and (not isinstance(value, str) or not value or len(value) > MAX_ID):
            raise BadRequest(f"{name} must be 1 to {MAX_ID} characters")
    return SearchRequest(
        query=query,
        words=tuple(words),
        limit=int_param(limit, "limit", default=DEFAULT_LIMIT, lo=1, hi=MAX_LIMIT),
        channel_id=channel_id,
        conversation_id=conversation_id,
        author=author,
        before_ms=int_param(before_ms, "before_ms", default=None, lo=0, hi=MAX_MS),
        after_ms=int_param(after_ms, "after_ms", default=None, lo=0, hi=MAX_MS),
    )


def marked_snippet(marked: str | None) -> str:
    """The store's marked excerpt as HTML: escaped text, matches in ``<mark>``."""
    escaped = html.escape((marked or "").replace(search_store.LT_STANDIN, "<"), quote=True)
    return escaped.replace(search_store.MARK_START, "<mark>").replace(search_store.MARK_END, "</mark>")


def search_rows(tx: Tx, who: Principal, req: SearchRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(hub rows, bridge rows)`` the caller may read that match, each best first."""
    words = list(req.words)
    filters = {"author": req.author, "before_ms": req.before_ms, "after_ms": req.after_ms, "limit": req.limit}
    hub_rows: list[dict[str, Any]] = []
    bridge_rows: list[dict[str, Any]] = []
    if req.channel_id is not None:
        channels_hub.visible_channel(tx, who, req.channel_id)
    if req.conversation_id is not None:
        _visible_conversation(tx, who, req.conversation_id)
    if req.conversation_id is None or req.channel_id is not None:
        if who.is_admin or who.account_id:
            hub_rows = search_store.hub_messages(
                tx, words, account_id=who.account_id, all_channels=who.is_admin, channel_id=req.channel_id,
                **filters,
            )
    if req.channel_id is None or req.conversation_id is not None:
        owner = readable_owner(tx, who)
        if owner != NOBODY:
            bridge_rows = search_store.bridge_messages(
                tx, words, owner_id=owner, all_bridges=owner is None, conversation_id=req.conversation_id,
                **filters,
            )
    return hub_rows, bridge_rows


def search(store: Store, who: Principal, req: SearchRequest) -> dict[str, Any]:
    """The HTTP answer: ``{"query", "words", "results": [{"kind", "score", "snippet",
    "message"}]}``, best first, at most ``limit``. Runs in ``search_index.searching``:
    every message committed before the search began is found by its current text."""
    with search_index.searching(store) as tx:
        hub_rows, bridge_rows = search_rows(tx, who, req)
        results = [
            {"kind": "channel_message", "score": float(r["score"]), "snippet": marked_snippet(r["snippet_marked"]),
             "message": m}
            for r, m in zip(hub_rows, attachments_hub.public_channel_messages(tx, hub_rows), strict=True)
        ]
        found = []
        for r in bridge_rows:
            message = conversation_message(r, [])
            del message["reactions"]
            message.update(bridge_id=r["bridge_id"], conversation_title=r["conversation_title"])
            found.append(message)
            results.append({"kind": "bridge_message", "score": float(r["score"]),
                            "snippet": marked_snippet(r["snippet_marked"]), "message": message})
        attachments_hub.add_to_bridge_messages(tx, found)
    results.sort(key=lambda h: (-h["score"], -_shown_time(h["message"])))
    return {"query": req.query, "words": list(req.words), "results": results[: req.limit]}


def _shown_time(message: dict[str, Any]) -> int:
    return message.get("occurred_at_ms") or message.get("at_unix_ms") or 0
