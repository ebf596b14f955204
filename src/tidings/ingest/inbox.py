"""Appending frames to the inbox: validation (docs/api.md §6) and the durable insert.

A request's frames are all validated before anything is written; one bad frame fails the
whole request with a 400 that names the frame and the reason, and nothing is appended.
Then every frame is inserted in ONE transaction, and only after it committed does the
caller answer 202 and wake the worker.

``received_at_ms`` is stamped from the store clock at append (the drain order and the
Google reaction-fence sequence); a ``received_at_ms`` sent by the bridge is kept apart in
``client_received_at_ms``. A frame whose (bridge, non-empty ``dedupe_key``) is already
stored is a replay: the existing ``inbox_id`` comes back with ``replay: true``, and when
its codec, version or payload differ from the stored one it is a *stale* replay (counted,
ignored: the first frame wins).

Within one millisecond frames drain in append order (see ``_InboxIds``).

Payload storage: an object is stored as its JSON text, a string as the string itself. The
decoders accept either and parse a string as JSON, so both decode exactly as the bridge
sent them, and the worker hands the stored text straight to the decoder (one parse).
Apply on append hands the decoder the object the request already parsed (``Frame.doc``)
instead, so a frame is not parsed twice: that object is what the stored text says, since
the text is its ``json.dumps`` and a JSON value survives ``dumps``/``loads`` unchanged
(NaN and infinities are refused here, before anything is stored). ``doc`` is None for a
string payload, which the decoder parses from the text as the drain would.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import BadRequest, NotFound, TooLarge
from ..store import inbox as inbox_store
from ..store.engine import Tx

MAX_FRAME_BYTES = 1024 * 1024  # payload bytes per frame, as stored
MAX_FRAMES_PER_REQUEST = 1000
MAX_CODEC_LEN = 100
MAX_DEDUPE_KEY_LEN = 512
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
FRAME_FIELDS = frozenset({"codec", "codec_version", "dedupe_key", "received_at_ms", "payload"})


@dataclass(slots=True)
class Frame:
    """One validated frame, ready to insert."""

    codec: str
    codec_version: int
    dedupe_key: str
    client_received_at_ms: int | None
    payload: str  # as stored
    # The parsed JSON object ``payload`` is the text of (an object payload), or None (a
    # string payload). Apply on append decodes from it; the inbox stores ``payload``.
    doc: Any = None


@dataclass(slots=True)
class AppendResult:
    inbox_id: str
    replay: bool
    stale: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"inbox_id": self.inbox_id, "replay": self.replay}


class _InboxIds:
    """``in_<ms:12 hex><seq:6 hex><random:14 hex>``: same shape as ``ids.new_id``.

    Frames appended in the same millisecond share ``received_at_ms``, and the drain breaks
    that tie by ``inbox_id``. Leading with the millisecond and a per-process sequence makes
    the tie follow append order (a batch's frames, or one bridge's quick requests, apply
    in the order they were sent) where a purely random id would shuffle them. The random
    tail keeps the id unguessable.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ms = -1
        self._seq = 0

    def __call__(self, now_ms: int) -> str:
        with self._lock:
            if now_ms == self._ms:
                self._seq += 1
            else:
                self._ms, self._seq = now_ms, 0
            seq = self._seq
        return f"in_{now_ms:012x}{seq:06x}{secrets.token_hex(7)}"


new_inbox_id = _InboxIds()


def frames_of_body(body: Any) -> list[Any]:
    """The frames of a request body: one frame object, or ``{"frames": [...]}``."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a frame object or {\"frames\": [...]}", code="bad_frame")
    if "frames" in body:
        if set(body) != {"frames"}:
            raise BadRequest('a batch body has only "frames"', code="bad_frame")
        frames = body["frames"]
        if not isinstance(frames, list) or not frames:
            raise BadRequest('"frames" must be a non-empty array of frames', code="bad_frame")
        if len(frames) > MAX_FRAMES_PER_REQUEST:
            raise BadRequest(f"at most {MAX_FRAMES_PER_REQUEST} frames per request", code="too_many_frames")
        return frames
    return [body]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _clean_text(value: str) -> bool:
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def payload_text(payload: Any) -> str:
    """How a payload is stored: a JSON object's text, or the string as sent."""
    if isinstance(payload, str):
        return payload
    return _object_text(payload)[0]


# json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False), built once.
# No circular check: a payload parsed from JSON cannot be circular, and one that is anyway
# ends in RecursionError, refused below like a payload nested too deeply.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False)
_ASCII_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False, check_circular=False)


