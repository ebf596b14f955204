"""Payloads published on the in-process bus after a commit.

The bus is a hint: every guarantee rests on the rows these events point at, so an event
carries ids and sequence numbers, never state a consumer must trust.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MessagePosted:
    """A message row was inserted (published only when ``inserted`` was true)."""

    message_id: str
    channel_id: str
    author_id: str
    channel_seq: int
    global_seq: int


@dataclass(frozen=True, slots=True)
class MessageUpdated:
    """A message's blocks changed or it was deleted (the delivery consumer ignores it)."""

    message_id: str
    channel_id: str


@dataclass(frozen=True, slots=True)
class PinsChanged:
    """A channel's pins changed: ``message_id`` was pinned (``pinned``) or unpinned."""

    channel_id: str
    message_id: str
    pinned: bool


@dataclass(frozen=True, slots=True)
class AskAnswered:
    """An ask block was answered; the ``ask_answers`` row is the truth (and the owed
    answer of ``asker_id``)."""

    message_id: str
    channel_id: str
    ask_id: str
    asker_id: str
