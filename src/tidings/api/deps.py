"""Request plumbing shared by every router: the runtime, the caller, the JSON body."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from .. import inputs
from ..errors import BadRequest, Forbidden
from ..http_edge import bearer
from ..hub.tokens import Principal, authenticate
from ..runtime import Runtime


def runtime(request: Request) -> Runtime:
    return request.app.state.runtime


def principal(request: Request) -> Principal:
    """The authenticated caller (sync: the token lookup runs in the threadpool)."""
    return authenticate(runtime(request).store, bearer(request))


def admin(request: Request) -> Principal:
    who = principal(request)
    if not who.is_admin:
        raise Forbidden("admin token required", code="admin_only")
    return who


def account_caller(request: Request) -> Principal:
    """A human, agent or admin caller; bridges may only push frames."""
    who = principal(request)
    if who.scope == "bridge":
        raise Forbidden("a bridge token may only append frames to its own bridge", code="bridge_token")
    return who


def agent_caller(request: Request) -> Principal:
    who = principal(request)
    if not who.is_agent:
        raise Forbidden("an agent token is required", code="agent_only")
    return who


async def json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object; a clear 400 for anything else."""
    raw = await request.body()
    if not raw:
        raise BadRequest("a JSON object body is required", code="bad_json")
    value = inputs.json_body(raw)
    if not isinstance(value, dict):
        raise BadRequest("the body must be a JSON object", code="bad_json")
    return value
