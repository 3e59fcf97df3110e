"""`pin-identity embedded info`: where the embedded PostgreSQL and broker are and whether they run (it only
looks: the next command that needs a server starts it); `embedded fetch`: the broker's release, fetched once.
"""

from __future__ import annotations

import typer

from pin_identity.composition.embedded_servers import embedded_servers, fetch_embedded_kafka
from pin_identity.config import Settings, load_settings
from pin_identity.entrypoints import cli_output as out
from pin_identity.entrypoints.cli_common import JsonOption
from pin_identity.entrypoints.documents import EmbeddedBroker, EmbeddedInfo, EmbeddedPostgres


def embedded_info(as_json: JsonOption = False) -> None:
    """Where the embedded PostgreSQL and broker are (URL, address, data dir) and whether each is running."""
    settings = load_settings()
    if as_json:
        _print_json(settings)
        return
    data_dir = settings.data_dir.resolve()
    postgres, broker = embedded_servers(settings)
    typer.echo(f"data dir  {data_dir}")
    typer.echo(f"postgres  {postgres.state('PIN_IDENTITY_DATABASE_URL')}")
    typer.echo(f"broker    {broker.state('PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS')}")
    if postgres.running:
        typer.echo(f"\npsql '{postgres.address}'")
    if broker.running:
        typer.echo(f"kcat -b {broker.address} -L")


def _print_json(settings: Settings) -> None:
    postgres, broker = embedded_servers(settings)
    postgres_json = EmbeddedPostgres(
        software=postgres.software,
        url=postgres.address,
        running=postgres.running,
        pid=postgres.pid,
        in_use=postgres.in_use,
        log_file=postgres.log_file,
    )
    broker_json = EmbeddedBroker(
        software=broker.software,
        bootstrap_servers=broker.address,
        running=broker.running,
        pid=broker.pid,
        in_use=broker.in_use,
        log_file=broker.log_file,
    )
    data_dir = settings.data_dir.resolve()
    out.print_json(EmbeddedInfo(data_dir=data_dir, postgres=postgres_json, broker=broker_json))


def embedded_fetch() -> None:
    """Fetch the embedded Apache Kafka (with Maven, into a cache outside the repository) unless it is there
    already or PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS names a broker of one's own."""
    runtime = fetch_embedded_kafka(load_settings())
    if runtime is None:
        typer.echo("embedded Apache Kafka not needed: PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS is set")
        return
    typer.echo(f"Apache Kafka {runtime.version} in {runtime.lib.parent} (Java: {runtime.java})")
