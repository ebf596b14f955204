"""The post path's reads, announced together so PostgreSQL answers them in one round trip.

A post reads the channel, the author's membership, the stored message of a repeated
``client_request_id`` and the topic by name before it writes anything, and none of those
reads depends on another's answer. ``read_ahead`` announces all four (``Tx.read_ahead``):
they travel with the transaction's ``BEGIN`` in one pipeline, and the store calls of
``Posting._post_in`` then take their answers instead of sending them again. The
parameters here are exactly the ones those store calls build (a test counts the round
trips of a post, so a drift shows). SQLite: nothing changes.
"""

from __future__ import annotations

from ..store import channels as channels_store
from ..store import messages as messages_store
from ..store.engine import Tx


def read_ahead(tx: Tx, *, channel_id: str, author_id: str, topic: str, client_request_id: str) -> None:
    """Announce a post's reads (see the module docstring); harmless if some go unused."""
    if tx.dialect != "postgresql":
        return
    tx.read_ahead(channels_store.CHANNEL_FOR_POST, {"id": channel_id})
    tx.read_ahead(channels_store.MEMBER, {"channel_id": channel_id, "account_id": author_id})
    if client_request_id:
        tx.read_ahead(
            messages_store.BY_CLIENT_REQUEST, {"author": author_id, "client_request_id": client_request_id}
        )
    tx.read_ahead(channels_store.TOPIC_BY_NAME, {"channel_id": channel_id, "name_folded": topic.casefold()})
