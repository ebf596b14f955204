"""Bridge link routes (docs/api.md §3.8)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request

from ..hub import refs
from ..hub.tokens import Principal
from . import deps

router = APIRouter()


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
    return {"links": deps.runtime(request).links.links_of_known_bridge(bridge_id)}


def install(app: FastAPI, runtime: Any) -> None:
    app.include_router(router)
