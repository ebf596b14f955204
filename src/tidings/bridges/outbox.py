"""Two-way bridges, hub side: what queues an outbox item, and the pull API a bridge drains.

Queueing runs inside the transaction of the change that causes it (``queue_post`` inside
the post's, ``queue_edit`` inside the edit's), so a committed post in a linked channel
always has its item and a rolled-back one never does. The link's own inbound posts (the
bridge account's) never queue anything: they came from that network. An agent's post is
queued with ``await_settle``: the bridge sees it only after its delivery pass ran, which for
a held mid-turn post is its turn's settle edge.

A bridge (its own token, or the admin) reads its pending items in order and reports each
one ``sent`` (with the network's id) or ``failed``: retryable (pending again after
``retry_after_ms`` or a backoff, up to ``MAX_ATTEMPTS``) or permanent (with a cause).
Reports are idempotent: an item in an end state answers with that state unchanged.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import structlog

from ..errors import BadRequest, Conflict, Forbidden, NotFound
from ..hub.events import MessageUpdated
from ..hub.tokens import Principal
from ..ids import new_id
from ..store import messages as messages_store
from ..store import outbox as outbox_store
from ..store.engine import Store, Tx
from ..store.outbox import OutboxKind, OutboxState
from ..store.sql import Stmt
from ..wakeups import WakeSignal
from . import echo

log = structlog.get_logger("tidings.outbox")

MAX_ATTEMPTS = 10
BASE_BACKOFF_MS = 1_000
MAX_BACKOFF_MS = 300_000
MAX_PULL = 100
MAX_WAIT_MS = 30_000
MAX_CAUSE = 500
MAX_REMOTE_ID = 200

_AUTHOR_KIND = Stmt("SELECT kind FROM accounts WHERE id = :id")
_BRIDGE_PLATFORM = Stmt("SELECT platform FROM bridges WHERE id = :id")
_BRIDGE = Stmt("SELECT id, platform, account_id FROM bridges WHERE id = :id")


KILL_AFTER_POST_COMMIT = "hub.kill_after_post_commit"


def kill_point(faults: Any, name: str) -> None:
    """A crash-test fault: when armed, this process dies with SIGKILL right here."""
    if faults is not None and faults.fire(name):
        log.warning("fault: killing this process", fault=name)
        os.kill(os.getpid(), signal.SIGKILL)


# Wakes this process's long polls when an item was committed (a hint only: a poll
# re-reads the store every ``POLL_MS`` anyway, which is what sees a settled turn).
SIGNAL = WakeSignal()


def item_id() -> str:
    return new_id("out")


# -- queueing (inside the hub change's own transaction) ------------------------------------
def queue_post(tx: Tx, *, message_id: str, channel_id: str, author_id: str, text: str, now: int) -> int:
    """One ``send`` item per conversation linked to the channel; returns how many."""
    targets = outbox_store.link_targets(tx, channel_id)
    if not targets:
        return 0
    tx.after_commit(SIGNAL.bump)
    kind = tx.scalar(_AUTHOR_KIND, {"id": author_id})
    queued = 0
    for bridge_id, conversation_id, bridge_account in targets:
        if author_id == bridge_account:
            continue  # the link's own inbound post: it came from that network
        outbox_store.insert_item(
            tx, id=item_id(), bridge_id=bridge_id, conversation_id=conversation_id, channel_id=channel_id,
            message_id=message_id, kind=OutboxKind.SEND, body=text, now=now, await_settle=kind == "agent",
        )
        queued += 1
    return queued


def queue_edit(tx: Tx, *, message_id: str, text: str, now: int) -> int:
    """An edit of a hub message: a sent item gets an ``edit`` of its network message; a
    still-pending one just sends the new text."""
    queued = 0
    tx.after_commit(SIGNAL.bump)
    for sent in outbox_store.sends_of_message(tx, message_id):
        if sent["state"] == OutboxState.PENDING:
            outbox_store.set_body(tx, sent["id"], text, now)
        elif sent["state"] == OutboxState.SENT:
            outbox_store.insert_item(
                tx, id=item_id(), bridge_id=sent["bridge_id"], conversation_id=sent["conversation_id"],
                channel_id=sent["channel_id"], message_id=message_id, kind=OutboxKind.EDIT, body=text, now=now,
                target_remote_id=sent["remote_id"],
            )
            queued += 1
    return queued


def queue_delete(tx: Tx, *, message_id: str, now: int) -> int:
    """A delete of a hub message: a sent item gets a ``delete``; a pending one fails."""
    queued = 0
    tx.after_commit(SIGNAL.bump)
    for sent in outbox_store.sends_of_message(tx, message_id):
        if sent["state"] == OutboxState.PENDING:
            outbox_store.mark_failed(tx, sent["id"], "deleted before it was sent", now)
        elif sent["state"] == OutboxState.SENT:
            outbox_store.insert_item(
                tx, id=item_id(), bridge_id=sent["bridge_id"], conversation_id=sent["conversation_id"],
                channel_id=sent["channel_id"], message_id=message_id, kind=OutboxKind.DELETE, body="", now=now,
                target_remote_id=sent["remote_id"],
            )
            queued += 1
    return queued


_LINKED_SOURCE = Stmt(
    "SELECT bm.bridge_id, bm.conversation_id, bm.remote_message_id FROM bridge_messages bm "
    "JOIN bridge_links l ON l.conversation_id = bm.conversation_id AND l.channel_id = :channel_id "
    "WHERE bm.id = :bridge_message_id"
)
MAX_EMOJI = 64


def react(store: Store, who: Principal, message_id: str, emoji: Any) -> int:
    """``who`` reacts to a message of a channel it may see: queue a ``react`` for each
    network the message lives on (a 400 ``not_bridged`` when none); how many items."""
    from ..hub import channels as channels_hub  # hub.channels reads this module's outbound state

    with store.write() as tx:
        row = messages_store.message(tx, message_id)
        if row is None:
            raise NotFound("unknown message", code="unknown_message")
        channels_hub.visible_channel(tx, who, row["channel_id"])
        queued = queue_react(tx, message=row, emoji=emoji, now=store.now_ms())
        if not queued:
            raise BadRequest("this message is not on any network (not bridged, or not sent yet)", code="not_bridged")
    return queued


def queue_react(tx: Tx, *, message: dict[str, Any], emoji: Any, now: int) -> int:
    """A reaction on a bridged hub message: on a message we sent (each sent item), or on a
    network message a link posted (its bridge message). Returns how many items."""
    if not isinstance(emoji, str) or not emoji.strip() or len(emoji) > MAX_EMOJI:
        raise BadRequest(f"emoji must be a non-empty string of at most {MAX_EMOJI} characters", code="bad_emoji")
    targets: list[tuple[str, str, str]] = [
        (sent["bridge_id"], sent["conversation_id"], sent["remote_id"])
        for sent in outbox_store.sends_of_message(tx, message["id"]) if sent["state"] == OutboxState.SENT
    ]
    crid = message.get("client_request_id") or ""
    prefix = f"link:{message['channel_id']}:"
    if crid.startswith(prefix):
        row = tx.one(_LINKED_SOURCE, {"channel_id": message["channel_id"], "bridge_message_id": crid[len(prefix):]})
        if row is not None:
            targets.append((row[0], row[1], row[2]))
    tx.after_commit(SIGNAL.bump)
    for bridge_id, conversation_id, target in targets:
        outbox_store.insert_item(
            tx, id=item_id(), bridge_id=bridge_id, conversation_id=conversation_id, channel_id=message["channel_id"],
            message_id=message["id"], kind=OutboxKind.REACT, body="", now=now, target_remote_id=target,
            emoji=emoji.strip(),
        )
    return len(targets)


# -- reading state for people ----------------------------------------------------------------
def public_item(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "seq": int(row["seq"]),
        "bridge_id": row["bridge_id"],
        "conversation_id": row["conversation_id"],
        "remote_conversation_id": row["remote_conversation_id"],
        "conversation_kind": row["conversation_kind"],
        "channel_id": row["channel_id"],
        "message_id": row["message_id"],
        "kind": row["kind"],
        "text": row["body"],
        "target_remote_id": row["target_remote_id"],
        "emoji": row["emoji"] or None,
        "state": row["state"],
        "attempts": int(row["attempts"]),
        "not_before_ms": int(row["not_before_ms"]),
        "remote_id": row["remote_id"],
        "cause": row["cause"],
        "echoed": row["echo_message_id"] is not None,
        "created_at_ms": int(row["created_at_ms"]),
        "updated_at_ms": int(row["updated_at_ms"]),
    }


def outbound_state(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per hub message: ``[{bridge_id, conversation_id, kind, state, remote_id, cause}]``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["message_id"], []).append({
            "bridge_id": row["bridge_id"], "conversation_id": row["conversation_id"], "kind": row["kind"],
            "state": row["state"], "remote_id": row["remote_id"], "cause": row["cause"],
            "attempts": int(row["attempts"]),
        })
    return out


def with_outbound(tx: Tx, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``outbound`` to each public message that has outbox items (in place); a message
    of a channel without links is left exactly as it was."""
    if not messages:
        return messages
    by_message = outbound_state(outbox_store.of_messages(tx, [m["id"] for m in messages]))
    for m in messages:
        if m["id"] in by_message:
            m["outbound"] = by_message[m["id"]]
    return messages


