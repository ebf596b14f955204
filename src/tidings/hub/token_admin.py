"""Token resets: revoke an account's, a bridge's or the admin's live tokens and issue one
new token, in one transaction. The new secret is returned once and stored hashed.

``reset_admin_token`` is how a database whose first admin token was lost gets a new one
(``tidings admin token --reset --db``); every earlier admin token stops working.
"""

from __future__ import annotations

from typing import Any

from ..errors import NotFound
from ..store import accounts as accounts_store
from ..store import inbox as inbox_store
from ..store.engine import Store
from ..store.sql import Stmt
from .accounts import SYSTEM_HANDLE, public_account
from .tokens import issue_token

REVOKE_ACCOUNT = Stmt(
    "UPDATE api_tokens SET revoked_at_ms = :now "
    "WHERE account_id = :id AND scope = 'account' AND revoked_at_ms IS NULL"
)
REVOKE_BRIDGE = Stmt(
    "UPDATE api_tokens SET revoked_at_ms = :now WHERE bridge_id = :id AND scope = 'bridge' AND revoked_at_ms IS NULL"
)
REVOKE_ADMIN = Stmt("UPDATE api_tokens SET revoked_at_ms = :now WHERE scope = 'admin' AND revoked_at_ms IS NULL")


def show_account(store: Store, account_id: Any) -> dict[str, Any]:
    with store.read() as tx:
        row = accounts_store.account(tx, account_id) if isinstance(account_id, str) else None
    if row is None:
        raise NotFound("unknown account", code="unknown_account")
    return public_account(row)


def reset_account_token(store: Store, account_id: Any) -> dict[str, Any]:
    with store.write() as tx:
        row = accounts_store.account(tx, account_id) if isinstance(account_id, str) else None
        if row is None or row["kind"] not in ("human", "agent"):
            raise NotFound("unknown account", code="unknown_account")
        now = store.now_ms()
        revoked = tx.rowcount(REVOKE_ACCOUNT, {"id": account_id, "now": now})
        token = issue_token(tx, scope="account", account_id=account_id, label="reset", now=now)
    return {"account_id": account_id, "token": token, "revoked": revoked}


def reset_bridge_token(store: Store, bridge_id: Any) -> dict[str, Any]:
    with store.write() as tx:
        row = inbox_store.bridge(tx, bridge_id) if isinstance(bridge_id, str) else None
        if row is None:
            raise NotFound("unknown bridge", code="unknown_bridge")
        now = store.now_ms()
        revoked = tx.rowcount(REVOKE_BRIDGE, {"id": bridge_id, "now": now})
        token = issue_token(tx, scope="bridge", account_id=row["account_id"], bridge_id=bridge_id, label="reset",
                            now=now)
    return {"bridge_id": bridge_id, "token": token, "revoked": revoked}


def reset_admin_token(store: Store) -> dict[str, Any]:
    with store.write() as tx:
        system = accounts_store.account_by_handle(tx, SYSTEM_HANDLE)
        if system is None:
            raise NotFound("this database has no hub yet (start it once with tidings serve)", code="no_hub")
        now = store.now_ms()
        revoked = tx.rowcount(REVOKE_ADMIN, {"now": now})
        token = issue_token(tx, scope="admin", account_id=system["id"], label="admin reset", now=now)
    return {"token": token, "revoked": revoked}
