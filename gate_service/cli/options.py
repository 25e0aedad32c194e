"""Options shared by the commands that talk to a gate's API."""

from __future__ import annotations

from typing import Annotated

import typer

DEFAULT_URL = "http://127.0.0.1:8080"

Url = Annotated[
    str,
    typer.Option("--url", envvar="GATE_URL", help="the gate's API", show_envvar=True),
]
Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="GATE_TOKEN",
        help="bearer token of a project",
        show_envvar=True,
        show_default=False,
    ),
]
