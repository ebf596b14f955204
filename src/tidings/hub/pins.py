"""Channel pins: list, pin, unpin.

Members of a channel (and the admin) read its pins; only the channel owner and the admin
change them. A channel holds at most ``MAX_PINS`` pins, ordered by position (a new pin goes
last); one more is a 409 ``too_many_pins`` and changes nothing. Pinning a pinned message
and unpinning an unpinned one are no-ops that publish nothing. Every change commits, then
publishes ``PinsChanged`` (live agent sessions get a ``pin`` event, the page refreshes).
"""

from __future__ import annotations

from typing import Any

import structlog

from ..bus import Bus
from ..errors import Conflict, Forbidden, NotFound
from ..store import messages as messages_store
from ..store import pins as pins_store
from ..store.engine import Store, Tx
from .channels import public_message, visible_channel
from .events import PinsChanged
from .tokens import Principal

log = structlog.get_logger("tidings.pins")

MAX_PINS = 5


def public_pin(row: dict[str, Any]) -> dict[str, Any]:
    """A pin as the API shows it: the pinned message in full plus who pinned it when."""
    return {
        "message_id": row["id"],
        "position": row["pin_position"],
        "pinned_at_ms": row["pin_at_ms"],
        "pinned_by": row["pin_by"],
        "message": public_message(row),
    }


def _pins(tx: Tx, channel_id: str) -> list[dict[str, Any]]:
    return [public_pin(row) for row in pins_store.pinned_messages(tx, channel_id)]


def list_pins(store: Store, principal: Principal, channel_id: Any) -> dict[str, Any]:
    with store.read() as tx:
        channel = visible_channel(tx, principal, channel_id)
        return {"channel_id": channel["id"], "pins": _pins(tx, channel["id"])}


def _may_change(principal: Principal, channel: dict[str, Any]) -> None:
    if principal.is_admin or (principal.account_id is not None and principal.account_id == channel["owner_account_id"]):
        return
    raise Forbidden("only the channel owner or the admin may change pins", code="not_channel_owner")


def _message_in(tx: Tx, channel_id: str, message_id: Any) -> dict[str, Any]:
    row = messages_store.message(tx, message_id) if isinstance(message_id, str) else None
    if row is None or row["channel_id"] != channel_id:
        raise NotFound("unknown message in this channel", code="unknown_message")
    return row


def _locked_for_change(tx: Tx, principal: Principal, channel_id: Any, message_id: Any) -> tuple[str, dict[str, Any]]:
    """The channel id and the message row of a pin change the caller may make, with the
    channel's pin lock held for the rest of ``tx`` (the one prologue of pin and unpin)."""
    channel = visible_channel(tx, principal, channel_id)
    _may_change(principal, channel)
    cid = channel["id"]
    pins_store.lock_channel(tx, cid)
    return cid, _message_in(tx, cid, message_id)


def pin(store: Store, bus: Bus, principal: Principal, channel_id: Any, message_id: Any) -> dict[str, Any]:
    """Pin a message of the channel last; idempotent; 409 past ``MAX_PINS``."""
    with store.write() as tx:
        cid, row = _locked_for_change(tx, principal, channel_id, message_id)
        created = False
        if not pins_store.is_pinned(tx, cid, row["id"]):
            if row["deleted_at_ms"] is not None:
                raise Conflict("a deleted message cannot be pinned", code="message_deleted")
            if pins_store.count_pins(tx, cid) >= MAX_PINS:
                raise Conflict(f"a channel holds at most {MAX_PINS} pins; unpin one first", code="too_many_pins")
            by = principal.account_id or ""
            pins_store.add_pin(tx, cid, row["id"], by, store.now_ms())
            created = True
            event = PinsChanged(cid, row["id"], True)
            tx.after_commit(lambda: bus.publish(event))
        pins = _pins(tx, cid)
    if created:
        log.info("pinned", channel_id=cid, message_id=row["id"], by=principal.account_id)
    return {"channel_id": cid, "message_id": row["id"], "pinned": True, "created": created, "pins": pins}


def unpin(store: Store, bus: Bus, principal: Principal, channel_id: Any, message_id: Any) -> dict[str, Any]:
    """Remove a pin; idempotent (``removed`` says whether there was one)."""
    with store.write() as tx:
        cid, row = _locked_for_change(tx, principal, channel_id, message_id)
        removed = pins_store.remove_pin(tx, cid, row["id"])
        if removed:
            event = PinsChanged(cid, row["id"], False)
            tx.after_commit(lambda: bus.publish(event))
        pins = _pins(tx, cid)
    if removed:
        log.info("unpinned", channel_id=cid, message_id=row["id"], by=principal.account_id)
    return {"channel_id": cid, "message_id": row["id"], "pinned": False, "removed": removed, "pins": pins}
