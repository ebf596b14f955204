"""A swept message as one recipient sees it: deliver, or steer when it mentions them.

Shared by the cursor sweep (``sweeps.py``) and the pin sweep (``pins.py``), so catch-up
keeps the steer-only rule of live sessions (D54) with the one mention grammar.
"""

from __future__ import annotations

from typing import Any

from ..hub.channels import public_message
from ..store import accounts as accounts_store
from ..store.engine import Tx
from ..store.sweep import ChannelAgent
from .mentions import mention_handles, mentions_agent
from .sessions import Dispatch


def recipient(tx: Tx, agent_id: str) -> ChannelAgent:
    """The sweeping agent as mention resolution sees it (a member of its sweep set)."""
    account = accounts_store.account(tx, agent_id)
    return ChannelAgent(agent_id, account["handle"] if account else "", None, True)


def catch_up_dispatch(row: dict[str, Any], me: ChannelAgent) -> Dispatch:
    """A swept message: a steer when it mentions the agent, a deliver otherwise."""
    mentioned = mentions_agent(mention_handles(row["blocks"]), me, row["author_account_id"])
    return Dispatch("steer" if mentioned else "deliver", public_message(row), row["channel_id"], mentioned)
