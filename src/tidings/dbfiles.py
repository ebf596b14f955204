"""No command leaves behind a database file it created and then failed to use.

``removed_on_failure(url)`` wraps the work of a command: if ``url`` is a SQLite path that
did not exist before and the work raises (or the command reports failure through
``Failed``), the new file and its ``-wal``/``-shm`` companions are removed. An existing
file, or a PostgreSQL database, is never touched.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def sqlite_path(url: str) -> str | None:
    if url.startswith(("postgres://", "postgresql://", "postgresql+")):
        return None
    if url.startswith("sqlite:///"):
        return url[len("sqlite:///"):]
    if url.startswith("sqlite:"):
        return None
    return url


@contextlib.contextmanager
def removed_on_failure(url: str) -> Iterator[None]:
    path = sqlite_path(url)
    new = path is not None and not os.path.exists(path)
    try:
        yield
    except BaseException:
        if new:
            remove(path)
        raise


def remove(path: str | None) -> None:
    if path is None:
        return
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)


def existed(url: str) -> bool:
    path = sqlite_path(url)
    return path is None or os.path.exists(path)
