"""Ask blocks: an author (usually an agent) asks the channel's people questions, one
member answers.

A block ``{"kind": "ask", "ask": {"questions": [{"id", "text", "options"?}], "answered":
false}}`` is validated here and stored with a server-assigned ``ask_id``. The question
strings join the message's ``text`` (for search and display); the mention grammar reads
text blocks only, so a question never mentions anyone.

``answer``: any member of the channel except the asking author may answer, every question
once, with one of its options when it has any. The ``ask_answers`` primary key makes it
exactly once (a second answer is a 409 ``already_answered``). In the same transaction the
block becomes answered (``answered_by``, ``answered_at_ms``, ``answers``) and, when the
asker is an agent, the row is its owed answer. After the commit ``AskAnswered`` (for the
delivery consumer) and ``MessageUpdated`` (for the page) are published; a lost publish is
covered by the consumer's recovery scan of undispatched answers.
"""

from __future__ import annotations

import copy
from typing import Any

import structlog

from ..bus import Bus
from ..errors import BadRequest, Conflict, Forbidden, NotFound
from ..ids import new_id
from ..store import accounts as accounts_store
from ..store import asks as asks_store
from ..store import channels as channels_store
from ..store import messages as messages_store
from ..store.engine import Store
from .channels import public_message
from .events import AskAnswered, MessageUpdated
from .tokens import Principal

log = structlog.get_logger("tidings.asks")

MAX_QUESTIONS = 10
MAX_OPTIONS = 20
MAX_ID = 64
MAX_QUESTION = 2000
MAX_OPTION = 200
MAX_ANSWER = 2000

_BAD = (
    'an ask block is {"kind": "ask", "ask": {"questions": [{"id": str, "text": str, '
    '"options": [str]?}], "answered": false}}'
)


def _bad(detail: str) -> BadRequest:
    return BadRequest(f"{detail}; {_BAD}", code="bad_blocks")


def _short_str(value: Any, limit: int) -> bool:
    return isinstance(value, str) and bool(value.strip()) and len(value) <= limit


def normalize_ask_block(block: dict[str, Any]) -> dict[str, Any]:
    """The stored form of an incoming ask block (a fresh ``ask_id``, ``answered: false``)."""
    if set(block) - {"kind", "ask"}:
        raise _bad("ask blocks have only kind and ask")
    ask = block.get("ask")
    if not isinstance(ask, dict):
        raise _bad("ask must be an object")
    if set(ask) - {"questions", "answered"}:
        raise _bad("ask has only questions and answered (the server assigns ask_id)")
    if ask.get("answered", False) is not False:
        raise _bad("a new ask is not answered")
    questions = ask.get("questions")
    if not isinstance(questions, list) or not 1 <= len(questions) <= MAX_QUESTIONS:
        raise _bad(f"questions must be a list of 1 to {MAX_QUESTIONS}")
    clean: list[dict[str, Any]] = []
    seen: set[str] = set()
    for q in questions:
        if not isinstance(q, dict) or set(q) - {"id", "text", "options"}:
            raise _bad("a question has id, text and optional options")
        if not _short_str(q.get("id"), MAX_ID) or q["id"] in seen:
            raise _bad(f"question ids are distinct non-empty strings of at most {MAX_ID} characters")
        if not _short_str(q.get("text"), MAX_QUESTION):
            raise _bad(f"question text is a non-empty string of at most {MAX_QUESTION} characters")
        seen.add(q["id"])
        out: dict[str, Any] = {"id": q["id"], "text": q["text"]}
        if "options" in q:
            options = q["options"]
            if (
                not isinstance(options, list)
                or not 1 <= len(options) <= MAX_OPTIONS
                or not all(_short_str(o, MAX_OPTION) for o in options)
                or len(set(options)) != len(options)
            ):
                raise _bad(f"options are 1 to {MAX_OPTIONS} distinct non-empty strings")
            out["options"] = list(options)
        clean.append(out)
    return {"kind": "ask", "ask": {"ask_id": new_id("ask"), "questions": clean, "answered": False}}


def block_text(block: dict[str, Any]) -> str:
    """What a stored block adds to the message's ``text``: its text, or its questions."""
    if block.get("kind") == "ask":
        return "\n".join(q["text"] for q in block["ask"]["questions"])
    return block["text"]


