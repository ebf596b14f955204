"""Bridge link routes (CONTRACT §2 Bridges: links)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request

from ..errors import NotFound
from ..hub.tokens import Principal
from ..store.sql import Stmt
from ..hub import refs
from . import deps

router = APIRouter()
_BRIDGE_EXISTS = Stmt("SELECT 1 FROM bridges WHERE id = :id")


@router.post("/api/v1/bridges/{bridge_id}/links")
def create_link(
    bridge_id: str, request: Request, body: dict = Depends(deps.json_object), who: Principal = Depends(deps.admin)
) -> dict[str, Any]:
    rt = deps.runtime(request)
    if "channel_id" in body:  # "#name" works here too (D55)
        body = {**body, "channel_id": refs.resolve_channel(rt.store, who, body["channel_id"])}
    return rt.links.link(who, bridge_id, body)


@router.get("/api/v1/bridges/{bridge_id}/links")
def list_links(bridge_id: str, request: Request, who: Principal = Depends(deps.admin)) -> dict[str, Any]:
    rt = deps.runtime(request)
    with rt.store.read() as tx:
        if tx.one(_BRIDGE_EXISTS, {"id": bridge_id}) is None:
            raise NotFound("unknown bridge", code="unknown_bridge")
    return {"links": rt.links.links(bridge_id)}


def install(app: FastAPI, runtime: Any) -> None:
    app.include_router(router)
