"""``tidings admin …``: accounts, channels and members, bridges, links and tokens, from the
command line, against a running hub (``--url`` + the admin token, over HTTP) or against
the database itself (``--db``). Both sides run the same ``hub/`` use cases: over HTTP the
routes call them, with ``--db`` this module calls them with the admin principal.

Every command prints JSON (secrets, such as a new token, appear once). Errors are one line
on stderr and exit 1 (2 for usage).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

admin_app = typer.Typer(help="Administer a hub: accounts, channels, members, bridges, links, tokens.",
                        no_args_is_help=True)
accounts_app = typer.Typer(help="Accounts: create, list, show, token reset.", no_args_is_help=True)
channels_app = typer.Typer(help="Channels: create, list.", no_args_is_help=True)
members_app = typer.Typer(help="Channel members: add, remove, list.", no_args_is_help=True)
bridges_app = typer.Typer(help="Bridges: create, list, token reset.", no_args_is_help=True)
links_app = typer.Typer(help="Links from a bridge conversation into a channel: create, list.", no_args_is_help=True)
for sub, name in ((accounts_app, "accounts"), (channels_app, "channels"), (members_app, "members"),
                  (bridges_app, "bridges"), (links_app, "links")):
    admin_app.add_typer(sub, name=name)

out = Console()
err = Console(stderr=True)

UrlOpt = typer.Option(None, "--url", help="A running hub's base URL (with the admin token).")
TokenOpt = typer.Option(None, "--token", help="With --url: the admin token (env TIDINGS_ADMIN_TOKEN).")
DbOpt = typer.Option(None, "--db", help="The database itself: SQLite path or postgresql:// URL (env TIDINGS_DB).")

EXAMPLES = {
    "admin token": "tidings admin token --reset --db ./tidings.db",
    "admin accounts create": "tidings admin accounts create --kind agent --handle helper --owner acc_... --url http://127.0.0.1:7860",
    "admin accounts list": "tidings admin accounts list --db ./tidings.db",
    "admin accounts show": "tidings admin accounts show acc_... --url http://127.0.0.1:7860",
    "admin accounts token-reset": "tidings admin accounts token-reset acc_... --db ./tidings.db",
    "admin channels create": "tidings admin channels create ops --member acc_... --db ./tidings.db",
    "admin channels list": "tidings admin channels list --url http://127.0.0.1:7860",
    "admin members add": "tidings admin members add ch_... acc_... --subscribe --db ./tidings.db",
    "admin members remove": "tidings admin members remove ch_... acc_... --db ./tidings.db",
    "admin members list": "tidings admin members list ch_... --db ./tidings.db",
    "admin bridges create": "tidings admin bridges create --platform signal --name phone --owner acc_... --db ./tidings.db",
    "admin bridges list": "tidings admin bridges list --url http://127.0.0.1:7860",
    "admin bridges token-reset": "tidings admin bridges token-reset br_... --db ./tidings.db",
    "admin links create": "tidings admin links create br_... conv_... ch_... --db ./tidings.db",
    "admin links list": "tidings admin links list br_... --db ./tidings.db",
}


class Failed(Exception):
    pass


# -- the two ways in ------------------------------------------------------------------------
class HttpHub:
    """The running hub's HTTP API, with the admin token."""

    def __init__(self, url: str, token: str) -> None:
        import httpx

        self.http = httpx.Client(base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import httpx

        try:
            r = self.http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise Failed(f"cannot reach the hub: {exc}") from None
        if r.status_code >= 400:
            try:
                error = r.json()["error"]
                raise Failed(f"{r.status_code} {error['code']}: {error['message']}")
            except (ValueError, KeyError, TypeError):
                raise Failed(f"{r.status_code}: {r.text[:200]}") from None
        return r.json()

    def close(self) -> None:
        self.http.close()


class DbHub:
    """The database itself, through the hub's use cases as the admin."""

    def __init__(self, url: str) -> None:
        from . import dbfiles
        from .hub import accounts as accounts_hub
        from .hub.tokens import Principal
        from .store.engine import Store

        if not dbfiles.existed(url):
            raise Failed(f"no database at {url}")
        self.store = Store(url)
        try:
            self.admin = Principal(scope="admin", account_id=accounts_hub.system_account_id(self.store), kind="system")
        except Exception:  # noqa: BLE001 - any failure here means no hub in this database
            self.store.dispose()
            raise Failed("this database has no hub yet (start it once with tidings serve)") from None

    def close(self) -> None:
        self.store.dispose()


def _hub(url: str | None, token: str | None, db: str | None) -> HttpHub | DbHub:
    if url and db:
        raise Failed("give either --url (a running hub) or --db (the database), not both")
    if url:
        token = token or os.environ.get("TIDINGS_ADMIN_TOKEN")
        if not token:
            raise Failed("--url needs the admin --token (or TIDINGS_ADMIN_TOKEN)")
        return HttpHub(url, token)
    db = db or os.environ.get("TIDINGS_DB")
    if not db:
        raise Failed("give --url (a running hub) or --db (the database)")
    return DbHub(db)


def _run(url: str | None, token: str | None, db: str | None,
         over_http: Callable[[HttpHub], Any], on_db: Callable[[DbHub], Any]) -> None:
    from .errors import TidingsError

    hub = None
    try:
        hub = _hub(url, token, db)
        result = over_http(hub) if isinstance(hub, HttpHub) else on_db(hub)
    except Failed as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    except TidingsError as exc:
        err.print(f"error: {exc.status} {exc.code}: {exc.message}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    finally:
        if hub is not None:
            hub.close()
    out.print_json(json.dumps(result))


# -- tokens ---------------------------------------------------------------------------------
@admin_app.command("token")
def admin_token(
    reset: bool = typer.Option(False, "--reset", help="Revoke every admin token and issue a new one."),
    url: str | None = UrlOpt, token: str | None = TokenOpt, db: str | None = DbOpt,
) -> None:
    """Issue a new admin token (all earlier ones stop working); --db works when the old one is lost."""
    if not reset:
        err.print("error: say --reset to revoke every admin token and issue a new one", markup=False)
        raise typer.Exit(2)
    from .hub import token_admin

    _run(url, token, db, lambda h: h.call("POST", "/api/v1/admin/token"),
         lambda h: token_admin.reset_admin_token(h.store))


# -- accounts -------------------------------------------------------------------------------
@accounts_app.command("create")
def accounts_create(
    kind: str = typer.Option(..., "--kind", help="human or agent."),
    handle: str = typer.Option(..., "--handle", help="The @handle."),
    owner: str | None = typer.Option(None, "--owner", help="An agent's owner (account id)."),
    display_name: str | None = typer.Option(None, "--display-name", help="A display name."),
    url: str | None = UrlOpt, token: str | None = TokenOpt, db: str | None = DbOpt,
) -> None:
    """Create an account; prints it with its token (shown once)."""
    from .hub import accounts as accounts_hub

    body = {"kind": kind, "handle": handle, **({"owner": owner} if owner else {}),
            **({"display_name": display_name} if display_name else {})}
    _run(url, token, db, lambda h: h.call("POST", "/api/v1/accounts", body),
         lambda h: accounts_hub.create_account(h.store, created_by=h.admin.account_id, **body).as_json())


@accounts_app.command("list")
def accounts_list(url: str | None = UrlOpt, token: str | None = TokenOpt, db: str | None = DbOpt) -> None:
    """List every account."""
    from .hub import accounts as accounts_hub
    from .store import accounts as accounts_store

    def on_db(h: DbHub) -> Any:
        with h.store.read() as tx:
            return {"accounts": [accounts_hub.public_account(r) for r in accounts_store.accounts(tx)]}

    _run(url, token, db, lambda h: h.call("GET", "/api/v1/accounts"), on_db)


@accounts_app.command("show")
def accounts_show(account_id: str = typer.Argument(..., help="The account id."),
                  url: str | None = UrlOpt, token: str | None = TokenOpt, db: str | None = DbOpt) -> None:
    """Show one account."""
    from .hub import token_admin

    _run(url, token, db, lambda h: h.call("GET", f"/api/v1/accounts/{account_id}"),
         lambda h: token_admin.show_account(h.store, account_id))


@accounts_app.command("token-reset")
def accounts_token_reset(account_id: str = typer.Argument(..., help="The account id."),
                         url: str | None = UrlOpt, token: str | None = TokenOpt,
                         db: str | None = DbOpt) -> None:
    """Revoke an account's tokens and issue a new one (shown once)."""
    from .hub import token_admin

    _run(url, token, db, lambda h: h.call("POST", f"/api/v1/accounts/{account_id}/token"),
         lambda h: token_admin.reset_account_token(h.store, account_id))


# -- channels and members -------------------------------------------------------------------
@channels_app.command("create")
def channels_create(
    name: str = typer.Argument(..., help="The channel's name."),
    member: list[str] | None = typer.Option(None, "--member", help="An account id to add; repeatable."),
    url: str | None = UrlOpt, token: str | None = TokenOpt, db: str | None = DbOpt,
) -> None:
    """Create a channel (owned by the hub's system account) with members."""
    from .hub import channels as channels_hub

    members = list(member or [])
    _run(url, token, db, lambda h: h.call("POST", "/api/v1/channels", {"name": name, "members": members}),
         lambda h: channels_hub.create_channel(h.store, h.admin, name=name, members=members))


@channels_app.command("list")
def channels_list(url: str | None = UrlOpt, token: str | None = TokenOpt, db: str | None = DbOpt) -> None:
    """List every channel."""
    from .hub import channels as channels_hub

    _run(url, token, db, lambda h: h.call("GET", "/api/v1/channels"),
         lambda h: {"channels": channels_hub.list_channels(h.store, h.admin)})


def _members(channel_id: str, body: dict[str, Any], url, token, db) -> None:
    from .hub import channels as channels_hub

    _run(url, token, db, lambda h: h.call("POST", f"/api/v1/channels/{channel_id}/members", body),
         lambda h: channels_hub.update_members(h.store, h.admin, channel_id, body))


@members_app.command("add")
def members_add(
    channel_id: str = typer.Argument(..., help="The channel id."),
    account_ids: list[str] = typer.Argument(..., help="Account ids to add."),
    subscribe: bool = typer.Option(False, "--subscribe", help="Also subscribe them (agents get deliveries)."),
    url: str | None = UrlOpt, token: str | None = TokenOpt, db: str | None = DbOpt,
) -> None:
    """Add accounts to a channel (as the admin, so agents may be added too)."""
    _members(channel_id, {"subscribe" if subscribe else "add": account_ids}, url, token, db)


@members_app.command("remove")
def members_remove(
    channel_id: str = typer.Argument(..., help="The channel id."),
    account_ids: list[str] = typer.Argument(..., help="Account ids to remove."),
    url: str | None = UrlOpt, token: str | None = TokenOpt, db: str | None = DbOpt,
) -> None:
    """Remove accounts from a channel."""
    _members(channel_id, {"remove": account_ids}, url, token, db)


@members_app.command("list")
def members_list(channel_id: str = typer.Argument(..., help="The channel id."),
                 url: str | None = UrlOpt, token: str | None = TokenOpt, db: str | None = DbOpt) -> None:
    """List a channel's members."""
    from .hub import channels as channels_hub

    _run(url, token, db, lambda h: h.call("GET", f"/api/v1/channels/{channel_id}/members"),
         lambda h: {"members": channels_hub.channel_members(h.store, h.admin, channel_id)})


# -- bridges and links ----------------------------------------------------------------------
@bridges_app.command("create")
def bridges_create(
    platform: str = typer.Option(..., "--platform", help="signal, whatsapp or google."),
    name: str = typer.Option(..., "--name", help="A name for the bridge."),
    owner: str | None = typer.Option(None, "--owner", help="The owning human's account id."),
    url: str | None = UrlOpt, token: str | None = TokenOpt, db: str | None = DbOpt,
) -> None:
    """Create a bridge; prints it with its token (shown once)."""
    from .bridges import registry as bridges_hub

    body = {"platform": platform, "name": name, **({"owner": owner} if owner else {})}
    _run(url, token, db, lambda h: h.call("POST", "/api/v1/bridges", body),
         lambda h: bridges_hub.create_bridge(h.store, **body))


@bridges_app.command("list")
def bridges_list(url: str | None = UrlOpt, token: str | None = TokenOpt, db: str | None = DbOpt) -> None:
    """List every bridge with its backlog and quarantined count."""
    from .bridges import registry as bridges_hub

    _run(url, token, db, lambda h: h.call("GET", "/api/v1/bridges"),
         lambda h: {"bridges": bridges_hub.list_bridges(h.store, h.admin)})


@bridges_app.command("token-reset")
def bridges_token_reset(bridge_id: str = typer.Argument(..., help="The bridge id."),
                        url: str | None = UrlOpt, token: str | None = TokenOpt,
                        db: str | None = DbOpt) -> None:
    """Revoke a bridge's tokens and issue a new one (shown once)."""
    from .hub import token_admin

    _run(url, token, db, lambda h: h.call("POST", f"/api/v1/bridges/{bridge_id}/token"),
         lambda h: token_admin.reset_bridge_token(h.store, bridge_id))


@links_app.command("create")
def links_create(
    bridge_id: str = typer.Argument(..., help="The bridge id."),
    conversation_id: str = typer.Argument(..., help="The bridge conversation id."),
    channel_id: str = typer.Argument(..., help="The channel its messages go to."),
    url: str | None = UrlOpt, token: str | None = TokenOpt, db: str | None = DbOpt,
) -> None:
    """Link a bridge conversation into a channel (idempotent)."""
    from .bridges.links import Links

    body = {"conversation_id": conversation_id, "channel_id": channel_id}
    _run(url, token, db, lambda h: h.call("POST", f"/api/v1/bridges/{bridge_id}/links", body),
         lambda h: Links(_StoreOnly(h.store)).link(h.admin, bridge_id, body))


@links_app.command("list")
def links_list(bridge_id: str = typer.Argument(..., help="The bridge id."),
               url: str | None = UrlOpt, token: str | None = TokenOpt, db: str | None = DbOpt) -> None:
    """List a bridge's links."""
    from .bridges.links import Links

    _run(url, token, db, lambda h: h.call("GET", f"/api/v1/bridges/{bridge_id}/links"),
         lambda h: {"links": Links(_StoreOnly(h.store)).links(bridge_id)})


class _StoreOnly:
    """What ``Links`` needs of a runtime when no hub process runs: the store."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.posting = None
