"""Frame decoders: one pure decoder per codec, and the entry point the worker calls.

``DECODERS`` maps a codec name (docs/api.md §6) to its decoder::

    signal.jsonrpc  -> signal_jsonrpc.SignalJsonRpcDecoder   (platform "signal")
    whatsapp.event  -> whatsapp_event.WhatsAppEventDecoder    (platform "whatsapp")
    google.json     -> google_json.GoogleJsonDecoder          (platform "google")

Each module docstring says which real tool output it reads, which field names were
confirmed where, and the remote-id rules it applies.

``decode_frame(codec, codec_version, payload)`` is what the ingest worker calls: it
refuses an unknown codec (:class:`UnknownCodec`) or version (:class:`UnsupportedVersion`),
then decodes. Every returned event has passed ``validate_event``; every failure is a
:class:`DecodeError` whose ``cause`` is fit to store with the quarantined frame.
"""

from __future__ import annotations

from typing import Any

from tidings.ingest.decoders.base import DecodeError, Decoder, UnknownCodec, UnsupportedVersion
from tidings.ingest.decoders.google_json import GoogleJsonDecoder
from tidings.ingest.decoders.signal_jsonrpc import SignalJsonRpcDecoder
from tidings.ingest.decoders.whatsapp_event import WhatsAppEventDecoder
from tidings.ingest.events import Event

__all__ = [
    "DECODERS",
    "DecodeError",
    "Decoder",
    "UnknownCodec",
    "UnsupportedVersion",
    "decode_frame",
]

DECODERS: dict[str, Decoder] = {
    dec.codec: dec
    for dec in (SignalJsonRpcDecoder(), WhatsAppEventDecoder(), GoogleJsonDecoder())
}


def decode_frame(codec: Any, codec_version: Any, payload: Any) -> list[Event]:
    """Decode one frame's payload into validated events, or raise :class:`DecodeError`."""
    decoder = DECODERS.get(codec) if isinstance(codec, str) else None
    if decoder is None:
        raise UnknownCodec(f"unknown codec {codec!r}; known: {sorted(DECODERS)}")
    if (
        not isinstance(codec_version, int)
        or isinstance(codec_version, bool)
        or codec_version not in decoder.versions
    ):
        raise UnsupportedVersion(
            f"{codec}: codec_version {codec_version!r} is not supported "
            f"(supported: {sorted(decoder.versions)})"
        )
    # Decoder.decode validates every event it returns (validate_event) and turns any
    # failure, including an invalid event, into a DecodeError.
    return decoder.decode(payload)
