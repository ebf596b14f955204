"""Small helpers shared by test modules (import as ``from helpers import ...``)."""

from __future__ import annotations


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- over HTTP, against a live or in-process app (``http`` is an httpx-like client) ---------
def create_account(http, kind: str, handle: str, *, admin_token: str, **extra) -> dict:
    """``POST /api/v1/accounts`` as the admin; the created account (with its token)."""
    r = http.post("/api/v1/accounts", json={"kind": kind, "handle": handle, **extra}, headers=auth(admin_token))
    assert r.status_code == 201, r.text
    return r.json()


def create_channel(http, token: str, name: str, members=()) -> str:
    """``POST /api/v1/channels``; the new channel's id."""
    r = http.post("/api/v1/channels", json={"name": name, "members": list(members)}, headers=auth(token))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def post_text(http, token: str, channel_id: str, text: str) -> dict:
    """``POST /api/v1/channels/{id}/messages``; the stored message."""
    r = http.post(f"/api/v1/channels/{channel_id}/messages", json={"text": text}, headers=auth(token))
    assert r.status_code == 201, r.text
    return r.json()["message"]


def truncate_pg(url: str) -> None:
    """Empty a migrated PostgreSQL test database, as a fresh one would be: every table but
    the migration record truncated (sequences restarted), and the roster epoch's one row
    (migration 0014) kept and set back to 0."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tablename NOT IN ('schema_migrations', 'roster_epoch')"
        ).fetchall()]
        if tables:
            conn.execute("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE")
        conn.execute("UPDATE roster_epoch SET epoch = 0")
