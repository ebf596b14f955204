"""``tidings ingest FILE --bridge ID`` on both backends: append with a bar, drain, counters."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from tidings.bridges.registry import create_bridge
from tidings.cli import app
from tidings.ingest.cli import run_ingest
from tidings.store import inbox as inbox_store
from tidings.store.engine import Store

SAMPLE = Path(__file__).parent / "fixtures" / "signal_sample.jsonl"


def consoles():
    out, err = io.StringIO(), io.StringIO()
    return out, err, Console(file=out, width=120), Console(file=err, width=200)


def new_bridge(url: str, platform: str = "signal") -> str:
    store = Store(url)
    try:
        return create_bridge(store, platform=platform, name="cli")["id"]
    finally:
        store.dispose()


def inbox_rows(url: str) -> list[tuple]:
    store = Store(url)
    try:
        with store.read() as tx:
            return tx.raw("SELECT outcome, cause FROM inbox").fetchall()
    finally:
        store.dispose()


def test_ingest_appends_drains_and_prints_counters(backend_url):
    bridge = new_bridge(backend_url)
    out, err, out_c, err_c = consoles()
    code = run_ingest(SAMPLE, bridge, backend_url, out_c, err_c)
    assert code == 0, err.getvalue()
    n = sum(1 for line in SAMPLE.read_text().splitlines() if line.strip())
    rows = inbox_rows(backend_url)
    assert len(rows) == n and all(outcome == "applied" for outcome, _ in rows)
    text = out.getvalue()
    assert "appending" in text and "draining" in text and "projected" in text and str(n) in text
    # Running it again appends nothing new: every frame is a replay.
    out, err, out_c, err_c = consoles()
    assert run_ingest(SAMPLE, bridge, backend_url, out_c, err_c) == 0
    assert len(inbox_rows(backend_url)) == n
    assert re.search(rf"replays in this file\W+{n}\b", out.getvalue()), out.getvalue()


def test_a_bad_line_appends_nothing_and_names_the_line(backend_url, tmp_path):
    bridge = new_bridge(backend_url)
    lines = SAMPLE.read_text().splitlines()[:3]
    bad = json.loads(lines[1])
    del bad["dedupe_key"]
    path = tmp_path / "frames.jsonl"
    path.write_text("\n".join([lines[0], "", json.dumps(bad), lines[2]]) + "\n")
    out, err, out_c, err_c = consoles()
    assert run_ingest(path, bridge, backend_url, out_c, err_c) == 1
    assert "line 3: dedupe_key is required" in err.getvalue()
    assert inbox_rows(backend_url) == []
    path.write_text(lines[0] + "\n{not json\n")
    out, err, out_c, err_c = consoles()
    assert run_ingest(path, bridge, backend_url, out_c, err_c) == 1
    assert "line 2: not valid JSON" in err.getvalue()


def test_unknown_bridge_is_an_error(backend_url):
    new_bridge(backend_url)
    out, err, out_c, err_c = consoles()
    assert run_ingest(SAMPLE, "br_nope", backend_url, out_c, err_c) == 1
    assert "no bridge 'br_nope'" in err.getvalue()


def test_quarantined_frames_are_reported_not_fatal(backend_url, tmp_path):
    bridge = new_bridge(backend_url)
    path = tmp_path / "frames.jsonl"
    path.write_text(json.dumps({"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": "",
                                "payload": {"jsonrpc": "2.0", "method": "nope"}}) + "\n")
    out, err, out_c, err_c = consoles()
    assert run_ingest(path, bridge, backend_url, out_c, err_c) == 0
    [(outcome, cause)] = inbox_rows(backend_url)
    assert outcome == "quarantined" and cause
    assert "quarantined" in out.getvalue()


def test_the_typer_command_wires_it(backend_url):
    bridge = new_bridge(backend_url)
    result = CliRunner().invoke(app, ["ingest", str(SAMPLE), "--bridge", bridge, "--db", backend_url])
    assert result.exit_code == 0, result.output
    with_store = Store(backend_url)
    try:
        with with_store.read() as tx:
            assert inbox_store.backlog(tx) == 0
    finally:
        with_store.dispose()


def test_ingest_through_a_running_hub_with_the_bridge_token(runtime):
    from live import LiveServer
    from tidings.api import create_app
    from tidings.ingest.cli import run_ingest_http

    bridge = create_bridge(runtime.store, platform="signal", name="phone")
    out, err, out_console, err_console = consoles()
    with LiveServer(create_app(runtime)) as server:
        code = run_ingest_http(SAMPLE, bridge["id"], server.url, bridge["token"], out_console, err_console)
        assert code == 0, err.getvalue()
        assert "replays" in out.getvalue()
        # A second run of the same file: every keyed frame is a replay, nothing new.
        code = run_ingest_http(SAMPLE, bridge["id"], server.url, bridge["token"], out_console, err_console)
        assert code == 0
        # The wrong token is refused with the server's reason, exit 1.
        code = run_ingest_http(SAMPLE, bridge["id"], server.url, "tdg_wrong", out_console, err_console)
        assert code == 1 and "401" in err.getvalue()
    with runtime.store.read() as tx:
        assert inbox_store.backlog(tx) == 0
        assert tx.raw("SELECT COUNT(*) FROM bridge_messages").fetchone()[0] > 0
