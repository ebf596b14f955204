"""Channels and membership: who may see, join, subscribe; cursor seeds ride each change.

Visibility: a channel is visible to its members and to the admin, and to nobody else; an
invisible channel answers 404, exactly like a missing one, so its existence never leaks.
Subscribing an agent (or adding it to a mandatory channel) seeds its cursor at the channel
head in the same transaction, so no message can fall between "became a target" and "has
a cursor".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..bridges import outbox
from ..bus import Stamped
from ..errors import BadRequest, Forbidden, NotFound
from ..ids import new_id
from ..params import int_param as _int_param
from ..store import accounts as accounts_store
from ..store import channels as channels_store
from ..store import cursors as cursors_store
from ..store import messages as messages_store
from ..store.engine import Store, Tx
from .events import MessagePosted, MessageUpdated, PinsChanged
from .tokens import Principal

MAX_CHANNEL_NAME = 80
MAX_LIST = 1000


def visible_channel(tx: Tx, principal: Principal, channel_id: Any) -> dict[str, Any]:
    """The channel row if ``principal`` may see it; NotFound otherwise (no existence leak).

    The admin sees every channel, a member its channels, and a person the channels one of
    its agents is a member of (D55: it may read them; acting as a member is 403
    ``not_a_member``)."""
    if not isinstance(channel_id, str):
        raise NotFound("unknown channel", code="unknown_channel")
    row = channels_store.channel(tx, channel_id)
    if row is None:
        raise NotFound("unknown channel", code="unknown_channel")
    if principal.is_admin:
        return row
    if principal.account_id is None:
        raise NotFound("unknown channel", code="unknown_channel")
    if channels_store.membership(tx, channel_id, principal.account_id) is None and not (
        principal.kind == "human" and channels_store.owns_an_agent_member(tx, channel_id, principal.account_id)
    ):
        raise NotFound("unknown channel", code="unknown_channel")
    return row


def require_member(tx: Tx, principal: Principal, channel_id: str) -> None:
    """A caller that can see the channel but is not in it: 403 ``not_a_member`` (D55)."""
    if principal.account_id is None or channels_store.membership(tx, channel_id, principal.account_id) is None:
        raise Forbidden("you can see this channel but are not a member of it", code="not_a_member")


def _id_list(value: Any, field: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise BadRequest(f"{field} must be a list of account ids", code="bad_members")
    return list(dict.fromkeys(value))


def _require_accounts(tx: Tx, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    found = {}
    for account_id in ids:
        row = accounts_store.account(tx, account_id)
        if row is None:
            raise NotFound(f"unknown account {account_id!r}", code="unknown_account")
        found[account_id] = row
    return found


def create_channel(
    store: Store, principal: Principal, *, name: Any, members: Any = None, mandatory_subscription: Any = False
) -> dict[str, Any]:
    if principal.scope == "bridge" or principal.account_id is None:
        raise Forbidden("bridges cannot create channels")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_CHANNEL_NAME:
        raise BadRequest(f"name must be a non-empty string of at most {MAX_CHANNEL_NAME} characters", code="bad_name")
    if not isinstance(mandatory_subscription, bool):
        raise BadRequest("mandatory_subscription must be a boolean")
    member_ids = _id_list(members, "members")
    with store.write() as tx:
        now = store.now_ms()
        rows = _require_accounts(tx, member_ids)
        for row in rows.values():
            check_may_enrol(principal, {"owner_account_id": principal.account_id}, row, already_member=False)
        channel_id = new_id("ch")
        channels_store.insert_channel(
            tx,
            id=channel_id,
            name=name.strip(),
            kind="channel",
            post_policy="open",
            owner_account_id=principal.account_id,
            mandatory=mandatory_subscription,
            created_by=principal.account_id,
            now=now,
        )
        for account_id in [principal.account_id, *member_ids]:
            channels_store.add_member(tx, channel_id, account_id, False, now)
            if mandatory_subscription and (account_id in rows and rows[account_id]["kind"] == "agent"):
                cursors_store.seed_cursor(tx, account_id, channel_id)
        channel = channels_store.channel(tx, channel_id)
    return public_channel(channel)


def update_members(store: Store, principal: Principal, channel_id: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Apply add / subscribe / unsubscribe / remove in one transaction.

    ``subscribe`` adds a non-member; ``add`` leaves an existing member's subscription alone.
    Subscribing an agent seeds its cursor at the head. Unsubscribing from a mandatory
    channel is refused (the channel delivers to every member whatever the flag says).
    """
    add = _id_list(body.get("add"), "add")
    subscribe = _id_list(body.get("subscribe"), "subscribe")
    unsubscribe = _id_list(body.get("unsubscribe"), "unsubscribe")
    remove = _id_list(body.get("remove"), "remove")
    unknown = set(body) - {"add", "subscribe", "unsubscribe", "remove"}
    if unknown:
        raise BadRequest(f"unknown fields: {sorted(unknown)}")
    if not (add or subscribe or unsubscribe or remove):
        raise BadRequest("nothing to do: give add, subscribe, unsubscribe or remove")
    with store.write() as tx:
        now = store.now_ms()
        channel = visible_channel(tx, principal, channel_id)
        cid = channel["id"]
        if add and not principal.is_admin:
            require_member(tx, principal, cid)
        rows = _require_accounts(tx, {*add, *subscribe, *unsubscribe, *remove})
        for account_id in {*subscribe, *unsubscribe, *remove}:
            _check_may_manage(tx, principal, channel, rows[account_id])
        for account_id in {*add, *subscribe}:
            member = channels_store.membership(tx, cid, account_id) is not None
            check_may_enrol(principal, channel, rows[account_id], already_member=member)
        for account_id in add:
            channels_store.add_member(tx, cid, account_id, False, now)
            if channel["mandatory_subscription"] and rows[account_id]["kind"] == "agent":
                cursors_store.seed_cursor(tx, account_id, cid)
        for account_id in subscribe:
            if not channels_store.add_member(tx, cid, account_id, True, now):
                channels_store.set_subscribed(tx, cid, account_id, True)
            cursors_store.seed_cursor(tx, account_id, cid)
        for account_id in unsubscribe:
            if channel["mandatory_subscription"]:
                raise BadRequest("cannot unsubscribe from a mandatory channel", code="mandatory_channel")
            if channels_store.membership(tx, cid, account_id) is None:
                raise NotFound(f"{account_id!r} is not a member", code="not_a_member")
            channels_store.set_subscribed(tx, cid, account_id, False)
        for account_id in remove:
            if _is_home_of(rows[account_id], cid):
                raise BadRequest("an agent cannot leave its home channel", code="home_channel")
            channels_store.remove_member(tx, cid, account_id)
        members = channels_store.members(tx, cid)
    return {"channel_id": cid, "members": [_public_member(m) for m in members]}


