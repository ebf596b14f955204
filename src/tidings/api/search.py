"""``GET /api/v1/search?q=…`` (account or admin token; a bridge token is 403).

Query parameters: ``q`` (required), ``limit`` (1–100, default 20), ``channel_id``,
``conversation_id``, ``author``, ``before_ms``, ``after_ms``. The rules (what matches, who
may read what, the answer's shape) are ``hub.search``'s.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request

from ..hub import search as search_hub
from ..hub.tokens import Principal
from . import deps

router = APIRouter()


@router.get("/api/v1/search")
def search(
    request: Request,
    q: str | None = None,
    limit: str | None = None,
    channel_id: str | None = None,
    conversation_id: str | None = None,
    author: str | None = None,
    before_ms: str | None = None,
    after_ms: str | None = None,
    who: Principal = Depends(deps.account_caller),
) -> dict[str, Any]:
    req = search_hub.parse_request(
        q, limit=limit, channel_id=channel_id, conversation_id=conversation_id, author=author,
        before_ms=before_ms, after_ms=after_ms,
    )
    return search_hub.search(deps.runtime(request).store, who, req)


def install(app: FastAPI, runtime: Any) -> None:
    app.include_router(router)
