"""What every decoder shares: the error type, the base class and typed JSON accessors.

The accessors are how a decoder reads its payload: each one checks the type of what it
reads and raises :class:`DecodeError` with the JSON path of the offending value, so a
malformed frame is quarantined with a cause a person can act on. ``Decoder.decode`` also
keeps a safety net (any ``KeyError``/``TypeError``/``ValueError``/... becomes a
``DecodeError``), but the accessors are meant to make that net unnecessary; the tests
fuzz the decoders without it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, ClassVar, cast

from tidings.ingest.events import Event, IdentityRef, InvalidEvent, identity_ref, validate_event

__all__ = ["DecodeError", "Decoder", "UnknownCodec", "UnsupportedVersion"]

# Python refuses int() of very long digit strings anyway; 64-bit values need at most 20.
_INT_RE = re.compile(r"[+-]?[0-9]{1,20}")
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


class DecodeError(Exception):
    """A frame that cannot be decoded; ``cause`` (also ``str(exc)``) says why."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class UnknownCodec(DecodeError):
    """The frame names a codec no decoder is registered for."""


class UnsupportedVersion(DecodeError):
    """The codec is known but this ``codec_version`` is not."""


class Decoder:
    """One codec. Subclasses set the class attributes and implement ``_decode``.

    A decoder is pure: no store, no clock, no I/O, and the same payload always gives the
    same events. ``decode`` raises nothing but :class:`DecodeError`, and every event it
    returns has passed :func:`validate_event`. Content that is valid but that Tidings does
    not model (typing, calls, polls, receipts we ignore...) decodes to ``[]``.
    """

    codec: ClassVar[str]
    platform: ClassVar[str]
    versions: ClassVar[frozenset[int]] = frozenset({1})

    def decode(self, payload: Any) -> list[Event]:
        doc = parse_payload(payload, self.codec)
        try:
            events = self._decode(doc)
        except DecodeError:
            raise
        except InvalidEvent as exc:
            raise DecodeError(f"{self.codec}: {exc}") from exc
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError,
                RecursionError) as exc:  # the safety net; see the module docstring
            raise DecodeError(
                f"{self.codec}: malformed payload ({type(exc).__name__}: {exc})"
            ) from exc
        for ev in events:
            try:
                validate_event(ev)
            except InvalidEvent as exc:
                raise DecodeError(f"{self.codec}: decoded an invalid event: {exc}") from exc
        return events

    def _decode(self, doc: dict[str, Any]) -> list[Event]:  # pragma: no cover - abstract
        raise NotImplementedError

    def identity(self, raw: str, *, name: str = "", is_self: bool = False) -> IdentityRef:
        """An :class:`IdentityRef` with ``kind``/``canonical`` filled in for this platform,
        built by ``events.identity_ref`` (the one canonicalisation of this sighting: the
        ref carries its proof, so validation and the projection do not redo it)."""
        raw = raw.strip()
        try:
            return identity_ref(self.platform, raw, name.strip(), is_self)
        except InvalidEvent as exc:
            raise DecodeError(f"{self.codec}: bad identity {raw!r}: {exc}") from exc

    def __repr__(self) -> str:
        return f"<{type(self).__name__} codec={self.codec!r} platform={self.platform!r}>"


# --------------------------------------------------------------------------- parsing


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_payload(payload: Any, codec: str) -> dict[str, Any]:
    """The payload as a JSON object: a dict is used as is, a str is parsed."""
    if isinstance(payload, (bytes, bytearray)):
        try:
            payload = payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"{codec}: payload is not UTF-8 ({exc})") from None
    if isinstance(payload, str):
        try:
            payload = json.loads(payload, parse_constant=_reject_constant)
        except RecursionError:
            raise DecodeError(f"{codec}: payload JSON is nested too deeply") from None
        except ValueError as exc:  # JSONDecodeError is a ValueError
            raise DecodeError(f"{codec}: payload is not valid JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise DecodeError(
            f"{codec}: payload must be a JSON object, got {_json_type(payload)}"
        )
    return payload