def _is_home_of(account: dict[str, Any], channel_id: str) -> bool:
    return account["kind"] == "agent" and account["home_channel_id"] == channel_id


def _check_may_manage(tx: Tx, principal: Principal, channel: dict[str, Any], target: dict[str, Any]) -> None:
    """Changing someone's subscription or membership: the admin, the channel owner, the
    account itself, or the owner of the agent."""
    if principal.is_admin:
        return
    if principal.account_id in (target["id"], channel["owner_account_id"], target.get("owner_id")):
        return
    raise Forbidden("you may only change your own (or your agents') subscriptions in this channel")


def check_may_enrol(principal: Principal, channel: dict[str, Any], target: dict[str, Any], *, already_member: bool) -> None:
    """Consent for agents (D42): an agent joins a channel only by the admin, or by a
    caller who owns both the agent and the channel; once a member, its subscription may
    be turned on by the admin, its owner or the agent itself. Humans: no extra rule."""
    if target["kind"] != "agent" or principal.is_admin:
        return
    if already_member:
        if principal.account_id in (target["id"], target.get("owner_id")):
            return
        raise Forbidden("only the agent's owner (or the agent) may subscribe it", code="agent_consent")
    if principal.account_id is not None and principal.account_id == target.get("owner_id") == channel["owner_account_id"]:
        return
    raise Forbidden(
        "only the admin, or whoever owns both the agent and the channel, may add an agent to a channel",
        code="agent_consent",
    )


def list_channels(store: Store, principal: Principal) -> list[dict[str, Any]]:
    with store.read() as tx:
        rows = channels_store.channels_of(tx, None if principal.is_admin else principal.account_id)
    return [public_channel(r) for r in rows]


def channel_members(store: Store, principal: Principal, channel_id: Any) -> list[dict[str, Any]]:
    with store.read() as tx:
        channel = visible_channel(tx, principal, channel_id)
        return [_public_member(m) for m in channels_store.members(tx, channel["id"])]


