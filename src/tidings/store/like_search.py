"""The LIKE scan and the bridge-author read (the edge reaches them through ``hub/reads.py``).

* ``search_channel_messages`` -- hub messages whose text contains the query
  (case-insensitive), in channels the account is a member of, newest first. Membership is
  the join itself, so a channel the account cannot see never contributes a row. Deleted
  messages are never found. A LIKE scan over the member's channels: no tool uses it any
  more (``search_messages`` goes through the full-text index, ``hub.search``); it stays as
  the baseline ``bench/bench_search.py`` measures the index against.
* ``bridge_account_ids`` -- the accounts bridges post as (bridge links), so a channel
  message carrying a bridge's external text can be marked untrusted.
"""

from __future__ import annotations

from typing import Any

from .bridge_messages import like_pattern
from .engine import Tx
from .messages import MESSAGE_COLUMNS, row_to_message
from .sql import PerDialect, Stmt

_SEARCH = (
    f"SELECT {MESSAGE_COLUMNS} FROM messages m "
    "JOIN channel_members cm ON cm.channel_id = m.channel_id AND cm.account_id = :account_id "
    "WHERE m.deleted_at_ms IS NULL AND m.text {op} :pattern ESCAPE '\\' "
    "ORDER BY m.seq DESC LIMIT :limit"
)
SEARCH_CHANNEL_MESSAGES = PerDialect(
    name="mcp.search_channel_messages",
    # SQLite's LIKE is case-insensitive for ASCII; PostgreSQL needs ILIKE.
    sqlite=_SEARCH.replace("{op}", "LIKE"),
    postgresql=_SEARCH.replace("{op}", "ILIKE"),
)
BRIDGE_ACCOUNT_IDS = Stmt("SELECT account_id FROM bridges", name="mcp.bridge_account_ids")


def search_channel_messages(tx: Tx, account_id: str, query: str, limit: int) -> list[dict[str, Any]]:
    rows = tx.mappings(
        SEARCH_CHANNEL_MESSAGES, {"account_id": account_id, "pattern": like_pattern(query), "limit": limit}
    )
    return [row_to_message(r) for r in rows]


def bridge_account_ids(tx: Tx) -> frozenset[str]:
    return frozenset(r[0] for r in tx.all(BRIDGE_ACCOUNT_IDS, {}))
