"""Agent sessions over HTTP (docs/api.md §3.6, §4.1): the SSE stream, ack, state, owed mentions.

``GET /api/v1/session`` is a ``text/event-stream``. Opening it starts the agent's session
(replacing a live one, which receives ``end`` with reason ``replaced``); the stream's end
(client gone, server shutdown) ends it. Each event is ``event: <type>`` plus one ``data:``
line holding a JSON object that also carries ``"type"``:

* ``session`` ``{"session_id"}`` first;
* ``deliver`` / ``steer`` ``{"message": Message, "channel_id"}`` (a start's pins add
  ``"pinned": true``);
* ``pin`` ``{"channel_id", "message_id", "pinned", "message"?}`` and ``answer`` (an answer
  to the agent's ask; ack it with ``message_id`` and ``ask_id``): see delivery/pins.py and
  delivery/asks.py;
* ``end`` ``{"reason"}`` last, when the server ends the session.

Comment lines (``: keep-alive``) go out when nothing else did for ``keepalive_s``.

The stream is the async edge over the synchronous engine: the session queue is filled by
the delivery thread and drained here without blocking the event loop. The session is
registered inside the generator, so a response that never starts never leaves a session
behind; the generator's ``finally`` ends it however the stream stops.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..delivery.sessions import SessionEnd
from ..hub.tokens import Principal
from . import deps

router = APIRouter()


def _event(kind: str, payload: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


async def _stream(delivery: Any, agent_id: str, keepalive_s: float) -> AsyncIterator[str]:
    session = delivery.connect(agent_id)
    try:
        yield _event("session", {"type": "session", "session_id": session.session_id})
        while True:
            item = await session.next(keepalive_s)
            if item is None:
                if session.closed and session.pending() == 0:
                    return
                yield ": keep-alive\n\n"
                continue
            yield _event(item.kind, item.payload())
            if isinstance(item, SessionEnd):
                return
    finally:
        delivery.disconnect(session, "client_closed")


@router.get("/api/v1/session")
async def open_session(request: Request) -> StreamingResponse:
    who: Principal = await run_in_threadpool(deps.agent_caller, request)
    delivery = deps.runtime(request).delivery
    return StreamingResponse(
        _stream(delivery, who.account_id, delivery.options.keepalive_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post("/api/v1/ack")
def ack(request: Request, body: dict = Depends(deps.json_object), who: Principal = Depends(deps.agent_caller)):
    return deps.runtime(request).delivery.ack(who.account_id, body.get("message_id"), body.get("ask_id"))


@router.post("/api/v1/session/{session_id}/state")
def set_state(
    session_id: str,
    request: Request,
    body: dict = Depends(deps.json_object),
    who: Principal = Depends(deps.agent_caller),
) -> dict[str, Any]:
    state = body.get("state")
    deps.runtime(request).delivery.set_state(who.account_id, session_id, state)
    return {"session_id": session_id, "state": state}


@router.get("/api/v1/agents/{agent_id}/owed")
def owed(agent_id: str, request: Request, who: Principal = Depends(deps.account_caller)) -> dict[str, Any]:
    return {"owed": deps.runtime(request).delivery.owed(who, agent_id)}


def install(app: FastAPI, runtime: Any) -> None:
    if getattr(runtime, "delivery", None) is not None:
        app.include_router(router)
