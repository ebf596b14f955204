"""References a caller may write instead of ids (D55): ``@handle`` wherever an account id
is expected, ``#name`` (or the bare name) wherever a channel id is. Ids keep working.

* ``@handle`` is case-folded (handles are stored folded); an unknown one is 404
  ``unknown_account``.
* ``#name`` names a channel the caller can see (``channels.visible_channel``). A value
  without ``#`` is an id when it starts with ``ch_`` or a channel has that id, else it is
  read as a name too, so ``/api/v1/channels/general/messages`` works. In a URL path ``#``
  must be written ``%23``.
* Names are not unique: a name that matches no visible channel is 404 ``unknown_channel``
  (whether or not an invisible one exists), one that matches several visible channels is
  409 ``ambiguous_channel`` listing their ids.

Each resolver takes a read transaction so an edge resolves and then calls its use case.
"""

from __future__ import annotations

from typing import Any

from ..errors import Conflict, NotFound
from ..store import accounts as accounts_store
from ..store import channels as channels_store
from ..store.engine import Store, Tx
from .channels import visible_channel
from .tokens import Principal


def is_ref(value: Any) -> bool:
    """A value that is a reference rather than an id (cheap: no database read)."""
    return isinstance(value, str) and value[:1] in ("@", "#")


def account_id(tx: Tx, ref: Any) -> Any:
    """``@handle`` -> the account's id; anything else is returned unchanged."""
    if not (isinstance(ref, str) and ref.startswith("@")):
        return ref
    row = accounts_store.account_by_handle(tx, ref[1:].casefold())
    if row is None:
        raise NotFound(f"unknown account {ref!r}", code="unknown_account")
    return row["id"]


def account_ids(tx: Tx, refs: Any) -> Any:
    """``account_id`` over a list (anything that is not a list is returned unchanged)."""
    if not isinstance(refs, list):
        return refs
    return [account_id(tx, r) for r in refs]


def channel_id(tx: Tx, who: Principal, ref: Any) -> Any:
    """``#name`` or a bare name -> the id of the one channel by that name ``who`` can see;
    an existing channel id (or a non-string) is returned unchanged."""
    if not isinstance(ref, str) or not ref:
        return ref
    if ref.startswith("#"):
        name = ref[1:]
    elif channels_store.channel(tx, ref) is not None:
        return ref
    else:
        name = ref
    seen = []
    for cid in channels_store.channel_ids_named(tx, name):
        try:
            visible_channel(tx, who, cid)
        except NotFound:
            continue
        seen.append(cid)
    if not seen:
        if ref.startswith("#"):
            raise NotFound(f"no channel named {ref!r} that you can see", code="unknown_channel")
        return ref  # not a name either: the use case answers for the id as given
    if len(seen) > 1:
        raise Conflict(f"{len(seen)} channels are named {name!r}; use an id: {', '.join(seen)}",
                       code="ambiguous_channel")
    return seen[0]


def resolve_channel(store: Store, who: Principal, ref: Any) -> Any:
    """``channel_id`` in its own read transaction; a value shaped like an id (``ch_``) is
    returned without a read (the hot path: every post by id), so a channel whose NAME
    starts with ``ch_`` is reached as ``#ch_…``."""
    if not isinstance(ref, str) or not ref or ref.startswith("ch_"):
        return ref
    with store.read() as tx:
        return channel_id(tx, who, ref)


def resolve_account(store: Store, ref: Any) -> Any:
    """``account_id`` in its own read transaction; an id is returned without a read."""
    if not is_ref(ref):
        return ref
    with store.read() as tx:
        return account_id(tx, ref)


def resolve_account_lists(store: Store, body: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """A copy of ``body`` with the account lists under ``fields`` resolved."""
    if not any(isinstance(body.get(f), list) and any(is_ref(v) for v in body[f]) for f in fields):
        return body
    out = dict(body)
    with store.read() as tx:
        for field in fields:
            if field in out:
                out[field] = account_ids(tx, out[field])
    return out
