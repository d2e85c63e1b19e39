"""`bergstream demo`: the whole path on embedded defaults, from producers to the archive and back out of
it as a backfill, then stopped."""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bergstream.cli.options import DATA_DIR

if TYPE_CHECKING:
    from rich.table import Table

    from bergstream.local import LocalStack
    from bergstream.schemas.event_schema import Encoding

# As the topics' files in deploy/topics say.
ENCODING: dict[str, Encoding] = {"playback": "json", "impression": "avro"}
DEMO_SPAN = timedelta(hours=2)


@click.command()
@DATA_DIR
@click.option("--count", type=int, default=20_000, show_default=True, help="Records per topic.")
def demo(data_dir: Path | None, count: int) -> None:
    """Start the stack, produce both topics, archive them into Iceberg, summarise, stop."""
    from bergstream.cli.endpoints import Endpoints

    run_demo(Endpoints.local_stack(data_dir).data_dir / "demo", count)


def run_demo(data_dir: Path, count: int) -> None:
    from rich.console import Console

    from bergstream.cli.endpoints import Endpoints
    from bergstream.cli.router import topic_loader
    from bergstream.deploy import EXAMPLE_APPS_DIR, EXAMPLE_TOPICS_DIR
    from bergstream.loadgen.events import TOPICS
    from bergstream.loadgen.producer import ProduceRequest, produce
    from bergstream.local import LocalStack, StackConfig
    from bergstream.local.processes import free_ports
    from bergstream.router.driver.launch import Launch, launch
    from bergstream.runtime.run import run_app
    from bergstream.runtime.settings import load_app_settings
    from bergstream.schemas.archive import DEAD_LETTER_SUFFIX
    from bergstream.spark import build_spark_session

    console = Console()
    leftover = LocalStack.at(data_dir)
    if leftover.status().running:  # a demo interrupted earlier: stop its broker before removing its data
        leftover.down()
    shutil.rmtree(data_dir, ignore_errors=True)
    kafka_port, controller_port = free_ports(2)
    stack = LocalStack(StackConfig(data_dir=data_dir, kafka_port=kafka_port, controller_port=controller_port))
    started = time.monotonic()
    console.rule("[bold]bergstream demo")
    status = stack.up()
    console.print(
        f"Kafka broker on {status.bootstrap_servers} (KRaft, pid {status.broker_pid}), "
        f"Iceberg catalog {status.catalog_uri}, warehouse {status.warehouse}"
    )
    # Two past hours of traffic, as a router archives it, for the backfill to read back.
    first_hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - DEMO_SPAN
    try:
        console.rule(f"Producing {DEMO_SPAN} of traffic from {first_hour:%Y-%m-%d %H:%M} UTC")
        for topic in TOPICS:
            request = ProduceRequest(
                topic=topic,
                count=count,
                late_fraction=0.05,
                bad_fraction=0.01,
                encoding=ENCODING[topic],
                seed=7,
                ingestion_start=first_hour,
                ingestion_span=DEMO_SPAN,
            )
            report = produce(request, status.bootstrap_servers, show_progress=console.is_terminal)
            console.print(report.summary())
        console.rule("Archiving into Iceberg")
        catalog = stack.config.catalog
        # The demo's own stack, whatever BERGSTREAM_SITE names, and the settings files bergstream ships
        # (deploy/topics and deploy/apps), wherever the demo is started.
        endpoints = Endpoints(data_dir=data_dir, site=None)
        spark = build_spark_session(catalog, app_name="bergstream-demo")
        try:
            console.print(f"bergstream router run --topic {' --topic '.join(TOPICS)} --available-now")
            load = topic_loader(endpoints, None, EXAMPLE_TOPICS_DIR, {})
            for outcome in launch(Launch(list(TOPICS), load, available_now=True), spark):
                totals = outcome.totals
                console.print(
                    f"{outcome.topic}: read {totals.read} records, archived {totals.archived} rows into "
                    f"{catalog.table_identifier(outcome.topic)}, dead-lettered {totals.dead_lettered} into "
                    f"{catalog.table_identifier(outcome.topic)}{DEAD_LETTER_SUFFIX}, {totals.files} files"
                )
            console.rule("Backfilling the sessionizer from the archive, B = 15 minutes")
            settings = load_app_settings(
                "sessionizer",
                EXAMPLE_APPS_DIR / "sessionizer.yaml",
                defaults={
                    **endpoints.app_defaults("sessionizer"),
                    "checkpoint_location": str(data_dir / "apps" / "sessionizer-backfill"),
                },
                overrides={
                    "mode": "backfill",
                    "backfill": {
                        "start": first_hour,
                        "end": first_hour + DEMO_SPAN,
                        "max_misalignment": "15m",
                    },
                },
            )
            console.print(
                f"bergstream backfill run --app sessionizer --start {first_hour.isoformat()} "
                f"--end {(first_hour + DEMO_SPAN).isoformat()} --max-misalignment 15m"
            )
            for line in run_app(spark, settings, show_progress=console.is_terminal).lines():
                console.print(line, highlight=False)
        finally:
            spark.stop()
        console.rule("The archive")
        for topic in TOPICS:
            console.print(_archive_summary(stack, topic))
    finally:
        stack.down()
    console.print(
        f"demo done in {time.monotonic() - started:.0f}s; the stack is stopped, its data is in {data_dir}"
    )


def _archive_summary(stack: LocalStack, topic: str) -> Table:
    from rich.table import Table

    from bergstream.schemas.archive import DEAD_LETTER_SUFFIX

    catalog = stack.config.catalog
    iceberg = catalog.load()
    table = iceberg.load_table(f"{catalog.namespace}.{topic}")
    partitions = table.inspect.partitions().to_pylist()
    files = table.inspect.files().to_pylist()
    dead_letters = iceberg.load_table(f"{catalog.namespace}.{topic}{DEAD_LETTER_SUFFIX}").scan(
        selected_fields=("error",)
    )
    errors: dict[str, int] = {}
    for error in dead_letters.to_arrow().column("error").to_pylist():
        errors[error] = errors.get(error, 0) + 1
    kafka_bytes = sum(path.stat().st_size for path in (stack.config.broker.log_dir).glob(f"{topic}-*/*.log"))
    archive_bytes = sum(f["file_size_in_bytes"] for f in files)
    summary = Table(
        title=f"{catalog.table_identifier(topic)}: {len(files)} files, {archive_bytes / 1e6:.2f} MB "
        f"(Kafka log {kafka_bytes / 1e6:.2f} MB, ratio {kafka_bytes / max(archive_bytes, 1):.1f}x)"
    )
    summary.add_column("ingestion hour")
    summary.add_column("rows", justify="right")
    summary.add_column("files", justify="right")
    (hour_field,) = table.spec().fields
    for row in sorted(partitions, key=lambda r: r["partition"][hour_field.name]):
        hour = row["partition"][hour_field.name]
        summary.add_row(
            time.strftime("%Y-%m-%d %H:00 UTC", time.gmtime(hour * 3600)),
            str(row["record_count"]),
            str(row["file_count"]),
        )
    for error, n in sorted(errors.items()):
        summary.add_row(f"[red]dead-lettered: {error}", str(n), "")
    return summary