def linked_destinations(store: Store, channel_id: str) -> list[dict[str, Any]]:
    """Where a post in this channel goes: one entry per linked conversation."""
    with store.read() as tx:
        rows = tx.mappings(_DESTINATIONS, {"channel_id": channel_id})
    return rows


_DESTINATIONS = Stmt(
    "SELECT l.bridge_id, b.platform, b.name AS bridge_name, l.conversation_id, c.title, c.kind "
    "FROM bridge_links l JOIN bridges b ON b.id = l.bridge_id JOIN conversations c ON c.id = l.conversation_id "
    "WHERE l.channel_id = :channel_id ORDER BY l.bridge_id, l.conversation_id"
)


# -- the pull API -------------------------------------------------------------------------
def check_bridge_reader(who: Principal, bridge_id: str) -> None:
    """Only the bridge itself (its token) or the admin reads or reports its outbox."""
    if who.is_admin:
        return
    if who.scope != "bridge" or who.bridge_id != bridge_id:
        raise Forbidden("only this bridge's token may drain its outbox", code="not_this_bridge")


class Outbox:
    """Pull and report, for one store."""

    def __init__(self, store: Store, bus: Any = None) -> None:
        self.store = store
        self.bus = bus  # when given, a state change is published (the page shows it live)

    def bridge(self, bridge_id: str) -> dict[str, Any]:
        with self.store.read() as tx:
            row = tx.mapping(_BRIDGE, {"id": bridge_id})
        if row is None:
            raise NotFound("unknown bridge", code="unknown_bridge")
        return row

    def pending(self, bridge_id: str, *, after_seq: int = 0, limit: int = MAX_PULL) -> list[dict[str, Any]]:
        with self.store.read() as tx:
            rows = outbox_store.pending(tx, bridge_id, after_seq=after_seq, now=self.store.now_ms(), limit=limit)
        return [public_item(r) for r in rows]

    def typing(self, bridge_id: str) -> list[dict[str, Any]]:
        """Where an agent is working right now (a connector shows it as typing)."""
        with self.store.read() as tx:
            return outbox_store.typing(tx, bridge_id)

    def report(self, bridge_id: str, item_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Apply one report; answers the item as it now stands."""
        unknown = set(body) - {"state", "remote_id", "retryable", "retry_after_ms", "cause"}
        if unknown:
            raise BadRequest(f"unknown fields: {sorted(unknown)}", code="bad_report")
        state = body.get("state")
        if state not in (OutboxState.SENT, OutboxState.FAILED):
            raise BadRequest("state must be 'sent' or 'failed'", code="bad_report")
        remote_id = body.get("remote_id")
        cause = body.get("cause")
        retryable = body.get("retryable", False)
        retry_after = body.get("retry_after_ms")
        if state == OutboxState.SENT:
            if not isinstance(remote_id, str) or not remote_id.strip() or len(remote_id) > MAX_REMOTE_ID:
                raise BadRequest(f"a sent report needs remote_id (1 to {MAX_REMOTE_ID} characters)", code="bad_report")
        else:
            if not isinstance(cause, str) or not cause.strip() or len(cause) > MAX_CAUSE:
                raise BadRequest(f"a failed report needs a cause (1 to {MAX_CAUSE} characters)", code="bad_report")
            if not isinstance(retryable, bool):
                raise BadRequest("retryable must be a boolean", code="bad_report")
            if retry_after is not None and (
                isinstance(retry_after, bool) or not isinstance(retry_after, int) or not 0 <= retry_after <= 86_400_000
            ):
                raise BadRequest("retry_after_ms must be an integer from 0 to 86400000", code="bad_report")
        with self.store.write() as tx:
            row = outbox_store.item(tx, item_id)
            if row is None or row["bridge_id"] != bridge_id:
                raise NotFound("unknown outbox item", code="unknown_item")
            now = self.store.now_ms()
            if row["state"] != OutboxState.PENDING:
                if row["state"] != state or (state == OutboxState.SENT and row["remote_id"] != remote_id):
                    raise Conflict(f"the item is already {row['state']}", code="already_reported")
                return public_item(row)  # the same outcome again: idempotent
            if state == OutboxState.SENT:
                outbox_store.mark_sent(tx, item_id, remote_id, now)
                platform = tx.scalar(_BRIDGE_PLATFORM, {"id": bridge_id})
                echo.claim_on_report(tx, bridge_id=bridge_id, platform=platform, conversation_id=row["conversation_id"],
                                     item_id=item_id, remote_id=remote_id, now=now)
                outcome = "sent"
            elif retryable and int(row["attempts"]) + 1 < MAX_ATTEMPTS:
                delay = retry_after if retry_after is not None else backoff_ms(int(row["attempts"]))
                outbox_store.retry_later(tx, item_id, now + delay, cause, now)
                outcome = "retry"
            else:
                final = cause if not retryable else f"gave up after {MAX_ATTEMPTS} attempts: {cause}"
                outbox_store.mark_failed(tx, item_id, final, now)
                outcome = "failed"
            row = outbox_store.item(tx, item_id)
            if self.bus is not None and outcome != "retry":
                event = MessageUpdated(row["message_id"], row["channel_id"])
                tx.after_commit(lambda: self.bus.publish(event))
        log.info("outbox report", bridge_id=bridge_id, item_id=item_id, outcome=outcome, remote_id=remote_id,
                 cause=cause)
        return public_item(row)

    def one(self, bridge_id: str, item_id: str) -> dict[str, Any]:
        with self.store.read() as tx:
            row = outbox_store.item(tx, item_id)
        if row is None or row["bridge_id"] != bridge_id:
            raise NotFound("unknown outbox item", code="unknown_item")
        return public_item(row)

    def counts(self, bridge_id: str) -> dict[str, int]:
        with self.store.read() as tx:
            return outbox_store.counts(tx, bridge_id)


def backoff_ms(attempts: int) -> int:
    """Delay before the next try after ``attempts`` earlier tries (doubling, capped)."""
    return min(MAX_BACKOFF_MS, BASE_BACKOFF_MS * (2 ** min(attempts, 20)))


class ConnectorReports:
    """The last counters each bridge's connector published, per runtime (memory only)."""

    def put(self, runtime: Any, bridge_id: str, report: dict[str, Any]) -> None:
        reports = getattr(runtime, "connector_reports", None)
        if reports is None:
            reports = runtime.connector_reports = {}
        reports[bridge_id] = report

    def section(self, runtime: Any) -> dict[str, Any]:
        """``{bridge_id: {"connector": {...}, "outbox": {state: n}}}`` for ``/api/status``."""
        reports = dict(getattr(runtime, "connector_reports", None) or {})
        out: dict[str, Any] = {}
        with runtime.store.read() as tx:
            for (bridge_id,) in tx.all(_BRIDGES_WITH_OUTBOX, {}):
                out[bridge_id] = {"outbox": outbox_store.counts(tx, bridge_id)}
        for bridge_id, report in reports.items():
            out.setdefault(bridge_id, {})["connector"] = report
        return out


_BRIDGES_WITH_OUTBOX = Stmt("SELECT DISTINCT bridge_id FROM outbox ORDER BY bridge_id")
CONNECTORS = ConnectorReports()