def _check_answers(ask: dict[str, Any], answers: Any) -> dict[str, str]:
    if not isinstance(answers, dict):
        raise BadRequest('answers must be an object {"question_id": "answer"}', code="bad_answers")
    questions = {q["id"]: q for q in ask["questions"]}
    unknown = set(answers) - set(questions)
    if unknown:
        raise BadRequest(f"unknown question ids: {sorted(unknown)}", code="bad_answers")
    missing = [qid for qid in questions if qid not in answers]
    if missing:
        raise BadRequest(f"every question needs an answer; missing: {missing}", code="bad_answers")
    clean = {}
    for qid, q in questions.items():
        value = answers[qid]
        if not _short_str(value, MAX_ANSWER):
            raise BadRequest(f"the answer to {qid!r} must be a non-empty string of at most {MAX_ANSWER} characters",
                             code="bad_answers")
        if "options" in q and value not in q["options"]:
            raise BadRequest(f"the answer to {qid!r} must be one of {q['options']}", code="bad_answers")
        clean[qid] = value
    return clean


def answer(store: Store, bus: Bus, principal: Principal, message_id: Any, ask_id: Any, answers: Any) -> dict[str, Any]:
    """Answer an ask exactly once; returns the updated message and the answered ask."""
    if principal.account_id is None or principal.scope == "bridge":
        raise Forbidden("only an account may answer an ask", code="not_an_account")
    who = principal.account_id
    with store.write() as tx:
        if isinstance(message_id, str):
            asks_store.lock_message(tx, message_id)
        row = messages_store.message(tx, message_id) if isinstance(message_id, str) else None
        if row is None:
            raise NotFound("unknown message", code="unknown_message")
        if channels_store.membership(tx, row["channel_id"], who) is None:
            if principal.is_admin:
                raise Forbidden("the admin is not a member of this channel", code="not_a_member")
            raise NotFound("unknown message", code="unknown_message")
        blocks = copy.deepcopy(row["blocks"])
        block = next((b for b in blocks if b.get("kind") == "ask" and b["ask"].get("ask_id") == ask_id), None)
        if block is None:
            raise NotFound("unknown ask on this message", code="unknown_ask")
        ask = block["ask"]
        if row["author_account_id"] == who:
            raise Forbidden("the asker cannot answer its own ask", code="own_ask")
        if row["deleted_at_ms"] is not None:
            raise Conflict("the message was deleted", code="message_deleted")
        if ask.get("answered"):
            raise Conflict("this ask was already answered", code="already_answered")
        clean = _check_answers(ask, answers)
        asker = accounts_store.account(tx, row["author_account_id"])
        owed = asker is not None and asker["kind"] == "agent"
        now = store.now_ms()
        if not asks_store.insert_answer(
            tx, message_id=row["id"], ask_id=ask_id, channel_id=row["channel_id"], asker_id=row["author_account_id"],
            answered_by=who, answers=clean, now=now, owed=owed,
        ):
            raise Conflict("this ask was already answered", code="already_answered")
        ask.update(answered=True, answered_by=who, answered_at_ms=now, answers=clean)
        asks_store.set_message_blocks(tx, row["id"], blocks)
        row["blocks"] = blocks
        events: list[Any] = [MessageUpdated(row["id"], row["channel_id"])]
        if owed:
            events.append(AskAnswered(row["id"], row["channel_id"], ask_id, row["author_account_id"]))
        tx.after_commit(lambda: _publish(store, bus, events))
    log.info("ask answered", message_id=row["id"], ask_id=ask_id, answered_by=who, owed=owed)
    return {"message": public_message(row), "ask": ask}


def _publish(store: Store, bus: Bus, events: list[Any]) -> None:
    for event in events:
        if isinstance(event, AskAnswered) and store.faults.fire("bus.drop_publish"):
            continue  # the crash window: committed, never published (the scan recovers it)
        bus.publish(event)


def ack_answer(store: Store, agent_id: str, message_id: Any, ask_id: Any) -> dict[str, Any]:
    """The asking agent acks its answer: it is no longer owed (idempotent). An answer the
    agent is not owed (unknown, or another asker's) is a 404."""
    if not isinstance(message_id, str) or not message_id or not isinstance(ask_id, str) or not ask_id:
        raise BadRequest("message_id and ask_id (strings) are required", code="bad_message_id")
    with store.write() as tx:
        row = asks_store.answer(tx, message_id, ask_id)
        if row is None or row["asker_id"] != agent_id:
            raise NotFound("no answer to this ask is owed to you", code="unknown_answer")
        cleared = asks_store.ack_answer(tx, agent_id, message_id, ask_id, store.now_ms())
    log.debug("answer acked", agent_id=agent_id, message_id=message_id, ask_id=ask_id, cleared=cleared)
    return {"acked": True, "message_id": message_id, "ask_id": ask_id, "answer_cleared": cleared}