def list_messages(store: Store, principal: Principal, channel_id: Any, after_seq: Any, limit: Any) -> list[dict[str, Any]]:
    after = _int_param(after_seq, "after_seq", default=0, lo=0)
    lim = _int_param(limit, "limit", default=100, lo=1, hi=MAX_LIST)
    with store.read() as tx:
        channel = visible_channel(tx, principal, channel_id)
        rows = messages_store.messages_after(tx, channel["id"], after, lim)
        from .attachments import public_channel_messages  # (hub.attachments imports this module)

        return outbox.with_outbound(tx, public_channel_messages(tx, rows))


def public_channel(row: dict[str, Any]) -> dict[str, Any]:
    out = {
        "id": row["id"],
        "name": row["name"],
        "kind": row["kind"],
        "post_policy": row["post_policy"],
        "mandatory_subscription": bool(row["mandatory_subscription"]),
        "owner_account_id": row["owner_account_id"],
        "head_seq": row["last_seq"],
        "created_at_ms": row["created_at_ms"],
    }
    if row.get("subscribed") is not None:
        out["subscribed"] = bool(row["subscribed"])
    return out


def _public_member(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "account_id": row["id"],
        "kind": row["kind"],
        "handle": row["handle"],
        "subscribed": bool(row["subscribed"]),
    }


def public_message(row: dict[str, Any]) -> dict[str, Any]:
    """The contract's Message shape. ``seq`` is the per-channel, gap-free ``channel_seq``."""
    out = {
        "id": row["id"],
        "seq": row["channel_seq"],
        "global_seq": row["seq"],
        "channel_id": row["channel_id"],
        "topic_id": row["topic_id"],
        "author_account_id": row["author_account_id"],
        "at_unix_ms": row["at_unix_ms"],
        "blocks": row["blocks"],
        "text": row["text"],
    }
    if row.get("occurred_at_ms") is not None:
        out["occurred_at_ms"] = row["occurred_at_ms"]  # the network time (a linked message)
    if row.get("edited_at_ms") is not None:
        out["edited_at_ms"] = row["edited_at_ms"]
    if row.get("deleted_at_ms") is not None:
        out["deleted"] = True
    return out


def channels_of_account(tx: Tx, account_id: str | None) -> list[dict[str, Any]]:
    """Rows of the channels ``account_id`` belongs to (all channels for None)."""
    return channels_store.channels_of(tx, account_id)


def get_message(store: Store, principal: Principal, message_id: str) -> dict[str, Any]:
    """A message of a channel ``principal`` may see, public shape with its attachments and
    outbound state; 404 otherwise."""
    from .attachments import public_channel_messages  # attachments builds on this module

    with store.read() as tx:
        row = messages_store.message(tx, message_id)
        if row is None:
            raise NotFound("unknown message", code="unknown_message")
        visible_channel(tx, principal, row["channel_id"])
        (message,) = public_channel_messages(tx, [row])
        return outbox.with_outbound(tx, [message])[0]


def visible_events(store: Store, who: Principal, batch: list[Stamped]) -> list[dict[str, Any]]:
    """The page events of ``batch`` that ``who`` may see, with the messages read from the store."""
    out: list[dict[str, Any]] = []
    with store.read() as tx:
        seen: dict[str, bool] = {}
        for stamped in batch:
            event = stamped.payload
            if not isinstance(event, (MessagePosted, MessageUpdated, PinsChanged)):
                continue
            channel_id = event.channel_id
            if channel_id not in seen:
                try:
                    visible_channel(tx, who, channel_id)
                    seen[channel_id] = True
                except NotFound:
                    seen[channel_id] = False
            if not seen[channel_id]:
                continue
            if isinstance(event, PinsChanged):  # the page re-reads the channel's pins
                out.append({"page_event": "pins", "channel_id": channel_id, "message_id": event.message_id,
                            "pinned": event.pinned, "bus_seq": stamped.seq})
                continue
            row = messages_store.message(tx, event.message_id)
            if row is None:
                continue
            out.append(
                {
                    "event": "posted" if isinstance(event, MessagePosted) else "updated",
                    "channel_id": channel_id,
                    "message": outbox.with_outbound(tx, [public_message(row)])[0],
                    "bus_seq": stamped.seq,
                }
            )
    return out
