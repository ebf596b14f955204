"""Bridge conversation reads (CONTRACT §2 Bridges).

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

The access rule, the shapes and the paging are ``bridges/conversations.py``; this
module keeps only the routes.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request

from ..bridges.conversations import conversations_page, messages_page
from ..hub.tokens import Principal
from . import deps

router = APIRouter()


# -- routes ------------------------------------------------------------------------------
@router.get("/api/v1/bridges/{bridge_id}/conversations")
def get_conversations(
    bridge_id: str,
    request: Request,
    limit: str | None = None,
    before_ms: str | None = None,
    before_id: str | None = None,
    who: Principal = Depends(deps.account_caller),
) -> dict[str, Any]:
    return conversations_page(deps.runtime(request).store, who, bridge_id, limit, before_ms, before_id)


@router.get("/api/v1/conversations/{conversation_id}/messages")
def get_conversation_messages(
    conversation_id: str,
    request: Request,
    limit: str | None = None,
    before_ms: str | None = None,
    before_id: str | None = None,
    who: Principal = Depends(deps.account_caller),
) -> dict[str, Any]:
    return messages_page(deps.runtime(request).store, who, conversation_id, limit, before_ms, before_id)


def install(app: FastAPI, runtime: Any) -> None:
    app.include_router(router)
