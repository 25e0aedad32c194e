"""`gate`: serve (API + embedded workers), api, worker, images, record, admin, submit, coverage,
recordings.

Typer (on Click) parses the command line and Rich draws for terminals; this package only wires
commands to the service and to the client in gate_service/client/.
"""

from __future__ import annotations

import logging

import click
import typer

from . import recordings, server, submit
from .admin import admin

app = typer.Typer(
    name="gate",
    help="A self-hosted deploy gate for agent projects.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
server.register(app)
submit.register(app)
recordings.register(app)
app.add_typer(admin, name="admin")


@app.callback()
def _setup() -> None:
    """A self-hosted deploy gate for agent projects."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """Run `gate` with ``argv`` (default: the process's) and return its exit code."""
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="gate", standalone_mode=True)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        click.echo(str(exc.code), err=True)
        return 1
    return 0
