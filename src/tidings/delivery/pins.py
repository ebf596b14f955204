"""The pin sweep and live pin notices (consumer-thread code: ``Pins``, owned by the consumer).

At every session start, after the cursor sweep and before the owed mentions, the agent
gets the pins of each of its sweep-set channels as ``deliver`` with ``"pinned": true``,
channel by channel (channel id order), each channel's pins in position order, whatever
its cursors say: pins are a channel's standing instructions.

Stricter than the reference (which sends a message that is both owed by the cursor and
pinned twice): the pins are read when the session starts (``begin``), before its cursor
sweep, so a pinned message the cursor sweep delivers goes out once, in its cursor place,
already flagged ``pinned`` (``offer_swept``), and the pin step skips it. A pin of a deleted
message is not sent. A catch-up or overrun re-sweep re-runs the cursors only: pins still
pending (the queue filled during the pin step) are sent, sent ones never again.

Pinning or unpinning while a session is live sends it a ``pin`` notice (not a
``deliver``: a live post of a pinned message is still delivered exactly once).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import structlog

from ..counters import Counters
from ..faults import Faults
from ..hub.channels import public_message
from ..hub.events import PinsChanged
from ..store import delivery as delivery_store
from ..store import pins as pins_store
from ..store import sweep as sweep_store
from .link import Link
from .recipient import catch_up_dispatch, recipient
from .sessions import OFFER_CLOSED, OFFER_OK, Dispatch, Session

log = structlog.get_logger("tidings.delivery")

#: Fault point: the start's read of the pins fails (the session starts without its pins).
PIN_READ_FAULT = "delivery.pin_read_error"

_PENDING = "pins"  # session.extras key: {message_id: channel_id}, in send order


@dataclass(frozen=True, slots=True)
class PinNotice:
    """A live ``pin`` event: ``message_id`` was pinned (with the message) or unpinned."""

    channel_id: str
    message_id: str
    pinned: bool
    message: dict[str, Any] | None

    kind: ClassVar[str] = "pin"

    def payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "pin", "channel_id": self.channel_id, "message_id": self.message_id,
                               "pinned": self.pinned}
        if self.message is not None:
            out["message"] = self.message
        return out


class Pins:
    """The start's pins and the live pin notices, handed the consumer's connection
    (``Link``), its counters, faults and the live-session view."""

    def __init__(self, *, link: Link, counters: Counters, faults: Faults, live: dict[str, Session]) -> None:
        self.link = link
        self.counters = counters
        self.faults = faults
        self.live = live

    def begin(self, session: Session) -> None:
        """Read the pins this start owes the session (before its cursor sweep runs)."""
        pending: dict[str, str] = {}
        try:
            if self.faults.fire(PIN_READ_FAULT):
                raise RuntimeError("fault: delivery.pin_read_error")
            with self.link.db.read() as tx:
                for channel_id, message_id in pins_store.sweep_pins(tx, session.agent_id):
                    pending[message_id] = channel_id
        except Exception as exc:  # noqa: BLE001 - the session starts without its pins
            self.link.failed("pins not read at session start", exc, session_id=session.session_id)
        session.extras[_PENDING] = pending

    def sweep_pins(self, session: Session) -> bool:
        """Deliver the pins this start still owes; False when the queue filled first."""
        pending: dict[str, str] = session.extras.get(_PENDING) or {}
        if not pending:
            return True
        with self.link.db.read() as tx:
            rows = delivery_store.messages_by_ids(tx, list(pending))
            me = recipient(tx, session.agent_id)
        for message_id, channel_id in list(pending.items()):
            row = rows.get(message_id)
            if row is None or row["deleted_at_ms"] is not None:
                del pending[message_id]
                continue
            mentioned = catch_up_dispatch(row, me).mentions_you
            outcome = session.offer(Dispatch("deliver", public_message(row), channel_id, mentioned, pinned=True))
            if outcome != OFFER_OK:
                self.counters.incr("dispatch_refused")
                return outcome == OFFER_CLOSED
            self.counters.incr("pins_delivered")
            del pending[message_id]
        return True

    def on_pins_changed(self, event: PinsChanged) -> None:
        """Tell every live agent that follows the channel about a pin change."""
        with self.link.db.autocommit_read() as tx:
            agents = sweep_store.channel_agents(tx, event.channel_id)
            row = delivery_store.messages_by_ids(tx, [event.message_id]).get(event.message_id) if event.pinned else None
        message = public_message(row) if row is not None else None
        for agent in agents:
            session = self.live.get(agent.id)
            if session is None or not agent.in_sweep:
                continue
            if session.offer(PinNotice(event.channel_id, event.message_id, event.pinned, message)) == OFFER_OK:
                self.counters.incr("pin_notices")
            else:
                self.counters.incr("dispatch_refused")


def offer_swept(session: Session, dispatch: Dispatch) -> str:
    """The cursor sweep's dispatch: flagged ``pinned`` when this start still owes it as a
    pin, which it then no longer does."""
    pending: dict[str, str] = session.extras.get(_PENDING) or {}
    pinned = dispatch.message_id in pending
    if pinned:
        dispatch = replace(dispatch, pinned=True)
    outcome = session.offer(dispatch)
    if pinned and outcome == OFFER_OK:
        del pending[dispatch.message_id]
    return outcome
