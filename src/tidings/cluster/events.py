"""Cluster notifications: compact JSON payloads that carry ids and numbers, never state.

Every payload names its sending node (``n``) and a kind (``k``):

* ``p`` a message was posted: message, channel and author ids, channel seq, global seq
  (sent with ``pg_notify`` inside the post's own transaction, so it arrives exactly when
  the row is visible, and never for a rolled-back post);
* ``s`` a session claimed its agent (``a``, ``x`` = session id): any other node holding a
  session for that agent ends it with reason ``replaced``;
* ``e`` a session ended;
* ``w`` a wake request for the leader (agent ``a``, reason ``r``);
* ``r`` an author settled (agent ``a``): what other nodes held for it fans out there;
* ``o`` owed mentions were recorded for these agents (``as``), sent from the statement that
  recorded them: a node holding one's session steers what its start sweep could not see
  (D123). Agent ids go ``OWED_HINT_AGENTS`` to a payload, well inside NOTIFY's 8,000 bytes.

A receiver reads every row it acts on from the store; a notification is only a hint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..hub.events import MessagePosted


class Kind(StrEnum):
    """The ``k`` of a cluster notification (one letter: the payload crosses NOTIFY)."""

    POSTED = "p"
    SESSION_CLAIMED = "s"
    SESSION_ENDED = "e"
    WAKE = "w"
    SETTLED = "r"
    OWED = "o"


POSTED = Kind.POSTED
SESSION_CLAIMED = Kind.SESSION_CLAIMED
SESSION_ENDED = Kind.SESSION_ENDED
WAKE = Kind.WAKE
SETTLED = Kind.SETTLED
OWED = Kind.OWED

#: Agent ids in one ``o`` payload (an id is 36 characters: about 4 KB a payload).
OWED_HINT_AGENTS = 100


@dataclass(frozen=True, slots=True)
class RemotePosted(MessagePosted):
    """A post committed by another node, as its notification told this node."""

    node_id: str = ""


@dataclass(frozen=True, slots=True)
class AuthorSettled:
    """Bus payload (cluster): release what this node holds for ``agent_id``, whose session
    settled on another node or is gone."""

    agent_id: str


@dataclass(frozen=True, slots=True)
class OwedRecorded:
    """Bus payload (cluster): another node recorded owed mentions for these agents."""

    agent_ids: tuple[str, ...]


def encode_owed(node_id: str, agent_ids: list[str]) -> list[str]:
    """The ``o`` payloads for ``agent_ids``, ``OWED_HINT_AGENTS`` to a payload."""
    return [
        _dump({"k": OWED, "n": node_id, "as": agent_ids[i:i + OWED_HINT_AGENTS]})
        for i in range(0, len(agent_ids), OWED_HINT_AGENTS)
    ]


def owed_from(data: dict[str, Any]) -> OwedRecorded:
    agents = data.get("as")
    return OwedRecorded(tuple(str(a) for a in agents) if isinstance(agents, list) else ())


def encode_settled(node_id: str, agent_id: str) -> str:
    return _dump({"k": SETTLED, "n": node_id, "a": agent_id})


def encode_posted(node_id: str, event: MessagePosted) -> str:
    return _dump(
        {
            "k": POSTED,
            "n": node_id,
            "m": event.message_id,
            "c": event.channel_id,
            "a": event.author_id,
            "cs": event.channel_seq,
            "s": event.global_seq,
        }
    )


def encode_session(kind: str, node_id: str, agent_id: str, session_id: str) -> str:
    return _dump({"k": kind, "n": node_id, "a": agent_id, "x": session_id})


def encode_wake(node_id: str, agent_id: str, reason: str) -> str:
    return _dump({"k": WAKE, "n": node_id, "a": agent_id, "r": reason})


def decode(payload: str) -> dict[str, Any] | None:
    """The payload as a dict with at least ``k`` and ``n`` (strings), or None if it is not
    one of ours."""
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("k"), str) or not isinstance(data.get("n"), str):
        return None
    return data


def posted_from(data: dict[str, Any]) -> RemotePosted:
    return RemotePosted(
        str(data["m"]), str(data["c"]), str(data["a"]), int(data["cs"]), int(data["s"]), node_id=data["n"]
    )


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"))
