"""Indexed full-text search over hub messages and bridge messages (migration 0010).

The index: SQLite FTS5 tables ``messages_fts`` / ``bridge_messages_fts`` (external content,
kept in step by triggers); PostgreSQL a generated ``search_tsv`` column with a GIN index on
each table. Either way the index is written by the statement that writes the row, inside
its transaction, so a committed message is searchable and a rolled-back one never was.

What matches (one rule, both backends): the query's words are its runs of letters and
digits (``query_words``), lower-cased; a text matches when every query word is a prefix of
some word of the text. ``pump past`` finds "Pumpkin pasta!". Deleted messages (hub
``deleted_at_ms``, bridge state ``deleted``) are never found.

Who may read is a parameter of every query, never a filter applied afterwards: hub
messages only in ``channel_ids_of`` the caller (``all_channels`` for the admin), bridge
messages only of the bridges a given owner owns (``all_bridges`` for the admin). So a
``limit`` is filled with readable rows only.

Results carry ``score`` (higher is better: ``-bm25`` on SQLite, ``ts_rank`` on
PostgreSQL) and ``snippet_marked``: a short excerpt where each match sits between
``MARK_START`` and ``MARK_END`` (control characters; ``hub.search`` turns them into
HTML-escaped ``<mark>``).
"""

from __future__ import annotations

import re
from typing import Any

from .engine import Tx
from .messages import MESSAGE_COLUMNS, row_to_message
from .sql import PerDialect

MARK_START = "\x02"
MARK_END = "\x03"
# PostgreSQL's ts_headline drops anything shaped like an HTML tag; "<" goes in as this and
# comes back out as "<" (``hub.search.marked_snippet``).
LT_STANDIN = "\x01"
MAX_WORDS = 16
_WORD = re.compile(r"[^\W_]+")

#: The index structures: tables (SQLite FTS5 and its shadow tables) and columns
#: (PostgreSQL) that are derived from message text. They are not content: the replay's
#: write counter and the store comparison leave them out.
INDEX_TABLE_PREFIXES = ("messages_fts", "bridge_messages_fts")
INDEX_COLUMNS = frozenset({"search_tsv"})


def is_index_table(name: str) -> bool:
    return any(name == p or name.startswith(p + "_") for p in INDEX_TABLE_PREFIXES)


def query_words(query: str) -> list[str]:
    """The words of a query, lower-cased, in order, without repeats (at most MAX_WORDS)."""
    return list(dict.fromkeys(w.lower() for w in _WORD.findall(query)))[:MAX_WORDS]


def text_matches(words: list[str], text: str) -> bool:
    """The match rule in Python (the tests' model): every word prefixes a word of text."""
    tokens = [t.lower() for t in _WORD.findall(text)]
    return all(any(t.startswith(w) for t in tokens) for w in words)


def _fts5_match(words: list[str]) -> str:
    return " AND ".join(f'"{w}"*' for w in words)


def _tsquery(words: list[str]) -> str:
    return " & ".join(f"'{w}':*" for w in words)


_TIME = "COALESCE(m.occurred_at_ms, m.at_unix_ms)"
_HUB_FILTERS = (
    "m.deleted_at_ms IS NULL "
    "AND (CAST(:all_channels AS BOOLEAN) OR m.channel_id IN "
    "(SELECT cm.channel_id FROM channel_members cm WHERE cm.account_id = :account_id)) "
    "AND (CAST(:channel_id AS TEXT) IS NULL OR m.channel_id = :channel_id) "
    "AND (CAST(:author AS TEXT) IS NULL OR m.author_account_id = :author) "
    f"AND (CAST(:before_ms AS BIGINT) IS NULL OR {_TIME} < :before_ms) "
    f"AND (CAST(:after_ms AS BIGINT) IS NULL OR {_TIME} > :after_ms) "
)
_HEADLINE = f"StartSel={MARK_START}, StopSel={MARK_END}, MaxWords=24, MinWords=8, ShortWord=0"

#: Ranking looks at the newest RANK_WINDOW readable matches (all of them for any word
#: rarer than that); a very common word is ranked among its recent uses, never by reading
#: and scoring every message that contains it.
RANK_WINDOW = 300

HUB_SEARCH = PerDialect(
    name="search.hub_messages",
    sqlite=(
        "WITH hits AS (SELECT m.seq AS seq, -bm25(messages_fts) AS score "
        "FROM messages_fts JOIN messages m ON m.seq = messages_fts.rowid "
        f"WHERE messages_fts MATCH :match AND {_HUB_FILTERS}"
        "ORDER BY messages_fts.rowid DESC LIMIT :window), "
        "top AS (SELECT seq, score FROM hits ORDER BY score DESC, seq DESC LIMIT :limit) "
        f"SELECT {MESSAGE_COLUMNS}, top.score AS score, "
        "snippet(messages_fts, 0, char(2), char(3), '…', 24) AS snippet_marked "
        "FROM top CROSS JOIN messages_fts CROSS JOIN messages m "
        "WHERE messages_fts MATCH :match AND messages_fts.rowid = top.seq AND m.seq = top.seq "
        "ORDER BY top.score DESC, m.seq DESC"
    ),
    postgresql=(
        "WITH hits AS (SELECT m.seq FROM messages m "
        f"WHERE m.search_tsv @@ to_tsquery('simple', :tsquery) AND {_HUB_FILTERS}"
        "ORDER BY m.seq DESC LIMIT :window), "
        f"top AS (SELECT {MESSAGE_COLUMNS}, ts_rank(m.search_tsv, to_tsquery('simple', :tsquery)) AS score "
        "FROM hits JOIN messages m ON m.seq = hits.seq ORDER BY score DESC, m.seq DESC LIMIT :limit) "
        "SELECT top.*, ts_headline('simple', replace(top.text, '<', chr(1)), to_tsquery('simple', :tsquery), "
        ":headline) AS snippet_marked FROM top ORDER BY top.score DESC, top.seq DESC"
    ),
)

