"""Bridge routes (docs/api.md §3.8): create, append frames, quarantine, list.

``POST /api/v1/bridges/{id}/frames`` answers 202 only after the frames committed: the
bridge may forget them then. Every frame of a request is validated first; one bad frame is
a 400 naming it, and nothing of that request is appended.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from .. import inputs
from ..bridges import registry as bridges_hub
from ..errors import BadRequest
from ..hub import refs
from ..hub.tokens import Principal
from . import deps

router = APIRouter()


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        raise BadRequest("a JSON body is required", code="bad_json")
    return inputs.parse_json(raw)  # strict UTF-8 and bounded depth; the codecs judge the rest


@router.post("/api/v1/bridges", status_code=201)
def create_bridge(
    request: Request, body: dict = Depends(deps.json_object), who: Principal = Depends(deps.admin)
) -> dict[str, Any]:
    unknown = set(body) - {"platform", "name", "owner"}
    if unknown:
        raise BadRequest(f"unknown fields: {sorted(unknown)}")
    store = deps.runtime(request).store
    return bridges_hub.create_bridge(
        store, platform=body.get("platform"), name=body.get("name"), owner=refs.resolve_account(store, body.get("owner"))
    )


@router.get("/api/v1/bridges")
def list_bridges(request: Request, who: Principal = Depends(deps.principal)) -> dict[str, Any]:
    rt = deps.runtime(request)
    rows = bridges_hub.list_bridges(rt.store, who)
    for row in rows:
        row["counters"] = rt.ingest.counters.of(row["id"]).snapshot()
    return {"bridges": rows}


@router.get("/api/v1/bridges/{bridge_id}")
def get_bridge(bridge_id: str, request: Request, who: Principal = Depends(deps.principal)) -> dict[str, Any]:
    rt = deps.runtime(request)
    row = bridges_hub.public_bridge(bridges_hub.visible_bridge(rt.store, who, bridge_id))
    row["counters"] = rt.ingest.counters.of(bridge_id).snapshot()
    return row


@router.post("/api/v1/bridges/{bridge_id}/frames", status_code=202)
def append_frames(
    bridge_id: str, request: Request, body: Any = Depends(_json_body), who: Principal = Depends(deps.principal)
):
    bridges_hub.check_frame_writer(who, bridge_id)
    rt = deps.runtime(request)
    row = bridges_hub.load_bridge(rt.store, bridge_id)
    results = rt.ingest.append_body(bridge_id, body, row["platform"])
    return JSONResponse({"results": [r.as_json() for r in results]}, status_code=202)


@router.get("/api/v1/bridges/{bridge_id}/quarantine")
def quarantine(
    bridge_id: str, request: Request, limit: str | None = None, who: Principal = Depends(deps.principal)
) -> dict[str, Any]:
    frames = bridges_hub.quarantine(deps.runtime(request).store, who, bridge_id, limit)
    return {"frames": frames}


def install(app: FastAPI, runtime: Any) -> None:
    app.include_router(router)
