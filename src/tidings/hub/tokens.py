"""API tokens: minted once, shown once, stored as SHA-256 only.

Secrets carry 256 random bits, so a plain SHA-256 is enough to make the stored hash
useless to a reader of the database (no dictionary to attack), and it keeps the lookup a
single primary-key read per request.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from ..errors import Unauthorized
from ..store import accounts as accounts_store
from ..store.engine import Store, Tx

TOKEN_PREFIX = "tdg_"


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: an admin, an account (human or agent), or a bridge."""

    scope: str  # "admin" | "account" | "bridge"
    account_id: str | None
    bridge_id: str | None = None
    kind: str | None = None  # the account's kind for admin/account scopes

    @property
    def is_admin(self) -> bool:
        return self.scope == "admin"

    @property
    def is_agent(self) -> bool:
        return self.scope == "account" and self.kind == "agent"


def issue_token(
    tx: Tx, *, scope: str, account_id: str | None, bridge_id: str | None = None, label: str = "", now: int
) -> str:
    """Create a token in ``tx`` and return its secret (the only time it exists in clear)."""
    secret = new_token()
    accounts_store.insert_token(
        tx, token_hash=hash_token(secret), scope=scope, account_id=account_id, bridge_id=bridge_id, label=label, now=now
    )
    return secret


def register_token(tx: Tx, secret: str, *, scope: str, account_id: str | None, label: str, now: int) -> None:
    """Store a caller-chosen secret (``TIDINGS_ADMIN_TOKEN``) the same way as a minted one."""
    accounts_store.insert_token(
        tx, token_hash=hash_token(secret), scope=scope, account_id=account_id, bridge_id=None, label=label, now=now
    )


def authenticate(store: Store, secret: str | None) -> Principal:
    if not secret:
        raise Unauthorized("missing bearer token", code="missing_token")
    with store.read() as tx:
        row = accounts_store.token(tx, hash_token(secret))
    if row is None:
        raise Unauthorized("unknown or revoked token", code="bad_token")
    scope, account_id, bridge_id, kind = row
    return Principal(scope=scope, account_id=account_id, bridge_id=bridge_id, kind=kind)
