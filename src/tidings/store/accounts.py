"""Accounts (human, agent, system) and API tokens: rows only, no policy."""

from __future__ import annotations

from typing import Any

from .engine import Tx
from .sql import Stmt

ACCOUNT_COLUMNS = "id, kind, handle, display_name, owner_id, home_channel_id, wake_json, created_at_ms"

INSERT_ACCOUNT = Stmt(
    "INSERT INTO accounts (id, kind, handle, display_name, owner_id, wake_json, created_at_ms) "
    "VALUES (:id, :kind, :handle, :display_name, :owner_id, :wake_json, :now)",
    name="insert_account",
)
HANDLE_TAKEN = Stmt("SELECT 1 FROM accounts WHERE handle = :handle", name="handle_taken")
ACCOUNT_BY_ID = Stmt(f"SELECT {ACCOUNT_COLUMNS} FROM accounts WHERE id = :id", name="account_by_id")
ACCOUNT_BY_HANDLE = Stmt(f"SELECT {ACCOUNT_COLUMNS} FROM accounts WHERE handle = :handle", name="account_by_handle")
ACCOUNTS_BY_KIND = Stmt(f"SELECT {ACCOUNT_COLUMNS} FROM accounts WHERE kind = :kind ORDER BY handle", name="accounts_by_kind")
ALL_ACCOUNTS = Stmt(f"SELECT {ACCOUNT_COLUMNS} FROM accounts ORDER BY handle", name="all_accounts")
SET_HOME_CHANNEL = Stmt("UPDATE accounts SET home_channel_id = :channel_id WHERE id = :id", name="set_home_channel")

INSERT_TOKEN = Stmt(
    "INSERT INTO api_tokens (token_hash, scope, account_id, bridge_id, label, created_at_ms) "
    "VALUES (:token_hash, :scope, :account_id, :bridge_id, :label, :now)",
    name="insert_token",
)
TOKEN_BY_HASH = Stmt(
    "SELECT t.scope, t.account_id, t.bridge_id, a.kind FROM api_tokens t "
    "LEFT JOIN accounts a ON a.id = t.account_id "
    "WHERE t.token_hash = :token_hash AND t.revoked_at_ms IS NULL",
    name="token_by_hash",
)
ADMIN_TOKEN_EXISTS = Stmt("SELECT 1 FROM api_tokens WHERE scope = 'admin' LIMIT 1", name="admin_token_exists")


def insert_account(
    tx: Tx,
    *,
    id: str,
    kind: str,
    handle: str,
    display_name: str,
    owner_id: str | None,
    wake_json: str | None,
    now: int,
) -> None:
    tx.execute(
        INSERT_ACCOUNT,
        {
            "id": id,
            "kind": kind,
            "handle": handle,
            "display_name": display_name,
            "owner_id": owner_id,
            "wake_json": wake_json,
            "now": now,
        },
    )


def handle_taken(tx: Tx, handle: str) -> bool:
    return tx.one(HANDLE_TAKEN, {"handle": handle}) is not None


def account(tx: Tx, account_id: str) -> dict[str, Any] | None:
    return tx.mapping(ACCOUNT_BY_ID, {"id": account_id})


def account_by_handle(tx: Tx, handle: str) -> dict[str, Any] | None:
    return tx.mapping(ACCOUNT_BY_HANDLE, {"handle": handle})


def accounts(tx: Tx, kind: str | None = None) -> list[dict[str, Any]]:
    if kind is None:
        return tx.mappings(ALL_ACCOUNTS)
    return tx.mappings(ACCOUNTS_BY_KIND, {"kind": kind})


def set_home_channel(tx: Tx, account_id: str, channel_id: str) -> None:
    tx.execute(SET_HOME_CHANNEL, {"id": account_id, "channel_id": channel_id})


def insert_token(
    tx: Tx,
    *,
    token_hash: str,
    scope: str,
    account_id: str | None,
    bridge_id: str | None,
    label: str,
    now: int,
) -> None:
    tx.execute(
        INSERT_TOKEN,
        {
            "token_hash": token_hash,
            "scope": scope,
            "account_id": account_id,
            "bridge_id": bridge_id,
            "label": label,
            "now": now,
        },
    )


def token(tx: Tx, token_hash: str) -> tuple[Any, ...] | None:
    """(scope, account_id, bridge_id, account_kind) of a live token, or None."""
    return tx.one(TOKEN_BY_HASH, {"token_hash": token_hash})


def admin_token_exists(tx: Tx) -> bool:
    return tx.one(ADMIN_TOKEN_EXISTS) is not None
