"""The configuration file (issue 14 item 5): precedence flag > TIDINGS_* > file > default,
``tidings init`` writes a commented example that loads as is, and a bad file is refused at
start with the line and the reason. One real process starts from a config file (both
backends): its port, admin-token file, metrics listener and database all come from it."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest
from typer.testing import CliRunner

from test_serve_process import CLI, Serve, free_port
from tidings.cli import app
from tidings.config import EXAMPLE, ConfigError, load_file, resolve

runner = CliRunner()


def test_init_writes_an_example_that_loads_and_never_overwrites(tmp_path):
    path = tmp_path / "tidings.toml"
    r = runner.invoke(app, ["init", str(path)])
    assert r.exit_code == 0, r.output
    assert path.read_text() == EXAMPLE and "#" in EXAMPLE
    assert load_file(path)["port"] == 7860
    again = runner.invoke(app, ["init", str(path)])
    assert again.exit_code == 1 and "exists" in again.output


def test_precedence_flag_over_env_over_file_over_default(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('[server]\nport = 9000\nhost = "0.0.0.0"\n[log]\nlevel = "debug"\n')
    s = resolve(str(path), {"port": None, "host": None, "db": None}, env={})
    assert (s.port, s.host, s.log_level, s.db) == (9000, "0.0.0.0", "debug", "./tidings.db")
    s = resolve(str(path), {"port": None}, env={"TIDINGS_PORT": "9100", "TIDINGS_LOG_LEVEL": "ERROR"})
    assert (s.port, s.log_level, s.origin["port"]) == (9100, "error", "env")
    s = resolve(str(path), {"port": 9200}, env={"TIDINGS_PORT": "9100"})
    assert (s.port, s.origin["port"], s.origin["host"]) == (9200, "flag", "file")


@pytest.mark.parametrize("text, needle", [
    ("[server]\nport = \n", "line 2"),                                  # TOML syntax (tomllib's line)
    ("[server]\nhost = \"x\"\nport = \"eighty\"\n", "line 3: [server] port: must be an integer"),
    ("[server]\nprot = 80\n", "line 2: [server] prot: unknown key"),
    ("[log]\nlevel = \"loud\"\n", "line 2: [log] level: must be one of"),
    ("\n[nope]\nx = 1\n", "line 2: unknown section [nope]"),
    ("[limits]\nmax_body_bytes = -1\n", "must be positive"),
])
def test_a_bad_file_is_refused_with_the_line_and_the_reason(tmp_path, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_file(path)
    assert needle in str(info.value), str(info.value)
    run = subprocess.run([*CLI, "serve", "--config", str(path)], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert run.returncode == 2 and needle in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]  # nothing created


def test_serve_from_a_config_file(backend_url, tmp_path):
    port, metrics_port = free_port(), free_port()
    token_file = tmp_path / "admin-token"
    path = tmp_path / "tidings.toml"
    path.write_text(
        f'[database]\nurl = "{backend_url}"\n[server]\nport = {port}\nadmin_token_file = "{token_file}"\n'
        f'metrics_bind = "127.0.0.1:{metrics_port}"\n[delivery]\nkeepalive_s = 5\n'
    )
    hub = Serve("--config", str(path), env={"TIDINGS_ADMIN_TOKEN": ""})
    try:
        hub.wait_line(f"metrics on http://127.0.0.1:{metrics_port}")
        assert "admin token (shown once" not in "".join(hub.stdout)
        token = token_file.read_text().strip()
        assert oct(os.stat(token_file).st_mode & 0o777) == "0o600"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            assert http.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).json()["scope"] == "admin"
        r = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        assert r.status_code == 200 and "tidings_delivery_owed" in r.text
    finally:
        hub.proc.send_signal(2)
        hub.proc.wait(10)
        hub.stop()
