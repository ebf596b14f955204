"""Attachment metadata from the three codecs' attachment dicts, in one shape.

The decoders keep each platform's own field names (``decoders/*``); ``metadata`` maps any
of them to ``name, content_type, size_bytes, width, height, caption, remote_id, sha256``:

* Signal: ``filename``, ``content_type``, ``size``, ``width``, ``height``, ``caption``;
  ``remote_id`` is signal-cli's attachment id (``att_id``);
* WhatsApp: ``file_name``, ``mimetype``, ``file_length``, ``width``, ``height``,
  ``caption``; ``file_sha256`` (base64 of the plaintext's SHA-256) gives ``sha256`` up
  front, and is the ``remote_id`` too (else ``direct_path``);
* Google Messages: ``name``, ``mime_type``, ``size``, ``width``, ``height``;
  ``remote_id`` is the ``media_id``.

A value of the wrong type or out of range is left out (metadata never fails a frame);
text is cut to a sane length.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

MAX_NAME = 255
MAX_TYPE = 127
MAX_CAPTION = 4096
MAX_REMOTE_ID = 1024
_MAX_INT = 2**53


def _text(att: dict[str, Any], keys: tuple[str, ...], limit: int) -> str:
    for key in keys:
        value = att.get(key)
        if isinstance(value, str) and value.strip():
            return value[:limit]
    return ""


def _count(att: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = att.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_INT:
            return value
    return None


def _sha256_hex(b64: Any) -> str | None:
    if not isinstance(b64, str):
        return None
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def metadata(att: dict[str, Any]) -> dict[str, Any]:
    """The stored metadata of one decoded attachment."""
    sha256 = _sha256_hex(att.get("file_sha256"))
    remote_id = sha256 or _text(att, ("att_id", "media_id", "direct_path"), MAX_REMOTE_ID)
    return {
        "name": _text(att, ("filename", "file_name", "name"), MAX_NAME),
        "content_type": _text(att, ("content_type", "mimetype", "mime_type"), MAX_TYPE),
        "size_bytes": _count(att, ("size", "file_length")),
        "width": _count(att, ("width",)),
        "height": _count(att, ("height",)),
        "caption": _text(att, ("caption",), MAX_CAPTION),
        "remote_id": remote_id,
        "sha256": sha256,
    }
