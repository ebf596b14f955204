"""Bridge conversation routes: ``GET /api/v1/bridges/{id}/conversations`` and
``GET /api/v1/conversations/{id}/messages`` (both keyset-paged with ``limit``,
``before_ms`` and ``before_id``).

Who may read, the shapes and the paging rules are ``bridges/conversations.py``; this
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
