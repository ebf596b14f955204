"""SQLite stays single-process, honestly: a second ``tidings serve`` on the same file
refuses to start with one clear line, while tools that open the file keep working."""

from __future__ import annotations

import subprocess

from cluster_harness import ADMIN_TOKEN, TIDINGS, Node, until


def test_a_second_server_on_one_sqlite_file_refuses_with_one_line(tmp_path):
    db = str(tmp_path / "hub.db")
    first = Node(db, tmp_path, "first")
    try:
        until(first.ready, 60, what="the first server")
        second = subprocess.run([str(TIDINGS), "serve", "--db", db, "--port", "1"], capture_output=True, text=True,
                                timeout=60, env={"TIDINGS_ADMIN_TOKEN": ADMIN_TOKEN, "PATH": "/usr/bin:/bin"})
        assert second.returncode == 1
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert "another tidings server already holds" in lines[0] and "postgresql" in lines[0]
        status = subprocess.run([str(TIDINGS), "status", "--db", db, "--json"], capture_output=True, text=True,
                                timeout=60)
        assert status.returncode == 0, status.stderr
        assert first.ready()  # the first server never noticed
    finally:
        first.stop()
    # once the first server is gone the file is free again
    again = Node(db, tmp_path, "again")
    try:
        until(again.ready, 60, what="a server after the first stopped")
    finally:
        again.stop()