# --------------------------------------------------------------------------- accessors


def int_value(codec: str, value: Any, where: str) -> int:
    """``value`` as a 64-bit integer: a JSON integer, an integral float, or a decimal
    string (protojson's spelling of int64/uint64)."""
    if isinstance(value, bool):
        raise DecodeError(f"{codec}: {where} must be an integer, got a boolean")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise DecodeError(f"{codec}: {where} must be an integer, got {value!r}")
        value = int(value)
    elif isinstance(value, str):
        if not _INT_RE.fullmatch(value.strip()):
            raise DecodeError(f"{codec}: {where} must be an integer, got the string {value[:40]!r}")
        value = int(value.strip())
    elif not isinstance(value, int):
        raise DecodeError(f"{codec}: {where} must be an integer, got {_json_type(value)}")
    if not _INT_MIN <= value <= _INT_MAX:
        raise DecodeError(f"{codec}: {where} is out of the 64-bit range ({value})")
    return cast(int, value)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class Reader:
    """Typed reads from one JSON object, with its path for error messages."""

    __slots__ = ("codec", "doc", "path")

    def __init__(self, codec: str, doc: dict[str, Any], path: str) -> None:
        self.codec = codec
        self.doc = doc
        self.path = path

    def fail(self, key: str | None, problem: str) -> DecodeError:
        where = f"{self.path}.{key}" if key is not None else self.path
        return DecodeError(f"{self.codec}: {where} {problem}")

    def has(self, key: str) -> bool:
        return self.doc.get(key) is not None

    # objects and arrays

    def obj(self, key: str) -> Reader | None:
        value = self.doc.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(key, f"must be an object, got {_json_type(value)}")
        return Reader(self.codec, value, f"{self.path}.{key}")

    def req_obj(self, key: str) -> Reader:
        found = self.obj(key)
        if found is None:
            raise self.fail(key, "is missing")
        return found

    def array(self, key: str) -> list[Any]:
        value = self.doc.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(key, f"must be an array, got {_json_type(value)}")
        return value

    def objs(self, key: str) -> list[Reader]:
        out = []
        for i, item in enumerate(self.array(key)):
            if not isinstance(item, dict):
                raise self.fail(f"{key}[{i}]", f"must be an object, got {_json_type(item)}")
            out.append(Reader(self.codec, item, f"{self.path}.{key}[{i}]"))
        return out

    def strs(self, key: str) -> list[str]:
        out = []
        for i, item in enumerate(self.array(key)):
            if not isinstance(item, str):
                raise self.fail(f"{key}[{i}]", f"must be a string, got {_json_type(item)}")
            out.append(item)
        return out

    # scalars

    def text(self, key: str) -> str:
        """A string, ``""`` when absent or null."""
        value = self.doc.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {_json_type(value)}")
        return value

    def req_text(self, key: str) -> str:
        value = self.text(key).strip()
        if not value:
            raise self.fail(key, "is missing or blank")
        return value

    def boolean(self, key: str) -> bool:
        value = self.doc.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.fail(key, f"must be a boolean, got {_json_type(value)}")
        return value

    def integer(self, key: str) -> int | None:
        """An integer; protojson writes 64-bit integers as decimal strings, accepted too."""
        value = self.doc.get(key)
        if value is None:
            return None
        return int_value(self.codec, value, f"{self.path}.{key}")

    def positive(self, key: str) -> int | None:
        """A positive integer, or None when absent; zero or less is an error."""
        value = self.integer(key)
        if value is not None and value <= 0:
            raise self.fail(key, f"must be positive, got {value}")
        return value

    def req_positive(self, key: str) -> int:
        value = self.positive(key)
        if value is None:
            raise self.fail(key, "is missing")
        return value

    def enum(self, key: str) -> str | int | None:
        """A protobuf enum as protojson writes it (the name) or as a number."""
        value = self.doc.get(key)
        if value is None:
            return None
        if isinstance(value, str):
            return value.strip()
        return self.integer(key)
