"""Attachments: metadata on reads, bytes uploaded by bridges, downloads for readers.

* Reads: a bridge message with attachments carries ``"attachments": [...]`` (metadata, the
  content address when known, ``available`` once its bridge uploaded the bytes, and the
  download ``url``); so does a channel message a bridge link posted from it. Messages without
  attachments carry no key (the contract's shapes are unchanged for them).
* Upload (``upload``): only the bridge's own token; the bytes must hash to the name (else
  400 ``hash_mismatch``, nothing kept) and fit ``max_bytes`` (else 413 ``too_large``);
  ``remote_id`` (the codec's attachment id) ties them to that bridge's attachment rows,
  before or after the frame that names them arrives.
* Download (``download``): whoever may read the message (a bridge message: its bridge's
  readers; a linked channel message: the channel's members) gets the bytes; anyone else
  404, as for a message that does not exist.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, BinaryIO

import structlog

from ..blobs import SHA256_HEX, BlobStore, BlobTooLarge, HashMismatch
from ..errors import BadRequest, Forbidden, NotFound, TooLarge
from ..store import attachments as attachments_store
from ..store import bridge_messages
from ..store import messages as messages_store
from ..store.engine import Store, Tx
from . import channels as channels_hub
from .tokens import Principal

log = structlog.get_logger("tidings.attachments")

DEFAULT_MAX_BYTES = 50 * 1024 * 1024
MAX_REMOTE_ID = 1024
_LINK_PREFIX = "link:"
_SAFE_TYPE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$")
_INLINE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def download_url(message_id: str, ordinal: int) -> str:
    return f"/api/v1/attachments/{message_id}/{ordinal}"


def public(row: dict[str, Any], message_id: str | None = None) -> dict[str, Any]:
    sha = row["sha256"]
    return {
        "ordinal": row["ordinal"],
        "name": row["name"],
        "content_type": row["content_type"],
        "size_bytes": row["size_bytes"],
        "width": row["width"],
        "height": row["height"],
        "caption": row["caption"],
        "sha256": sha,
        "available": bool(row["uploaded"]),
        "url": download_url(message_id or row["message_id"], row["ordinal"]),
    }


def linked_source(message: dict[str, Any]) -> str | None:
    """The bridge message a bridge link posted this channel message from, if it was."""
    crid = message.get("client_request_id") or ""
    if not crid.startswith(_LINK_PREFIX):
        return None
    parts = crid.split(":", 2)
    return parts[2] if len(parts) == 3 and parts[2] else None


def add_to_bridge_messages(tx: Tx, messages: list[dict[str, Any]]) -> None:
    """Give each public bridge message (``id``) with attachments its ``attachments``."""
    found = attachments_store.of_messages(tx, [m["id"] for m in messages])
    for m in messages:
        if m["id"] in found:
            m["attachments"] = [public(r) for r in found[m["id"]]]


def add_to_channel_messages(tx: Tx, rows: list[dict[str, Any]], publics: list[dict[str, Any]]) -> None:
    """Give each public channel message posted from a bridge message with attachments its
    ``attachments`` (``rows[i]`` is the stored row of ``publics[i]``)."""
    sources = [linked_source(r) for r in rows]
    found = attachments_store.of_messages(tx, [s for s in sources if s])
    for source, out in zip(sources, publics, strict=True):
        if source and source in found:
            out["attachments"] = [public(r, out["id"]) for r in found[source]]


def public_channel_messages(tx: Tx, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The contract's Message shape of ``rows``, with the attachments of linked ones."""
    publics = [channels_hub.public_message(r) for r in rows]
    add_to_channel_messages(tx, rows, publics)
    return publics


def check_sha256(sha256: str) -> str:
    sha = sha256.lower()
    if not SHA256_HEX.match(sha):
        raise BadRequest("the name must be the SHA-256 of the bytes: 64 hex digits", code="bad_sha256")
    return sha


