"""SQLite runs one server per database file: a second ``tidings serve`` refuses to start.

The first server takes an exclusive, non-blocking ``flock`` on ``<file>.serve-lock`` for
its whole lifetime; the kernel drops it when the process exits, however it exits. Tools
that open the file directly (``tidings status``, ``tidings mcp --db``) never take it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


class AnotherServer(Exception):
    """Another server process holds the SQLite file."""


def hold_sqlite_file(db_path: str) -> IO[bytes]:
    """Take the one-server lock of ``db_path``; keep the returned handle open while serving."""
    path = Path(db_path).expanduser()
    lock_path = path.with_name(path.name + ".serve-lock")
    handle = open(lock_path, "a+b")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise AnotherServer(
            f"another tidings server already holds {path}; SQLite runs one server per file "
            "(use a postgresql:// database to run several)"
        ) from None
    handle.truncate(0)
    handle.write(str(os.getpid()).encode())
    handle.flush()
    return handle
