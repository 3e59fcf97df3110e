"""`pin-identity embedded info`: where the embedded PostgreSQL and broker are and whether they run.

It only looks: nothing is started. The next command that needs a server starts it, the way every command does.
"""

from __future__ import annotations

import json

import typer

from pin_identity.composition import embedded_servers
from pin_identity.config import load_settings
from pin_identity.entrypoints.cli_common import JsonOption


def embedded_info(as_json: JsonOption = False) -> None:
    """Where the embedded PostgreSQL and broker are (URL, address, data dir) and whether each is running."""
    settings = load_settings()
    data_dir = settings.data_dir.resolve()
    postgres, broker = embedded_servers(settings)
    if as_json:
        document = {
            "dataDir": str(data_dir),
            "postgres": postgres.as_json("url"),
            "broker": broker.as_json("bootstrapServers"),
        }
        typer.echo(json.dumps(document))
        return
    typer.echo(f"data dir  {data_dir}")
    typer.echo(f"postgres  {postgres.state('PIN_IDENTITY_DATABASE_URL')}")
    typer.echo(f"broker    {broker.state('PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS')}")
    if postgres.running:
        typer.echo(f"\npsql '{postgres.address}'")
    if broker.running:
        typer.echo(f"kcat -b {broker.address} -L")
