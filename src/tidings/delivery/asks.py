"""Answers to asks, delivered to the asking agent (consumer-thread code: ``Answers``).

The no-loss rule is the owed mentions' one. The answer's ``ask_answers`` row commits with
the answer itself and stays owed until the agent acks it (``POST /api/v1/ack`` with
``message_id`` and ``ask_id``); what the consumer adds is the dispatch:

* ``on_answered`` (the ``AskAnswered`` bus event): a live asker gets an ``answer`` event
  now; an offline one is woken, and its next session start sends the answer
  (``sweep_answers``, after the owed mentions). Either way the row is then marked
  dispatched.
* ``scan_undispatched`` (part of every recovery scan: at start, after an overrun,
  periodically) dispatches every row a crash or a lost publish left undispatched.

A session is sent each answer at most once (``session.extras``), however many of these
paths reach it; a new session gets every answer still owed, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import structlog

from ..clock import Clock
from ..counters import Counters
from ..hub.channels import public_message
from ..hub.events import AskAnswered
from ..store import accounts as accounts_store
from ..store import asks as asks_store
from ..store import delivery as delivery_store
from .link import Link
from .routing import catch_up
from .sessions import OFFER_CLOSED, OFFER_FULL, OFFER_OK, Offer, Session
from .wakers import WakeRequests

log = structlog.get_logger("tidings.delivery")

_SENT = "answers_sent"  # session.extras key: {(message_id, ask_id)}
SWEEP_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class AnswerDispatch:
    """An ``answer`` event: the asker's message (its ask block now answered) and the answer."""

    message: dict[str, Any]
    channel_id: str
    ask_id: str
    answered_by: str
    answered_at_ms: int
    answers: dict[str, str]

    kind: ClassVar[str] = "answer"

    @property
    def message_id(self) -> str:
        return str(self.message["id"])

    def payload(self) -> dict[str, Any]:
        return {
            "type": "answer",
            "message_id": self.message["id"],
            "channel_id": self.channel_id,
            "ask_id": self.ask_id,
            "answered_by": self.answered_by,
            "answered_at_ms": self.answered_at_ms,
            "answers": self.answers,
            "message": self.message,
        }


def _sent(session: Session) -> set[tuple[str, str]]:
    sent: set[tuple[str, str]] = session.extras.setdefault(_SENT, set())
    return sent


class Answers:
    """Owed answers to their askers, handed the consumer's connection (``Link``), counters,
    clock, wake requests and the live-session view."""

    def __init__(
        self, *, link: Link, counters: Counters, clock: Clock, wakers: WakeRequests, live: dict[str, Session]
    ) -> None:
        self.link = link
        self.counters = counters
        self.clock = clock
        self.wakers = wakers
        self.live = live

    def _offer(self, session: Session, answer: dict[str, Any], row: dict[str, Any]) -> Offer:
        key = (answer["message_id"], answer["ask_id"])
        sent = _sent(session)
        if key in sent:
            return OFFER_OK
        outcome = session.offer(AnswerDispatch(
            public_message(row), answer["channel_id"], answer["ask_id"], answer["answered_by"],
            answer["answered_at_ms"], answer["answers"],
        ))
        if outcome == OFFER_OK:
            sent.add(key)
            self.counters.incr("answers_sent")
        else:
            self.counters.incr("dispatch_refused")
        return outcome

    def _dispatch(self, answers: list[dict[str, Any]]) -> None:
        """Push each owed answer to its live asker or wake the asker; then mark them
        dispatched (the rows stay owed until acked)."""
        owed = [a for a in answers if a["acked_at_ms"] is None]
        with self.link.db.read() as tx:
            rows = delivery_store.messages_by_ids(tx, list({a["message_id"] for a in owed}))
            wakes: dict[str, str | None] = {}
            for a in owed:
                if a["asker_id"] not in self.live and a["asker_id"] not in wakes:
                    account = accounts_store.account(tx, a["asker_id"])
                    wakes[a["asker_id"]] = None if account is None else account["wake_json"]
        for a in owed:
            row = rows.get(a["message_id"])
            session = self.live.get(a["asker_id"])
            if row is not None and session is not None:
                outcome = self._offer(session, a, row)
                if outcome == OFFER_FULL:
                    catch_up(session)  # its re-sweep sends the answers still owed
                elif outcome == OFFER_CLOSED:
                    wakes.setdefault(a["asker_id"], None)
        if answers:
            with self.link.strict_write() as tx:
                now = self.clock.now_ms()
                for a in answers:
                    asks_store.mark_dispatched(tx, a["message_id"], a["ask_id"], now)
        for agent_id, wake_json in wakes.items():
            self.wakers.request(agent_id, wake_json, "answer")
        if wakes:
            self.counters.incr("answer_wakes", len(wakes))

    def on_answered(self, event: AskAnswered) -> None:
        with self.link.db.read() as tx:
            answer = asks_store.answer(tx, event.message_id, event.ask_id)
        if answer is not None and answer["dispatched_at_ms"] is None:
            self._dispatch([answer])

    def scan_undispatched(self) -> int:
        """The recovery scan's part: dispatch every answer a crash left undispatched."""
        total = 0
        while True:
            with self.link.db.read() as tx:
                answers = asks_store.undispatched(tx, SWEEP_LIMIT)
            if not answers:
                break
            self._dispatch(answers)
            total += len(answers)
            if len(answers) < SWEEP_LIMIT:
                break
        if total:
            self.counters.incr("answers_recovered", total)
            log.info("recovery scan dispatched answers", answers=total)
        return total

    def sweep_answers(self, session: Session) -> bool:
        """The start sweep's last step: every answer still owed to the agent, oldest first;
        False when the queue filled first."""
        with self.link.db.read() as tx:
            owed = asks_store.owed_answers(tx, session.agent_id, SWEEP_LIMIT)
            rows = delivery_store.messages_by_ids(tx, list({a["message_id"] for a in owed}))
        for a in owed:
            row = rows.get(a["message_id"])
            if row is None:
                continue
            outcome = self._offer(session, a, row)
            if outcome != OFFER_OK:
                return outcome == OFFER_CLOSED
        return True
