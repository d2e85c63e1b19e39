"""`bergstream produce`: realistic events into a Kafka topic."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bergstream.cli.options import CLIENT_CONFIG, DATA_DIR


@click.command()
@click.option("--topic", required=True, help="The Kafka topic.")
@click.option("--schema", default=None, help="playback or impression (default: the topic's name).")
@click.option("--count", type=int, required=True, help="How many records to send.")
@click.option("--rate", type=float, default=None, help="Records per second (default: as fast as possible).")
@click.option(
    "--late-fraction", type=float, default=0.0, show_default=True, help="Share of out-of-order events."
)
@click.option(
    "--bad-fraction", type=float, default=0.0, show_default=True, help="Share of malformed records."
)
@click.option("--encoding", type=click.Choice(["json", "avro"]), default="json", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--partitions", type=int, default=4, show_default=True, help="Partitions if the topic is created."
)
@click.option(
    "--ingestion-start",
    default=None,
    help="Stamp records as ingested from this ISO time on, with --ingestion-span (archives of past days).",
)
@click.option(
    "--ingestion-span", default=None, help="Spread the records' ingestion times evenly over this long (24h)."
)
@click.option(
    "--timestamp-jitter",
    default=None,
    help="With --ingestion-start: move each record's Kafka timestamp up to this much earlier, at random, so "
    "that timestamps go backwards inside a partition (10m).",
)
@click.option(
    "--bootstrap-servers",
    "--bootstrap-server",
    default=None,
    help="Kafka to send to (default: the site settings', else the local stack's).",
)
@CLIENT_CONFIG
@DATA_DIR
@click.option(
    "--schema-registry",
    default=None,
    metavar="URL",
    help="Register the schema under <topic>-value in this registry (`local`: the local stack's) and send "
    "values in its wire format.",
)
def produce(
    topic: str,
    schema: str | None,
    count: int,
    rate: float | None,
    late_fraction: float,
    bad_fraction: float,
    encoding: str,
    seed: int,
    partitions: int,
    ingestion_start: str | None,
    ingestion_span: str | None,
    timestamp_jitter: str | None,
    bootstrap_servers: str | None,
    client_config: Path | None,
    data_dir: Path | None,
    schema_registry: str | None,
) -> None:
    """Send realistic events, keyed by account id, into a Kafka topic."""
    from bergstream.cli.endpoints import Endpoints
    from bergstream.loadgen.producer import ProduceRequest
    from bergstream.loadgen.producer import produce as send
    from bergstream.timeparse import parse_duration, parse_instant

    endpoints = Endpoints.resolve(data_dir)
    request = ProduceRequest(
        topic=topic,
        schema=schema,
        count=count,
        rate=rate,
        late_fraction=late_fraction,
        bad_fraction=bad_fraction,
        encoding=encoding,  # type: ignore[arg-type]
        seed=seed,
        partitions=partitions,
        ingestion_start=parse_instant(ingestion_start, "--ingestion-start") if ingestion_start else None,
        ingestion_span=parse_duration(ingestion_span, "--ingestion-span") if ingestion_span else None,
        timestamp_jitter=parse_duration(timestamp_jitter, "--timestamp-jitter") if timestamp_jitter else None,
        schema_registry=endpoints.schema_registry(schema_registry),
    )
    settings = endpoints.kafka_client(bootstrap_servers, client_config)
    bootstrap = settings.pop("bootstrap.servers")
    report = send(request, bootstrap, producer_config=settings, show_progress=sys.stderr.isatty())
    click.echo(report.summary())
