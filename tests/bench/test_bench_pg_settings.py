"""The bench's ``--pg-synchronous-commit off`` diagnostic changes what it says it changes.

Its figures are only worth reading if every PostgreSQL database the bench hands out (for
ours, the raw floors and the naive baseline alike) really runs with the setting, and if
the default leaves the server's own setting alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import benchlib  # noqa: E402


def _setting(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
    assert row is not None
    return str(row[0])


def test_the_diagnostic_sets_synchronous_commit_off_on_every_bench_database_and_the_default_does_not(monkeypatch):
    dbs = benchlib.Databases()
    try:
        default = _setting(dbs.fresh("postgresql", "sync_default"))
        monkeypatch.setattr(benchlib.Databases, "pg_settings", {"synchronous_commit": "off"})
        assert [_setting(dbs.fresh("postgresql", f"sync_off{i}")) for i in range(2)] == ["off", "off"]
    finally:
        dbs.close()
    assert default == _setting(benchlib.PG_ADMIN_URL) != "off"
