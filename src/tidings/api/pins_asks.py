"""Channel pins and ask answers over HTTP (docs/api.md §3.7).

* ``GET /api/v1/channels/{id}/pins``: members and the admin; pins in position order.
* ``POST`` / ``DELETE /api/v1/channels/{id}/pins/{message_id}``: the channel owner and the
  admin; at most 5 pins (409 ``too_many_pins``).
* ``POST /api/v1/messages/{id}/asks/{ask_id}/answer`` ``{"answers": {question_id: value}}``:
  any member but the asker, exactly once (409 ``already_answered``).

The rules live in ``hub/pins.py`` and ``hub/asks.py``; these handlers only map HTTP.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request

from ..errors import BadRequest
from ..hub import asks as asks_hub
from ..hub import pins as pins_hub
from ..hub.tokens import Principal
from . import deps

router = APIRouter()


@router.get("/api/v1/channels/{channel_id}/pins")
def list_pins(channel_id: str, request: Request, who: Principal = Depends(deps.account_caller)) -> dict[str, Any]:
    return pins_hub.list_pins(deps.runtime(request).store, who, channel_id)


@router.post("/api/v1/channels/{channel_id}/pins/{message_id}")
def pin(channel_id: str, message_id: str, request: Request, who: Principal = Depends(deps.account_caller)):
    rt = deps.runtime(request)
    return pins_hub.pin(rt.store, rt.bus, who, channel_id, message_id)


@router.delete("/api/v1/channels/{channel_id}/pins/{message_id}")
def unpin(channel_id: str, message_id: str, request: Request, who: Principal = Depends(deps.account_caller)):
    rt = deps.runtime(request)
    return pins_hub.unpin(rt.store, rt.bus, who, channel_id, message_id)


@router.post("/api/v1/messages/{message_id}/asks/{ask_id}/answer")
def answer(
    message_id: str,
    ask_id: str,
    request: Request,
    body: dict = Depends(deps.json_object),
    who: Principal = Depends(deps.account_caller),
) -> dict[str, Any]:
    unknown = set(body) - {"answers"}
    if unknown:
        raise BadRequest(f"unknown fields: {sorted(unknown)}")
    rt = deps.runtime(request)
    return asks_hub.answer(rt.store, rt.bus, who, message_id, ask_id, body.get("answers"))


def install(app: FastAPI, runtime: Any) -> None:
    app.include_router(router)
