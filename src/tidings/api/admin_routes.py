"""Admin routes behind ``tidings admin --url`` (the admin token only):

* ``GET /api/v1/accounts/{id}`` — one account;
* ``POST /api/v1/accounts/{id}/token`` — revoke the account's tokens, issue a new one;
* ``POST /api/v1/bridges/{id}/token`` — the same for a bridge;
* ``POST /api/v1/admin/token`` — revoke every admin token, issue a new one (the caller's
  own token stops working; ``tidings admin token --reset --db`` does this without one).

Each calls ``hub.token_admin``, as the ``--db`` side of the CLI does.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request

from ..hub import token_admin
from ..hub.tokens import Principal
from . import deps

router = APIRouter()


@router.get("/api/v1/accounts/{account_id}")
def show_account(account_id: str, request: Request, who: Principal = Depends(deps.admin)) -> dict[str, Any]:
    return token_admin.show_account(deps.runtime(request).store, account_id)


@router.post("/api/v1/accounts/{account_id}/token")
def reset_account_token(account_id: str, request: Request, who: Principal = Depends(deps.admin)) -> dict[str, Any]:
    return token_admin.reset_account_token(deps.runtime(request).store, account_id)


@router.post("/api/v1/bridges/{bridge_id}/token")
def reset_bridge_token(bridge_id: str, request: Request, who: Principal = Depends(deps.admin)) -> dict[str, Any]:
    return token_admin.reset_bridge_token(deps.runtime(request).store, bridge_id)


@router.post("/api/v1/admin/token")
def reset_admin_token(request: Request, who: Principal = Depends(deps.admin)) -> dict[str, Any]:
    return token_admin.reset_admin_token(deps.runtime(request).store)


def install(app: FastAPI, runtime: Any) -> None:
    app.include_router(router)