def check_uploader(who: Principal, bridge_id: str) -> None:
    if who.scope != "bridge" or who.bridge_id != bridge_id:
        raise Forbidden("only this bridge's own token may upload its attachments", code="bridge_only")


def check_remote_id(remote_id: str | None) -> str | None:
    if remote_id is None:
        return None
    if not remote_id or len(remote_id) > MAX_REMOTE_ID:
        raise BadRequest(f"remote_id must be 1 to {MAX_REMOTE_ID} characters")
    return remote_id


class Upload:
    """One upload in progress: ``write`` chunks, then ``finish`` (or ``abort``)."""

    def __init__(self, blobs: BlobStore, sha256: str, max_bytes: int) -> None:
        self.sha256 = sha256
        self.max_bytes = max_bytes
        self.existed = blobs.has(sha256)
        self.writer = blobs.writer(sha256, max_bytes)

    def write(self, chunk: bytes) -> None:
        try:
            self.writer.write(chunk)
        except BlobTooLarge:
            raise TooLarge(f"an attachment may be at most {self.max_bytes} bytes") from None

    def finish(self) -> int:
        try:
            return self.writer.commit()
        except HashMismatch as exc:
            raise BadRequest(str(exc), code="hash_mismatch") from None

    def abort(self) -> None:
        self.writer.abort()


def record(store: Store, bridge_id: str, remote_id: str | None, sha256: str, size: int) -> None:
    """Tie uploaded bytes to the bridge's attachment ``remote_id`` (its own sha256 when
    none is named: the ``remote_id`` of attachments whose codec gave their hash)."""
    with store.write() as tx:
        attachments_store.record_upload(tx, bridge_id=bridge_id, remote_id=remote_id or sha256, sha256=sha256,
                                        size_bytes=size, now=store.now_ms())
    log.info("attachment uploaded", bridge_id=bridge_id, sha256=sha256, size_bytes=size, remote_id=remote_id)


def readable_attachment(store: Store, who: Principal, message_id: str, ordinal: int) -> dict[str, Any]:
    """The attachment row if ``who`` may read its message; NotFound otherwise."""
    from ..bridges.conversations import may_read_bridge
    from ..store import conversations

    missing = NotFound("unknown attachment", code="unknown_attachment")
    with store.read() as tx:
        row = messages_store.message(tx, message_id)
        if row is not None:
            try:
                channels_hub.visible_channel(tx, who, row["channel_id"])
            except NotFound:
                raise missing from None
            source = linked_source(row)
            if source is None:
                raise missing
        else:
            found = bridge_messages.by_id(tx, message_id)
            if found is None:
                raise missing
            owner = conversations.conversation_owner(tx, found["conversation_id"])
            if owner is None or not may_read_bridge(tx, who, owner[1]):
                raise missing
            source = message_id
        att = attachments_store.one(tx, source, ordinal)
    if att is None:
        raise missing
    return att


def open_download(blobs: BlobStore, att: dict[str, Any]) -> tuple[BinaryIO, dict[str, str], str]:
    """(file, headers, media type) of an attachment's bytes; 404 while not uploaded."""
    sha = att["sha256"]
    if not sha or not blobs.has(sha):
        raise NotFound("the bytes of this attachment have not been uploaded", code="attachment_not_uploaded")
    ctype = att["content_type"].lower()
    media_type = ctype if _SAFE_TYPE.match(ctype) else "application/octet-stream"
    disposition = "inline" if media_type in _INLINE_TYPES else "attachment"
    name = re.sub(r'[^A-Za-z0-9._ -]', "_", att["name"] or sha[:16])
    headers = {"content-disposition": f'{disposition}; filename="{name}"', "x-content-type-options": "nosniff",
               "etag": f'"{sha}"'}
    return blobs.open(sha), headers, media_type


def chunks(file: BinaryIO, size: int = 64 * 1024) -> Iterable[bytes]:
    with file:
        while True:
            block = file.read(size)
            if not block:
                return
            yield block