_BRIDGE_COLUMNS = (
    "m.id, m.bridge_id, m.conversation_id, m.remote_message_id, m.sender_identity_id, "
    "i.raw AS sender_raw, i.display_name AS sender_name, i.is_self AS sender_is_self, m.direction, m.body, "
    "m.reply_to_remote_id, m.state, m.occurred_at_ms, m.created_at_ms, m.updated_at_ms, "
    "c.remote_conversation_id, c.title AS conversation_title"
)
_BRIDGE_JOINS = (
    "JOIN conversations c ON c.id = m.conversation_id LEFT JOIN identities i ON i.id = m.sender_identity_id "
)
_BRIDGE_FILTERS = (
    "m.state <> 'deleted' "
    "AND (CAST(:all_bridges AS BOOLEAN) OR m.bridge_id IN (SELECT b.id FROM bridges b WHERE b.owner_id = :owner_id)) "
    "AND (CAST(:conversation_id AS TEXT) IS NULL OR m.conversation_id = :conversation_id) "
    "AND (CAST(:author AS TEXT) IS NULL OR m.sender_identity_id = :author) "
    "AND (CAST(:before_ms AS BIGINT) IS NULL OR m.occurred_at_ms < :before_ms) "
    "AND (CAST(:after_ms AS BIGINT) IS NULL OR m.occurred_at_ms > :after_ms) "
)
BRIDGE_SEARCH = PerDialect(
    name="search.bridge_messages",
    sqlite=(
        "WITH hits AS (SELECT m.rowid AS rid, -bm25(bridge_messages_fts) AS score "
        "FROM bridge_messages_fts JOIN bridge_messages m ON m.rowid = bridge_messages_fts.rowid "
        f"WHERE bridge_messages_fts MATCH :match AND {_BRIDGE_FILTERS}"
        "ORDER BY bridge_messages_fts.rowid DESC LIMIT :window), "
        "top AS (SELECT rid, score FROM hits ORDER BY score DESC, rid DESC LIMIT :limit) "
        f"SELECT {_BRIDGE_COLUMNS}, top.score AS score, "
        "snippet(bridge_messages_fts, 0, char(2), char(3), '…', 24) AS snippet_marked "
        "FROM top CROSS JOIN bridge_messages_fts CROSS JOIN bridge_messages m "
        f"{_BRIDGE_JOINS}"
        "WHERE bridge_messages_fts MATCH :match AND bridge_messages_fts.rowid = top.rid AND m.rowid = top.rid "
        "ORDER BY top.score DESC, m.occurred_at_ms DESC, m.id DESC"
    ),
    postgresql=(
        "WITH hits AS (SELECT m.id FROM bridge_messages m "
        f"WHERE m.search_tsv @@ to_tsquery('simple', :tsquery) AND {_BRIDGE_FILTERS}"
        "ORDER BY m.occurred_at_ms DESC, m.id DESC LIMIT :window), "
        f"top AS (SELECT {_BRIDGE_COLUMNS}, ts_rank(m.search_tsv, to_tsquery('simple', :tsquery)) AS score "
        f"FROM hits JOIN bridge_messages m ON m.id = hits.id {_BRIDGE_JOINS}"
        "ORDER BY score DESC, m.occurred_at_ms DESC, m.id DESC LIMIT :limit) "
        "SELECT top.*, ts_headline('simple', replace(top.body, '<', chr(1)), to_tsquery('simple', :tsquery), "
        ":headline) AS snippet_marked FROM top ORDER BY top.score DESC, top.occurred_at_ms DESC, top.id DESC"
    ),
)


def _query_params(words: list[str]) -> dict[str, Any]:
    return {"match": _fts5_match(words), "tsquery": _tsquery(words), "headline": _HEADLINE, "window": RANK_WINDOW}


def hub_messages(
    tx: Tx,
    words: list[str],
    *,
    account_id: str | None,
    all_channels: bool,
    limit: int,
    channel_id: str | None = None,
    author: str | None = None,
    before_ms: int | None = None,
    after_ms: int | None = None,
) -> list[dict[str, Any]]:
    """Hub messages matching ``words`` in the channels ``account_id`` is a member of (every
    channel with ``all_channels``), best first. ``before_ms``/``after_ms`` bound the shown
    time (the network time when there is one, else the commit time), both exclusive."""
    rows = tx.mappings(
        HUB_SEARCH,
        {
            **_query_params(words),
            "account_id": account_id,
            "all_channels": bool(all_channels),
            "channel_id": channel_id,
            "author": author,
            "before_ms": before_ms,
            "after_ms": after_ms,
            "limit": limit,
        },
    )
    return [row_to_message(r) for r in rows]


def bridge_messages(
    tx: Tx,
    words: list[str],
    *,
    owner_id: str | None,
    all_bridges: bool,
    limit: int,
    conversation_id: str | None = None,
    author: str | None = None,
    before_ms: int | None = None,
    after_ms: int | None = None,
) -> list[dict[str, Any]]:
    """Bridge messages matching ``words`` of the bridges ``owner_id`` owns (every bridge
    with ``all_bridges``), best first; ``author`` is a sender identity id."""
    return tx.mappings(
        BRIDGE_SEARCH,
        {
            **_query_params(words),
            "owner_id": owner_id,
            "all_bridges": bool(all_bridges),
            "conversation_id": conversation_id,
            "author": author,
            "before_ms": before_ms,
            "after_ms": after_ms,
            "limit": limit,
        },
    )
