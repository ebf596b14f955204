"""The mention grammar (docs/api.md §3.5), written once; every routing path imports it.

* A mention is ``@handle`` anywhere in a text block, matched by
  ``(?i)@([a-z0-9][a-z0-9._-]*)`` and case-folded. There is no word boundary before the
  ``@`` (``bob@example.com`` mentions ``example.com``) and the class is greedy, so a
  sentence-final ``@ann.`` names ``ann.``, which resolves to nobody. Only text blocks are
  read; handles are deduplicated across blocks in first-appearance order.
* ``@everyone`` and ``@agents`` mean every agent member of the channel; ``@users`` reaches no
  agent (people have no session to steer).
* Only agent members of the channel count, whatever their subscription; the author never
  counts, not even through ``@everyone``. An unknown handle, a person's handle or a
  non-member's handle resolves to nothing.

Python's ``re.IGNORECASE`` on a ``str`` pattern folds Unicode the way the reference's Go
``(?i)`` does (the Kelvin sign matches ``k``), and ``str.casefold`` maps the match back to
the lowercase handle space.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from ..hub.accounts import HANDLE_PATTERN
from ..store.sweep import ChannelAgent

MENTION_RE = re.compile(rf"@({HANDLE_PATTERN})", re.IGNORECASE)

#: Reserved pings that reach every agent member of the channel.
EVERY_AGENT = frozenset({"everyone", "agents"})
#: Reserved pings that reach no agent.
NO_AGENT = frozenset({"users"})


def parse_mentions(text: str) -> list[str]:
    """Handles mentioned in one piece of text: folded, deduplicated, in order."""
    seen: dict[str, None] = {}
    for match in MENTION_RE.finditer(text):
        seen.setdefault(match.group(1).casefold(), None)
    return list(seen)


def mention_handles(blocks: Iterable[Any]) -> list[str]:
    """Handles mentioned across a message's text blocks, deduplicated in first-seen order."""
    seen: dict[str, None] = {}
    for block in blocks or ():
        if isinstance(block, dict) and block.get("kind") == "text":
            text = block.get("text")
            if isinstance(text, str) and "@" in text:
                for handle in parse_mentions(text):
                    seen.setdefault(handle, None)
    return list(seen)


def resolve_mentioned(handles: Sequence[str], members: Sequence[ChannelAgent], author_id: str) -> list[ChannelAgent]:
    """The agent members ``handles`` reach, author excluded, in account-id order."""
    if not handles:
        return []
    eligible = [m for m in members if m.id != author_id]
    if EVERY_AGENT.intersection(handles):
        return eligible
    by_handle = {m.handle: m for m in eligible}
    picked = {by_handle[h].id: by_handle[h] for h in handles if h in by_handle and h not in NO_AGENT}
    return [picked[k] for k in sorted(picked)]


def mentions_agent(handles: Sequence[str], agent: ChannelAgent, author_id: str) -> bool:
    """Whether ``handles`` reach ``agent`` (an agent member of the message's channel): the
    same rule as ``resolve_mentioned``, asked for one recipient (the cursor sweep's
    deliver-or-steer choice and every dispatch's ``mentions_you``)."""
    return bool(resolve_mentioned(handles, [agent], author_id))
