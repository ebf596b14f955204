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
