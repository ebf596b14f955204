"""CLI polish (issue 14 item 7): flags render as flags, every command has a one-line
description and an example, ``tidings --version``."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from tidings import __version__
from tidings.cli import app

runner = CliRunner()


def _commands(typer_app, prefix=()):
    import typer.main

    group = typer.main.get_command(typer_app)
    stack = [(group, prefix)]
    while stack:
        command, path = stack.pop()
        subs = getattr(command, "commands", None)
        if subs:
            for name, sub in subs.items():
                stack.append((sub, (*path, name)))
        if path:
            yield path, command


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"tidings {__version__}"


def test_every_command_has_a_description_an_example_and_no_bool_metavar():
    seen = []
    for path, command in _commands(app):
        r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"}, terminal_width=200)
        assert r.exit_code == 0, (path, r.output)
        assert "<bool>" not in r.output, (path, r.output)
        assert (command.help or "").strip(), path
        if not getattr(command, "commands", None):  # every leaf command
            assert re.search(r"Example: tidings ", r.output), (path, r.output)
        seen.append(" ".join(path))
    assert {"serve", "status", "ingest", "mcp"} <= set(seen)
