"""``tidings admin`` (issue 14 item 3), both backends: the same commands against a running
hub (``--url`` + admin token, over HTTP) and against the database (``--db``); token resets
revoke the old secret; ``admin token --reset --db`` rescues a hub whose admin token was lost."""

from __future__ import annotations

import json

import httpx
from typer.testing import CliRunner

from helpers import auth
from live import LiveServer
from tidings.api import create_app
from tidings.cli import app

runner = CliRunner()
ADMIN = "tdg_test_admin"


def run(*args: str) -> dict:
    r = runner.invoke(app, ["admin", *args], env={"TIDINGS_ADMIN_TOKEN": "", "TIDINGS_DB": ""})
    assert r.exit_code == 0, (args, r.output)
    return json.loads(r.output)


def fails(*args: str) -> str:
    r = runner.invoke(app, ["admin", *args], env={"TIDINGS_ADMIN_TOKEN": "", "TIDINGS_DB": ""})
    assert r.exit_code != 0, (args, r.output)
    return r.output


def test_admin_over_http_and_on_the_database(runtime, backend_url):
    with LiveServer(create_app(runtime, manage_runtime=True)) as server, server.client() as http:
        hub = ["--url", server.url, "--token", ADMIN]
        db = ["--db", backend_url]
        alice = run("accounts", "create", "--kind", "human", "--handle", "alice", *hub)
        bot = run("accounts", "create", "--kind", "agent", "--handle", "bot", "--owner", alice["id"], *db)
        assert http.get("/api/v1/me", headers=auth(bot["token"])).json()["account"]["handle"] == "bot"
        for way in (hub, db):
            handles = {a["handle"] for a in run("accounts", "list", *way)["accounts"]}
            assert {"alice", "bot"} <= handles
            assert run("accounts", "show", bot["id"], *way)["id"] == bot["id"]
        # the admin may enrol any agent (D42): a channel with alice, then bot subscribed
        ch = run("channels", "create", "ops", "--member", alice["id"], *hub)
        members = run("members", "add", ch["id"], bot["id"], "--subscribe", *db)["members"]
        assert {m["account_id"]: m["subscribed"] for m in members}[bot["id"]] is True
        assert {m["account_id"] for m in run("members", "list", ch["id"], *hub)["members"]} >= {alice["id"], bot["id"]}
        run("members", "remove", ch["id"], bot["id"], *hub)
        assert bot["id"] not in {m["account_id"] for m in run("members", "list", ch["id"], *db)["members"]}
        assert "ops" in {c["name"] for c in run("channels", "list", *db)["channels"]}
        # bridges and tokens
        bridge = run("bridges", "create", "--platform", "signal", "--name", "phone", "--owner", alice["id"], *db)
        assert bridge["id"] in {b["id"] for b in run("bridges", "list", *hub)["bridges"]}
        new = run("bridges", "token-reset", bridge["id"], *hub)
        assert new["revoked"] == 1
        frames = f"/api/v1/bridges/{bridge['id']}/frames"
        assert http.post(frames, json=[], headers=auth(bridge["token"])).status_code == 401
        assert http.post(frames, json=[], headers=auth(new["token"])).status_code != 401
        fresh = run("accounts", "token-reset", alice["id"], *db)
        assert http.get("/api/v1/me", headers=auth(alice["token"])).status_code == 401
        assert http.get("/api/v1/me", headers=auth(fresh["token"])).status_code == 200
        assert run("links", "list", bridge["id"], *db) == {"links": []}
        assert "unknown_conversation" in fails("links", "create", bridge["id"], "conv_nope", ch["id"], *hub)
        # errors are one line, never a traceback
        assert "unknown_account" in fails("accounts", "show", "acc_nope", *hub)
        assert "401" in fails("accounts", "list", "--url", server.url, "--token", "tdg_wrong")
        assert "either --url" in fails("accounts", "list", *hub, *db)
        # the admin token was lost: a new one from the database, the old one stops working
        rescued = run("token", "--reset", *db)
        assert rescued["revoked"] >= 1
        assert httpx.get(server.url + "/api/v1/accounts", headers=auth(ADMIN)).status_code == 401
        assert httpx.get(server.url + "/api/v1/accounts", headers=auth(rescued["token"])).status_code == 200


def test_admin_on_a_missing_database_creates_nothing(tmp_path):
    missing = tmp_path / "nope.db"
    assert "no database" in fails("accounts", "list", "--db", str(missing))
    assert not missing.exists()
