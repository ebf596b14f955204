"""The live web page (issue 6 item 2): the page itself, its assets, and the two reads it needs.

Routes:

* ``GET /`` -- the page (``tidings/web/index.html``); ``GET /static/app.js`` and
  ``/static/style.css`` -- its script and style sheet, from the package data. No build step.
  The page is public (it holds no data); every datum it shows comes from the API with the
  token the user typed, sent in the ``Authorization`` header, never in a URL.
* ``GET /api/v1/events`` (admin or account token; a bridge token is 403) -- the page's
  ``text/event-stream``. Each event is ``event: <type>`` plus one ``data:`` JSON object that
  also carries ``"type"``:

  - ``hello`` ``{"scope", "account_id", "bus_epoch", "bus_head_seq", "tick_ms"}`` first;
  - ``message`` ``{"event": "posted"|"updated", "channel_id", "message": Message,
    "bus_seq"}`` -- a message was posted or changed in a channel the caller can see *at that
    moment* (the same rule as every read: ``hub.channels.visible_channel``). The message is
    read from the store, never taken from the bus event;
  - ``pins`` ``{"channel_id", "message_id", "pinned", "bus_seq"}`` -- a visible channel's
    pins changed (the page re-reads them);
  - ``resync`` ``{"reason": "lagged"}`` -- the bus overran this stream: events were missed;
  - ``tick`` ``{"at_ms", "bus_head_seq"}`` every ``tick_ms`` (2 s by default): re-read the
    panels (agents, bridges, status) and any message a lost publish left out.

  The stream's bus subscription is in place *before* ``hello`` and ``resync`` go out, so a
  page that re-fetches from the durable API when it sees either misses nothing. The bus
  is only a hint: the page re-reads the API on ``hello`` (every connect and reconnect), on
  ``resync``, and on a gap in a channel's ``seq``.
* ``GET /api/v1/agents`` (admin: every agent; a human: the agents it owns; an agent: itself;
  a bridge token: 403) -- ``{"agents": [{"id", "kind", "handle", "display_name", "owner",
  "owner_handle", "home_channel_id", "live", "owed"}]}``. ``live`` comes from the delivery
  engine's session registry (memory, like liveness itself); ``owed`` counts the agent's open
  owed mentions in the store. On a cluster node (PostgreSQL, several processes) ``live``
  spans the cluster and ``node`` names the node holding the session. Who may see an agent is the rule of
  ``GET /api/v1/agents/{id}/owed`` (``Delivery.owed``); a test pins that the two agree.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..bus import BufferUnderflow, Bus, Stamped, Subscription
from ..errors import NotFound
from ..hub import accounts as accounts_hub
from ..hub import channels as channels_hub
from ..hub.tokens import Principal
from . import deps

router = APIRouter()

#: Seconds between ``tick`` events (``app.state.web_tick_s`` overrides it per app).
DEFAULT_TICK_S = 2.0
#: Bus events turned into page events per store read.
BATCH = 256

_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "search.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# The page runs no inline script or style and talks to its own origin only; a message's
# text can never become markup (the script builds text nodes), and this is the backstop.
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _asset(name: str) -> bytes:
    return resources.files("tidings").joinpath("web", name).read_bytes()


# -- the page and its assets ------------------------------------------------------------------
@router.get("/", include_in_schema=False)
def page() -> Response:
    return Response(_asset("index.html"), media_type=_ASSETS["index.html"], headers=_PAGE_HEADERS)


@router.get("/static/{name}", include_in_schema=False)
def static(name: str) -> Response:
    if name not in _ASSETS or name == "index.html":
        raise NotFound("no such file", code="not_found")
    return Response(_asset(name), media_type=_ASSETS[name], headers=_PAGE_HEADERS)


# -- agents overview ------------------------------------------------------------------------------
@router.get("/api/v1/agents")
def list_agents(request: Request, who: Principal = Depends(deps.account_caller)) -> dict[str, Any]:
    rt = deps.runtime(request)
    return {"agents": accounts_hub.agents_overview(rt.store, who, rt.delivery.registry.is_live,
                                                   getattr(rt, "cluster", None))}


# -- the page's event stream ----------------------------------------------------------------------
def _event(kind: str, payload: dict[str, Any]) -> str:
    body = json.dumps({"type": kind, **payload}, separators=(",", ":"), ensure_ascii=False)
    return f"event: {kind}\ndata: {body}\n\n"


def _subscribe(bus: Bus) -> Subscription:
    """A live-only subscription: from the current head on (anything published while this
    runs comes back as the replay)."""
    while True:
        try:
            return bus.subscribe(bus.head_seq, bus.epoch)
        except BufferUnderflow:  # more than a ring of events went by in between: try again
            continue


_TIMEOUT = object()


async def _stream(rt: Any, who: Principal, tick_s: float) -> AsyncIterator[str]:
    bus: Bus = rt.bus
    loop = asyncio.get_running_loop()
    sub = _subscribe(bus)
    try:
        yield _event(
            "hello",
            {
                "scope": who.scope,
                "account_id": who.account_id,
                "bus_epoch": str(bus.epoch),
                "bus_head_seq": sub.head_seq,
                "tick_ms": int(tick_s * 1000),
            },
        )
        pending: list[Stamped] = list(sub.replay)
        next_tick = loop.time() + tick_s
        while True:
            batch, pending = pending[:BATCH], pending[BATCH:]
            if not batch:
                remaining = next_tick - loop.time()
                first: Any = _TIMEOUT
                if remaining > 0:
                    try:
                        first = await asyncio.wait_for(sub.aget(), remaining)
                    except TimeoutError:
                        first = _TIMEOUT
                if first is None:  # closed: overrun (events were missed) or the bus shut
                    if not sub.lagged:
                        return
                    sub = _subscribe(bus)
                    pending = list(sub.replay)
                    yield _event("resync", {"reason": "lagged", "bus_head_seq": sub.head_seq})
                    continue
                if first is not _TIMEOUT:
                    batch.append(first)
                    while len(batch) < BATCH and (more := sub.get_nowait()) is not None:
                        batch.append(more)
            if batch:
                for payload in await run_in_threadpool(channels_hub.visible_events, rt.store, who, batch):
                    yield _event(payload.pop("page_event", "message"), payload)
            if loop.time() >= next_tick:
                yield _event("tick", {"at_ms": rt.clock.now_ms(), "bus_head_seq": bus.head_seq})
                next_tick = loop.time() + tick_s
    finally:
        sub.cancel()


@router.get("/api/v1/events")
async def events(request: Request) -> StreamingResponse:
    who: Principal = await run_in_threadpool(deps.account_caller, request)
    tick_s = float(getattr(request.app.state, "web_tick_s", DEFAULT_TICK_S))
    return StreamingResponse(
        _stream(deps.runtime(request), who, tick_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def install(app: FastAPI, runtime: Any) -> None:
    app.state.web_tick_s = DEFAULT_TICK_S
    app.include_router(router)
