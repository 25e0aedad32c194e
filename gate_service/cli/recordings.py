"""`gate recordings GATE_ID --out DIR`: a live gate's model calls as a replay suite.

Writes ``DIR/tests/recordings/<agent>/*.json`` (DIR is the project folder), which replay mode
reads. Exit 0 when written; 2 when the gate or its token is refused, the gate cannot be
reached, or a path in the answer would leave DIR.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import DEFAULT_URL, Token, Url

EXIT_ERROR = 2


def recordings(
    gate_id: Annotated[str, typer.Argument(help="the gate whose model calls to export")],
    out: Annotated[
        Path,
        typer.Option(
            "--out", file_okay=False, help="the project folder; files go to tests/recordings/"
        ),
    ] = Path("."),
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Write a gate's answered model calls as replay recordings under DIR."""
    import httpx

    from ..client.api import GateAPIError, GateClient
    from ..client.recordings import RecordingRefused, write_recordings
    from ..client.render import visible

    client = GateClient(url, token=token)
    try:
        answer = client.recordings(gate_id)
    except GateAPIError as exc:
        typer.echo(f"gate recordings: {visible(exc)}", err=True)
        raise typer.Exit(EXIT_ERROR) from exc
    except httpx.HTTPError as exc:
        typer.echo(f"gate recordings: cannot reach the gate at {url}: {exc}", err=True)
        raise typer.Exit(EXIT_ERROR) from exc
    finally:
        client.close()
    try:
        per_agent = write_recordings(answer, out)
    except (RecordingRefused, OSError) as exc:
        typer.echo(f"gate recordings: {visible(exc)}", err=True)
        raise typer.Exit(EXIT_ERROR) from exc
    for agent, files in sorted(per_agent.items()):
        typer.echo(f"{visible(agent)}: {files} file(s)")
    total = sum(per_agent.values())
    typer.echo(f"{total} recording(s) written under {out / 'tests' / 'recordings'}")
    left_out = int(answer.get("left_out") or 0)
    if left_out:
        typer.echo(
            f"{left_out} answered call(s) left out: their answer was too large to store, or "
            "their agent's name cannot be a folder name"
        )


def register(app: typer.Typer) -> None:
    app.command()(recordings)
