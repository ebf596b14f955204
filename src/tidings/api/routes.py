"""Core HTTP routes: health, status, accounts, channels, members, messages (docs/api.md §3).

Handlers are plain ``def``: FastAPI runs them in its threadpool, so the synchronous store
never blocks the event loop.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from ..errors import BadRequest, Forbidden
from ..hub import accounts as accounts_hub
from ..hub import channels as channels_hub
from ..hub import refs
from ..hub.channels import public_message
from ..hub.tokens import Principal
from . import deps

router = APIRouter()


@router.get("/healthz")
def healthz() -> dict[str, Any]:
    return {"ok": True}


@router.get("/api/status")
def status(request: Request, who: Principal = Depends(deps.admin)) -> dict[str, Any]:
    return deps.runtime(request).status()


# -- accounts ----------------------------------------------------------------------------
@router.post("/api/v1/accounts", status_code=201)
def create_account(
    request: Request, body: dict = Depends(deps.json_object), who: Principal = Depends(deps.admin)
) -> dict[str, Any]:
    created = accounts_hub.create_account(
        deps.runtime(request).store,
        kind=body.get("kind"),
        handle=body.get("handle"),
        display_name=body.get("display_name"),
        owner=refs.resolve_account(deps.runtime(request).store, body.get("owner")),
        wake=body.get("wake"),
        created_by=who.account_id,
    )
    return created.as_json()


@router.get("/api/v1/accounts")
def list_accounts(request: Request, handle: str | None = None, who: Principal = Depends(deps.admin)) -> dict[str, Any]:
    return {"accounts": accounts_hub.list_accounts(deps.runtime(request).store, handle)}


@router.get("/api/v1/me")
def me(request: Request, who: Principal = Depends(deps.principal)) -> dict[str, Any]:
    out: dict[str, Any] = {"scope": who.scope}
    if who.account_id:
        account = accounts_hub.account(deps.runtime(request).store, who.account_id)
        if account is not None:
            out["account"] = account
    if who.bridge_id:
        out["bridge_id"] = who.bridge_id
    return out


# -- channels ----------------------------------------------------------------------------
@router.post("/api/v1/channels", status_code=201)
def create_channel(
    request: Request, body: dict = Depends(deps.json_object), who: Principal = Depends(deps.account_caller)
) -> dict[str, Any]:
    return channels_hub.create_channel(
        deps.runtime(request).store,
        who,
        name=body.get("name"),
        members=refs.resolve_account_lists(deps.runtime(request).store, body, ("members",)).get("members"),
        mandatory_subscription=body.get("mandatory_subscription", False),
    )


@router.get("/api/v1/channels")
def list_channels(request: Request, name: str | None = None, who: Principal = Depends(deps.account_caller)) -> dict[str, Any]:
    rows = channels_hub.list_channels(deps.runtime(request).store, who)
    if name is not None:  # ?name=general or ?name=%23general (D55)
        rows = [c for c in rows if c["name"] == name.removeprefix("#")]
    return {"channels": rows}


@router.post("/api/v1/channels/{channel_id}/members")
def update_members(
    channel_id: str,
    request: Request,
    body: dict = Depends(deps.json_object),
    who: Principal = Depends(deps.account_caller),
) -> dict[str, Any]:
    store = deps.runtime(request).store
    body = refs.resolve_account_lists(store, body, ("add", "subscribe", "unsubscribe", "remove"))
    return channels_hub.update_members(store, who, refs.resolve_channel(store, who, channel_id), body)


@router.get("/api/v1/channels/{channel_id}/members")
def list_members(channel_id: str, request: Request, who: Principal = Depends(deps.account_caller)) -> dict[str, Any]:
    store = deps.runtime(request).store
    return {"members": channels_hub.channel_members(store, who, refs.resolve_channel(store, who, channel_id))}


@router.get("/api/v1/channels/{channel_id}/messages")
def list_messages(
    channel_id: str,
    request: Request,
    after_seq: str | None = None,
    limit: str | None = None,
    who: Principal = Depends(deps.account_caller),
) -> dict[str, Any]:
    store = deps.runtime(request).store
    rows = channels_hub.list_messages(store, who, refs.resolve_channel(store, who, channel_id), after_seq, limit)
    return {"messages": rows}


# -- messages ----------------------------------------------------------------------------
_POST_FIELDS = {"topic", "text", "blocks", "client_request_id"}


@router.post("/api/v1/channels/{channel_id}/messages", status_code=201)
def post_message(
    channel_id: str,
    request: Request,
    body: dict = Depends(deps.json_object),
    who: Principal = Depends(deps.account_caller),
):
    unknown = set(body) - _POST_FIELDS
    if unknown:
        raise BadRequest(f"unknown fields: {sorted(unknown)}")
    rt = deps.runtime(request)
    row, inserted = rt.posting.post(
        author_id=who.account_id,
        channel_id=refs.resolve_channel(rt.store, who, channel_id),
        text=body.get("text"),
        blocks=body.get("blocks"),
        topic=body.get("topic"),
        client_request_id=body.get("client_request_id"),
        is_admin=who.is_admin,
    )
    payload = {"message": public_message(row), "inserted": inserted}
    return JSONResponse(payload, status_code=201 if inserted else 200)


@router.patch("/api/v1/messages/{message_id}")
def edit_message(
    message_id: str,
    request: Request,
    body: dict = Depends(deps.json_object),
    who: Principal = Depends(deps.account_caller),
) -> dict[str, Any]:
    if who.account_id is None:
        raise Forbidden("only the author may edit a message")
    row = deps.runtime(request).posting.edit(
        author_id=who.account_id, message_id=message_id, blocks=body.get("blocks"), is_admin=who.is_admin
    )
    return {"message": public_message(row)}


@router.get("/api/v1/messages/{message_id}")
def get_message(message_id: str, request: Request, who: Principal = Depends(deps.account_caller)) -> dict[str, Any]:
    return {"message": channels_hub.get_message(deps.runtime(request).store, who, message_id)}
