"""Attachment bytes, content-addressed: a blob's name is the SHA-256 of its bytes.

``BlobStore`` is the one small interface (an object store can implement it);
``FolderBlobStore`` keeps blobs in a folder, ``<root>/ab/cd/<sha256>``.

Invariants: a blob is visible under its name only once all its bytes are durable and
their hash equals the name (written to a temporary file in the same folder, fsynced,
checked, then renamed into place; a mismatch or an overrun leaves nothing behind). The
same bytes uploaded twice are stored once.

Default folder (``default_dir``): beside a SQLite database, ``<db file>.attachments``;
for PostgreSQL ``$XDG_DATA_HOME/tidings/attachments`` (``~/.local/share/...``).
``TIDINGS_ATTACHMENTS_DIR`` or ``tidings serve --attachments-dir`` replace it.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import BinaryIO, Protocol

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class HashMismatch(Exception):
    """The bytes do not hash to the name they were uploaded under."""


class BlobTooLarge(Exception):
    """More bytes than the limit."""


class BlobWriter(Protocol):
    def write(self, chunk: bytes) -> None: ...
    def commit(self) -> int: ...
    def abort(self) -> None: ...


class BlobStore(Protocol):
    def has(self, sha256: str) -> bool: ...
    def writer(self, sha256: str, max_bytes: int) -> BlobWriter: ...
    def open(self, sha256: str) -> BinaryIO: ...


def default_dir(db_url: str) -> Path:
    env = os.environ.get("TIDINGS_ATTACHMENTS_DIR")
    if env:
        return Path(env)
    if db_url.startswith(("postgresql:", "postgres:", "postgresql+")):
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(base) / "tidings" / "attachments"
    path = db_url.removeprefix("sqlite:///")
    return Path(f"{path}.attachments")


class _FolderWriter:
    def __init__(self, store: FolderBlobStore, sha256: str, max_bytes: int) -> None:
        self.store, self.sha256, self.max_bytes = store, sha256, max_bytes
        self.final = store.path_of(sha256)
        self.final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".upload-", dir=self.final.parent)
        self.file = os.fdopen(fd, "wb")
        self.tmp = Path(tmp)
        self.hasher = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            self.abort()
            raise BlobTooLarge(f"more than {self.max_bytes} bytes")
        self.hasher.update(chunk)
        self.file.write(chunk)

    def commit(self) -> int:
        """Check the hash and publish the blob; the number of bytes."""
        if self.hasher.hexdigest() != self.sha256:
            self.abort()
            raise HashMismatch(f"the bytes hash to {self.hasher.hexdigest()}, not {self.sha256}")
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.final)
        return self.size

    def abort(self) -> None:
        if not self.file.closed:
            self.file.close()
        self.tmp.unlink(missing_ok=True)


class FolderBlobStore:
    """Blobs as files under ``root`` (created on the first write)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path_of(self, sha256: str) -> Path:
        if not SHA256_HEX.match(sha256):
            raise ValueError("not a sha256 hex digest")
        return self.root / sha256[:2] / sha256[2:4] / sha256

    def has(self, sha256: str) -> bool:
        return SHA256_HEX.match(sha256 or "") is not None and self.path_of(sha256).is_file()

    def writer(self, sha256: str, max_bytes: int) -> _FolderWriter:
        return _FolderWriter(self, sha256, max_bytes)

    def open(self, sha256: str) -> BinaryIO:
        return self.path_of(sha256).open("rb")
