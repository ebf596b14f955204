"""``tidings status`` (issue 14 item 6), both backends: ``--url`` reads a running hub's live
figures; ``--db`` gives the durable ones from the store and names the rest as living only
in a running hub (no zeros that look like facts)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from helpers import create_account, create_channel, post_text
from live import LiveServer
from tidings.api import create_app
from tidings.cli import app

runner = CliRunner()


def test_status_from_a_running_hub_and_from_the_database(runtime, backend_url):
    with LiveServer(create_app(runtime, manage_runtime=True)) as server, server.client() as http:
        alice = create_account(http, "human", "alice", admin_token="tdg_test_admin")
        bot = create_account(http, "agent", "bot", admin_token="tdg_test_admin", owner=alice["id"])
        room = create_channel(http, alice["token"], "room", [bot["id"]])
        post_text(http, alice["token"], room, "@bot one")
        runtime.delivery.wait_idle()
        live = runner.invoke(app, ["status", "--url", server.url, "--token", "tdg_test_admin", "--json"])
        assert live.exit_code == 0, live.output
        data = json.loads(live.output)
        assert data["source"] == "running hub" and "delivery" in data["live"] and "ingest" in data["live"]
        refused = runner.invoke(app, ["status", "--url", server.url, "--token", alice["token"]])
        assert refused.exit_code == 1 and "403" in refused.output

        durable = runner.invoke(app, ["status", "--db", backend_url, "--json"])
        assert durable.exit_code == 0, durable.output
        data = json.loads(durable.output)
        assert data["source"] == "database"
        assert data["durable"]["owed"] == 1 and data["durable"]["backlog_total"] == 0
        assert "delivery counters" in data["only_in_a_running_hub"]
        table = runner.invoke(app, ["status", "--db", backend_url], terminal_width=200)
        assert "owed mentions" in table.output and "Only in a running hub" in table.output
