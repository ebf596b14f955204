"""Help that reads well: flags render as flags, every command has an example, ``--version``.

``install(app)`` is called once by ``cli.py``: it adds the ``--version`` option, gives each
registered command an ``Example:`` epilog from ``EXAMPLES`` (a command without one fails
``tests/test_cli_polish.py``), and makes the help show a boolean flag as a bare flag rather
than ``--demo <bool>``.
"""

from __future__ import annotations

import typer
from typer.core import TyperOption

EXAMPLES = {
    "serve": "tidings serve --config tidings.toml    (or: tidings serve --demo)",
    "status": "tidings status --url http://127.0.0.1:7860    (or: tidings status --db ./tidings.db)",
    "ingest": "tidings ingest frames.jsonl --bridge br_... --db ./tidings.db",
    "replay": "tidings replay corpus.jsonl --out /tmp/replay.db --metrics metrics.json",
    "mcp": "tidings mcp --url http://127.0.0.1:7860 --token tdg_...",
    "init": "tidings init tidings.toml",
    "corpus synth": "tidings corpus synth --frames 10000 -o corpus.jsonl",
    "bridge signal": "tidings bridge signal --rpc tcp://127.0.0.1:7583 --account +15550100 "
    "--url http://127.0.0.1:7860 --token tdg_...",
}

_display_type_rich = TyperOption.display_type_rich


def _flag_aware(self: TyperOption, ctx):  # a flag takes no value: show no type
    return None if self.is_flag else _display_type_rich(self, ctx)


def _version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"tidings {__version__}")
        raise typer.Exit()


def install(app: typer.Typer, more_examples: dict[str, str] | None = None) -> None:
    TyperOption.display_type_rich = _flag_aware
    EXAMPLES.update(more_examples or {})

    @app.callback()
    def _root(
        version: bool | None = typer.Option(
            None, "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ) -> None:
        """Tidings: a durable message hub for people and AI agents."""

    _examples(app, "")


def _examples(typer_app: typer.Typer, prefix: str) -> None:
    for info in typer_app.registered_commands:
        name = prefix + (info.name or (info.callback.__name__ if info.callback else ""))
        if name in EXAMPLES and not info.epilog:
            info.epilog = f"Example: {EXAMPLES[name]}"
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _examples(group.typer_instance, f"{prefix}{group.name} ")