def _object_text(payload: Any) -> tuple[str, int]:
    """A JSON object's stored text and its size in UTF-8 bytes."""
    try:
        text = _ENCODER.encode(payload)
    except RecursionError:
        raise ValueError("payload is nested too deeply") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"payload is not valid JSON ({exc})") from None
    if text.isascii():
        return text, len(text)
    try:
        return text, len(text.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates: keep them as \\u escapes
        text = _ASCII_ENCODER.encode(payload)
        return text, len(text)


def parse_frame(
    raw: Any,
    index: int,
    *,
    max_bytes: int = MAX_FRAME_BYTES,
    platform: str | None = None,
    codec_platforms: dict[str, str] | None = None,
) -> Frame:
    """Validate one frame (docs/api.md §6); BadRequest/TooLarge naming frame ``index``."""

    def bad(message: str) -> BadRequest:
        return BadRequest(f"frame {index}: {message}", code="bad_frame")

    if not isinstance(raw, dict):
        raise bad("must be a JSON object")
    unknown = set(raw) - FRAME_FIELDS
    if unknown:
        raise bad(f"unknown fields {sorted(unknown)}; a frame has {sorted(FRAME_FIELDS)}")
    codec = raw.get("codec")
    if not isinstance(codec, str) or not codec.strip() or codec != codec.strip():
        raise bad("codec must be a non-empty string without surrounding spaces")
    if len(codec) > MAX_CODEC_LEN or not _clean_text(codec):
        raise bad(f"codec must be at most {MAX_CODEC_LEN} characters of valid text")
    if platform is not None and codec_platforms:
        expected = codec_platforms.get(codec)
        if expected is not None and expected != platform:
            raise bad(f"codec {codec!r} carries {expected} frames; this is a {platform} bridge")
    version = raw.get("codec_version")
    if not isinstance(version, int) or not _is_int(version) or not 0 <= version < 2**31:
        raise bad("codec_version must be a non-negative integer")
    if "dedupe_key" not in raw:
        raise bad('dedupe_key is required (use "" when the transport has no stable id)')
    dedupe_key = raw["dedupe_key"]
    if not isinstance(dedupe_key, str):
        raise bad("dedupe_key must be a string")
    if dedupe_key and not dedupe_key.strip():
        raise bad('dedupe_key must be "" or contain a non-space character')
    if len(dedupe_key) > MAX_DEDUPE_KEY_LEN or not _clean_text(dedupe_key):
        raise bad(f"dedupe_key must be at most {MAX_DEDUPE_KEY_LEN} characters of valid text")
    client_ms = raw.get("received_at_ms")
    if client_ms is not None and (not _is_int(client_ms) or not 0 < client_ms <= MAX_TIME_MS):
        raise bad("received_at_ms must be a positive integer of unix milliseconds")
    if "payload" not in raw:
        raise bad("payload is required (an object or a string)")
    payload = raw["payload"]
    if isinstance(payload, dict):
        try:
            text, size = _object_text(payload)
        except ValueError as exc:
            raise bad(str(exc)) from None
        doc: dict[str, Any] | None = payload
    elif isinstance(payload, str):
        if "\x00" in payload:
            raise bad("payload string contains NUL or invalid Unicode")
        try:
            size = len(payload.encode("utf-8"))
        except UnicodeEncodeError:
            raise bad("payload string contains NUL or invalid Unicode") from None
        text, doc = payload, None
    else:
        raise bad("payload must be an object or a string")
    if size > max_bytes:
        raise TooLarge(f"frame {index}: payload is {size} bytes; the limit is {max_bytes}", code="frame_too_large")
    return Frame(codec, version, dedupe_key, client_ms, text, doc)


def _same_payload(stored: str, new: str) -> bool:
    if stored == new:
        return True
    try:
        return bool(json.loads(stored) == json.loads(new))
    except (ValueError, RecursionError):
        return False


class Inserter(Protocol):
    """How ``append_frames`` stores a request's frames other than plainly (apply on append:
    ``ingest.on_append.AppendApplier``): ``begin`` before the first frame, the call for each
    (False: a duplicate), ``stored`` for a duplicate's stored row, ``finish`` after the last."""

    def begin(self, tx: Tx, frames: list[Any]) -> None: ...

    def __call__(self, tx: Tx, inbox_id: str, frame: Any) -> bool: ...

    def stored(self, tx: Tx, frame: Any) -> tuple[Any, ...] | None: ...

    def finish(self, tx: Tx) -> None: ...


def append_frames(
    tx: Tx,
    bridge_id: str,
    frames: list[Frame],
    now_ms: int,
    new_id: Callable[[int], str] | None = None,
    insert: Inserter | None = None,
    bridge_platform: Callable[[Tx, str], str | None] | None = None,
) -> list[AppendResult]:
    """Insert ``frames`` in ``tx``; a repeated non-empty dedupe key returns the stored id.

    ``new_id`` mints inbox ids (default ``new_inbox_id``); the replay harness passes a
    deterministic one of the same shape, so two replays of a corpus compare row for row.
    ``insert`` stores the frames instead of the plain unprocessed insert (``Inserter``):
    apply on append passes one that stores them applied (``ingest.on_append.AppendApplier``).
    ``bridge_platform(tx, bridge_id)`` says whether the bridge exists (default: read it;
    ``Ingest`` passes the worker's, which remembers the bridges it has seen).
    """
    if (bridge_platform or inbox_store.bridge_platform)(tx, bridge_id) is None:
        raise NotFound(f"no bridge {bridge_id!r}", code="unknown_bridge")
    mint = new_id or new_inbox_id
    results: list[AppendResult] = []
    if insert is not None:
        insert.begin(tx, frames)
    for frame in frames:
        inbox_id = mint(now_ms)
        if insert is not None:
            inserted = insert(tx, inbox_id, frame)
        else:
            inserted = inbox_store.insert_frame(
                tx,
                inbox_id=inbox_id,
                bridge_id=bridge_id,
                dedupe_key=frame.dedupe_key,
                codec=frame.codec,
                codec_version=frame.codec_version,
                received_at_ms=now_ms,
                client_received_at_ms=frame.client_received_at_ms,
                payload=frame.payload,
            )
        if inserted:
            results.append(AppendResult(inbox_id, False))
            continue
        if insert is not None:
            row = insert.stored(tx, frame)
        else:
            row = inbox_store.frame_by_dedupe(tx, bridge_id, frame.dedupe_key)
        if row is None:  # pragma: no cover - the conflict row cannot vanish inside the tx
            raise RuntimeError("dedupe conflict without a stored frame")
        stored_id, codec, version, stored_payload = row
        stale = codec != frame.codec or version != frame.codec_version or not _same_payload(
            stored_payload, frame.payload
        )
        results.append(AppendResult(stored_id, True, stale))
    if insert is not None:
        insert.finish(tx)
    return results
