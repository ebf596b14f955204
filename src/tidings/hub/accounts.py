"""Accounts: handle rules, agent creation with its home channel, and the bootstrap admin.

An agent is born with a home channel in the same transaction: the owner is a member but
unsubscribed, the agent is subscribed, and the agent's cursor is seeded at the (empty)
head, so the first message ever posted there is owed to it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import BadRequest, Conflict, NotFound
from ..ids import new_id
from ..store import accounts as accounts_store
from ..store import channels as channels_store
from ..store import cursors as cursors_store
from ..store import nodes as nodes_store
from ..store import owed as owed_store
from ..store.engine import Store, Tx, is_integrity_error
from .tokens import Principal, issue_token, register_token

#: The handle grammar, written once: lowercase letters, digits and ``._-``, starting with a
#: letter or digit. ``HANDLE_RE`` checks a handle; ``HANDLE_PATTERN`` is what a mention
#: matches after its ``@``; ``HANDLE_CHARS`` is the character class a slug keeps.
HANDLE_CHARS = "a-z0-9._-"
HANDLE_PATTERN = rf"[a-z0-9][{HANDLE_CHARS}]*"
HANDLE_RE = re.compile(rf"^{HANDLE_PATTERN}$")
RESERVED_HANDLES = frozenset({"everyone", "agents", "users", "tidings"})
SYSTEM_HANDLE = "tidings"
MAX_HANDLE = 64
MAX_DISPLAY_NAME = 200


def check_handle(handle: Any) -> str:
    """The one handle rule: grammar, length, reserved words. Raises BadRequest."""
    if not isinstance(handle, str) or not handle:
        raise BadRequest("handle is required", code="bad_handle")
    if len(handle) > MAX_HANDLE:
        raise BadRequest(f"handle is longer than {MAX_HANDLE} characters", code="bad_handle")
    if not HANDLE_RE.match(handle):
        raise BadRequest(
            f"handle {handle!r} must match ^[a-z0-9][a-z0-9._-]*$ (lowercase letters, digits, . _ -)",
            code="bad_handle",
        )
    if handle in RESERVED_HANDLES:
        raise BadRequest(f"handle {handle!r} is reserved", code="reserved_handle")
    return handle


def check_wake(wake: Any) -> str | None:
    """Validate a wake setting and return it as JSON text (None when absent)."""
    if wake is None:
        return None
    if not isinstance(wake, dict) or len(wake) != 1:
        raise BadRequest('wake must be {"webhook": url} or {"command": [argv...]}', code="bad_wake")
    if "webhook" in wake:
        url = wake["webhook"]
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise BadRequest("wake.webhook must be an http(s) URL", code="bad_wake")
    elif "command" in wake:
        argv = wake["command"]
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
            raise BadRequest("wake.command must be a non-empty list of strings", code="bad_wake")
    else:
        raise BadRequest('wake must be {"webhook": url} or {"command": [argv...]}', code="bad_wake")
    return json.dumps(wake)


@dataclass
class CreatedAccount:
    id: str
    kind: str
    handle: str
    display_name: str
    token: str
    home_channel_id: str | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "handle": self.handle,
            "display_name": self.display_name,
            "token": self.token,
        }
        if self.home_channel_id is not None:
            out["home_channel_id"] = self.home_channel_id
        return out


def create_account(
    store: Store,
    *,
    kind: Any,
    handle: Any,
    display_name: Any = None,
    owner: Any = None,
    wake: Any = None,
    created_by: str | None = None,
) -> CreatedAccount:
    """Create a human or agent account and its token; an agent also gets its home channel."""
    if kind not in ("human", "agent"):
        raise BadRequest('kind must be "human" or "agent"', code="bad_kind")
    handle = check_handle(handle)
    if display_name is None:
        display_name = handle
    if not isinstance(display_name, str) or len(display_name) > MAX_DISPLAY_NAME:
        raise BadRequest(f"display_name must be a string of at most {MAX_DISPLAY_NAME} characters")
    if kind == "human":
        if owner is not None:
            raise BadRequest("only agents have an owner", code="bad_owner")
        if wake is not None:
            raise BadRequest("only agents have a wake setting", code="bad_wake")
    wake_json = check_wake(wake) if kind == "agent" else None
    try:
        with store.write() as tx:
            now = store.now_ms()
            if accounts_store.handle_taken(tx, handle):
                raise Conflict(f"handle {handle!r} is taken", code="handle_taken")
            owner_id = None
            if kind == "agent":
                owner_id = _resolve_owner(tx, owner, created_by)
            account_id = new_id("acc")
            accounts_store.insert_account(
                tx,
                id=account_id,
                kind=kind,
                handle=handle,
                display_name=display_name,
                owner_id=owner_id,
                wake_json=wake_json,
                now=now,
            )
            home = None
            if kind == "agent":
                home = _create_home_channel(tx, account_id, handle, owner_id, now)
            token = issue_token(tx, scope="account", account_id=account_id, label=handle, now=now)
    except Conflict:
        raise
    except Exception as exc:
        if is_integrity_error(exc):  # a concurrent create took the handle first
            raise Conflict(f"handle {handle!r} is taken", code="handle_taken") from exc
        raise
    return CreatedAccount(account_id, kind, handle, display_name, token, home)


def _resolve_owner(tx: Tx, owner: Any, created_by: str | None) -> str:
    if owner is None:
        if created_by is None:
            raise BadRequest("an agent needs an owner", code="bad_owner")
        return created_by
    if not isinstance(owner, str):
        raise BadRequest("owner must be an account id", code="bad_owner")
    row = accounts_store.account(tx, owner)
    if row is None:
        raise NotFound(f"owner {owner!r} does not exist", code="unknown_owner")
    if row["kind"] == "agent":
        raise BadRequest("an agent cannot own another agent", code="bad_owner")
    return owner


def _create_home_channel(tx: Tx, agent_id: str, handle: str, owner_id: str, now: int) -> str:
    channel_id = new_id("ch")
    channels_store.insert_channel(
        tx,
        id=channel_id,
        name=handle,
        kind="home",
        post_policy="open",
        owner_account_id=owner_id,
        mandatory=False,
        created_by=owner_id,
        now=now,
    )
    channels_store.add_member(tx, channel_id, owner_id, False, now)
    channels_store.add_member(tx, channel_id, agent_id, True, now)
    cursors_store.seed_cursor(tx, agent_id, channel_id)
    accounts_store.set_home_channel(tx, agent_id, channel_id)
    return channel_id


def bootstrap(store: Store, admin_token: str | None = None) -> str | None:
    """Make sure the system account and an admin token exist.

    On a new database, creates the ``tidings`` system account and an admin token: the given
    one, else ``TIDINGS_ADMIN_TOKEN``, else a generated one. Returns the token only when it
    was generated here (so the caller prints it once); None otherwise.
    """
    chosen = admin_token or os.environ.get("TIDINGS_ADMIN_TOKEN") or None
    with store.write() as tx:
        nodes_store.serialize_bootstrap(tx)
        if accounts_store.admin_token_exists(tx):
            return None
        now = store.now_ms()
        system = accounts_store.account_by_handle(tx, SYSTEM_HANDLE)
        if system is None:
            system_id = new_id("acc")
            accounts_store.insert_account(
                tx,
                id=system_id,
                kind="system",
                handle=SYSTEM_HANDLE,
                display_name="Tidings",
                owner_id=None,
                wake_json=None,
                now=now,
            )
        else:
            system_id = system["id"]
        if chosen:
            register_token(tx, chosen, scope="admin", account_id=system_id, label="admin", now=now)
            return None
        return issue_token(tx, scope="admin", account_id=system_id, label="admin", now=now)


def system_account_id(store: Store) -> str:
    with store.read() as tx:
        row = accounts_store.account_by_handle(tx, SYSTEM_HANDLE)
    if row is None:
        raise NotFound("the system account does not exist yet; run bootstrap first")
    return row["id"]


def public_account(row: dict[str, Any]) -> dict[str, Any]:
    out = {
        "id": row["id"],
        "kind": row["kind"],
        "handle": row["handle"],
        "display_name": row["display_name"],
    }
    if row["kind"] == "agent":
        out["owner"] = row["owner_id"]
        out["home_channel_id"] = row["home_channel_id"]
    return out


def list_accounts(store: Store, handle: str | None = None) -> list[dict[str, Any]]:
    """Every account, public shape (the admin's listing); only the one with ``handle``
    (``alice`` or ``@alice``, D55) when given."""
    with store.read() as tx:
        rows = accounts_store.accounts(tx)
    if handle is not None:
        wanted = handle.removeprefix("@").casefold()
        rows = [r for r in rows if r["handle"] == wanted]
    return [public_account(r) for r in rows]


def account(store: Store, account_id: str) -> dict[str, Any] | None:
    """One account, public shape; None when unknown."""
    with store.read() as tx:
        row = accounts_store.account(tx, account_id)
    return None if row is None else public_account(row)


def hub_is_set_up(store: Store) -> bool:
    """True once ``bootstrap`` ran on this database (an admin token exists)."""
    with store.read() as tx:
        return accounts_store.admin_token_exists(tx)


def may_view_agent(who: Principal, agent: dict[str, Any]) -> bool:
    """The admin, the agent itself, or its owner (the rule of ``Delivery.owed``)."""
    return who.is_admin or (who.account_id is not None and who.account_id in (agent["id"], agent["owner_id"]))


def agents_overview(
    store: Store, who: Principal, is_live: Callable[[str], bool], cluster: Any = None
) -> list[dict[str, Any]]:
    """The agents ``who`` may view (``may_view_agent``), public shape, each with its
    owner's handle, whether it is live right now (``is_live``; with several nodes, live on
    any node, and ``node``: the node holding its session) and its open owed count."""
    with store.read() as tx:
        agents = [a for a in accounts_store.accounts(tx, "agent") if may_view_agent(who, a)]
        owners: dict[str, str | None] = {}
        for agent in agents:
            owner_id = agent["owner_id"]
            if owner_id and owner_id not in owners:
                row = accounts_store.account(tx, owner_id)
                owners[owner_id] = row["handle"] if row is not None else None
        owed = {agent["id"]: owed_store.count_owed(tx, agent["id"]) for agent in agents}
    out = []
    for agent in agents:
        item = public_account(agent)
        item["owner_handle"] = owners.get(agent["owner_id"]) if agent["owner_id"] else None
        item["live"] = is_live(agent["id"])
        if cluster is not None:  # several nodes: live anywhere, and which node holds the session
            item["live"] = item["live"] or cluster.remote_live(agent["id"])
            item["node"] = cluster.session_node(agent["id"]) if item["live"] else None
        item["owed"] = int(owed[agent["id"]] or 0)
        out.append(item)
    return out
