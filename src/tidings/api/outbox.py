"""The outbox pull API for bridge processes, and where a linked channel's posts go.

``GET /api/v1/bridges/{id}/outbox`` answers the bridge's pending items in order; with
``wait_ms`` it long-polls (re-reads every ``POLL_MS``) until there is one or the wait ends.
``POST /api/v1/bridges/{id}/outbox/{item}`` reports one item ``sent`` or ``failed``.
``POST /api/v1/bridges/{id}/connector`` lets a connector publish its counters, shown under
the bridge in ``/api/status``. Only the bridge's own token (or the admin) may call these.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from starlette.concurrency import run_in_threadpool

from ..bridges import outbox as outbox_hub
from ..errors import BadRequest
from ..hub import channels as channels_hub
from ..hub.tokens import Principal
from ..params import int_param
from . import deps

router = APIRouter()
POLL_MS = 50
MAX_COUNTERS = 64


@router.get("/api/v1/bridges/{bridge_id}/outbox")
async def pull(
    bridge_id: str,
    request: Request,
    after_seq: str | None = None,
    limit: str | None = None,
    wait_ms: str | None = None,
    who: Principal = Depends(deps.principal),
) -> dict[str, Any]:
    outbox_hub.check_bridge_reader(who, bridge_id)
    after = int_param(after_seq, "after_seq", default=0, lo=0, hi=2**62)
    count = int_param(limit, "limit", default=outbox_hub.MAX_PULL, lo=1, hi=outbox_hub.MAX_PULL)
    wait = int_param(wait_ms, "wait_ms", default=0, lo=0, hi=outbox_hub.MAX_WAIT_MS)
    rt = deps.runtime(request)
    box = outbox_hub.Outbox(rt.store)
    await run_in_threadpool(box.bridge, bridge_id)
    deadline = time.monotonic() + wait / 1000
    while True:
        seen = outbox_hub.SIGNAL.generation()
        items = await run_in_threadpool(box.pending, bridge_id, after_seq=after, limit=count)
        if items or time.monotonic() >= deadline or await request.is_disconnected():
            break
        # woken at once by a commit in this process; else re-read after POLL_MS
        await run_in_threadpool(outbox_hub.SIGNAL.wait, seen, POLL_MS / 1000)
    typing = await run_in_threadpool(box.typing, bridge_id)
    return {"items": items, "next_after_seq": items[-1]["seq"] if items else after, "typing": typing}


@router.post("/api/v1/bridges/{bridge_id}/outbox/{item_id}")
def report(
    bridge_id: str, item_id: str, request: Request, body: dict = Depends(deps.json_object),
    who: Principal = Depends(deps.principal),
) -> dict[str, Any]:
    outbox_hub.check_bridge_reader(who, bridge_id)
    rt = deps.runtime(request)
    return {"item": outbox_hub.Outbox(rt.store, rt.bus).report(bridge_id, item_id, body)}


@router.get("/api/v1/bridges/{bridge_id}/outbox/{item_id}")
def one_item(bridge_id: str, item_id: str, request: Request, who: Principal = Depends(deps.principal)) -> dict[str, Any]:
    outbox_hub.check_bridge_reader(who, bridge_id)
    return {"item": outbox_hub.Outbox(deps.runtime(request).store).one(bridge_id, item_id)}


@router.post("/api/v1/bridges/{bridge_id}/connector")
def connector_counters(
    bridge_id: str, request: Request, body: dict = Depends(deps.json_object), who: Principal = Depends(deps.principal)
) -> dict[str, Any]:
    outbox_hub.check_bridge_reader(who, bridge_id)
    counters = body.get("counters")
    if not isinstance(counters, dict) or len(counters) > MAX_COUNTERS or not all(
        isinstance(k, str) and len(k) <= 64 and isinstance(v, int) and not isinstance(v, bool) for k, v in counters.items()
    ):
        raise BadRequest(f"counters must be an object of at most {MAX_COUNTERS} integer values", code="bad_counters")
    state = body.get("state", "")
    if not isinstance(state, str) or len(state) > 64:
        raise BadRequest("state must be a short string", code="bad_counters")
    rt = deps.runtime(request)
    outbox_hub.Outbox(rt.store).bridge(bridge_id)
    outbox_hub.CONNECTORS.put(rt, bridge_id, {"state": state, "counters": dict(counters),
                                              "at_ms": rt.store.now_ms()})
    return {"ok": True}


@router.post("/api/v1/messages/{message_id}/reactions", status_code=202)
def react(
    message_id: str, request: Request, body: dict = Depends(deps.json_object),
    who: Principal = Depends(deps.account_caller),
) -> dict[str, Any]:
    """React to a bridged message: queues a ``react`` for each network it lives on."""
    unknown = set(body) - {"emoji"}
    if unknown:
        raise BadRequest(f"unknown fields: {sorted(unknown)}")
    return {"queued": outbox_hub.react(deps.runtime(request).store, who, message_id, body.get("emoji"))}


@router.get("/api/v1/channels/{channel_id}/destinations")
def destinations(channel_id: str, request: Request, who: Principal = Depends(deps.account_caller)) -> dict[str, Any]:
    """Where a post in this channel will also go (the composer shows it)."""
    store = deps.runtime(request).store
    with store.read() as tx:
        channels_hub.visible_channel(tx, who, channel_id)
    return {"destinations": outbox_hub.linked_destinations(store, channel_id)}


def install(app: FastAPI, runtime: Any) -> None:
    app.include_router(router)
