"""`bergstream backfill`: plan a window of the archive, run an application over it, republish it to Kafka."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bergstream.cli.app import APP_OPTIONS, run_application
from bergstream.cli.correct import CORRECTION_COMMANDS
from bergstream.cli.options import (
    CLIENT_CONFIG,
    DATA_DIR,
    JSON_REPORT,
    SPARK_CONF,
    configure_logging,
    echo_lines,
    echo_report,
    key_values,
    reports_json,
    spark_overrides,
    with_options,
)

if TYPE_CHECKING:
    from bergstream.backfill.read.order import OrderingPolicy


@click.group()
def backfill() -> None:
    """Read archive tables back in lateness-bounded order: plan a window, run an application over it."""


WINDOW = [
    click.option(
        "--start", required=True, help="First ingestion time of the window, ISO (2026-11-22T00:00:00Z)."
    ),
    click.option("--end", required=True, help="End of the window, exclusive, ISO."),
    click.option(
        "--max-misalignment",
        default=None,
        help="B: no row is read after a row ingested more than this later (15m, 1h).",
    ),
    click.option("--region", "regions", multiple=True, help="Read only this cluster or region (repeatable)."),
    click.option("--strict", is_flag=True, help="Exact ingestion-time order, one reader per epoch."),
]
CATALOG_CONFIG = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A settings file whose catalog to use (default: the site's, else the local stack's).",
)


def _ordering(max_misalignment: str | None, strict: bool) -> OrderingPolicy:
    from bergstream.backfill.read.order import ordering
    from bergstream.timeparse import parse_duration

    bound = parse_duration(max_misalignment, "--max-misalignment") if max_misalignment else None
    return ordering(bound, strict)


@backfill.command("plan")
@click.option(
    "--table",
    "tables",
    multiple=True,
    required=True,
    help="Archive table: T, archive.T or catalog.archive.T.",
)
@with_options(WINDOW)
@CATALOG_CONFIG
@click.option("--json", "as_json", is_flag=True, help="Print the whole plan as JSON.")
@DATA_DIR
def backfill_plan(
    tables: tuple[str, ...],
    start: str,
    end: str,
    max_misalignment: str | None,
    regions: tuple[str, ...],
    strict: bool,
    config_file: Path | None,
    as_json: bool,
    data_dir: Path | None,
) -> None:
    """Print the epochs, splits, rows and bytes a backfill of the window would read."""
    from bergstream.backfill.read.batches import window_of
    from bergstream.backfill.read.planner import plan
    from bergstream.backfill.read.summary import plan_lines
    from bergstream.cli.endpoints import Endpoints

    order = _ordering(max_misalignment, strict)
    catalog = Endpoints.resolve(data_dir).catalog(config_file)
    made = plan(catalog, list(tables), window_of(start, end), order, list(regions) or None)
    if as_json:
        click.echo(made.dumps())
    else:
        echo_lines(plan_lines(made))


@backfill.command("run")
@with_options(APP_OPTIONS)
@with_options(WINDOW)
@click.option("--unordered", is_flag=True, help="Read the window in one epoch, in no order.")
@click.option(
    "--branch",
    default=None,
    help="Correct the window: write its rows into this branch of the output table, never into main, for "
    "`backfill audit` and `backfill publish`; --start and --end are then the window of the output's "
    "output.time_column that a publish replaces.",
)
@click.option(
    "--start-over",
    is_flag=True,
    help="With --branch: release the branch's correction (its rows, its run's checkpoint) and correct the "
    "window again with these settings; without it, a branch is resumed only with the settings it was "
    "written with.",
)
@DATA_DIR
@reports_json("backfill run")
def backfill_run(
    app: str,
    config_file: Path | None,
    entry: str | None,
    checkpoint: str | None,
    output_table: str | None,
    as_json: bool,
    spark_conf: tuple[str, ...],
    start: str,
    end: str,
    max_misalignment: str | None,
    regions: tuple[str, ...],
    strict: bool,
    unordered: bool,
    branch: str | None,
    start_over: bool,
    data_dir: Path | None,
) -> None:
    """Run an application over a window of its archive; the same command resumes a stopped run."""
    from bergstream.cli.endpoints import Endpoints
    from bergstream.runtime.checkpoint_names import backfill_checkpoint
    from bergstream.runtime.correct.checks import check_new_correction
    from bergstream.runtime.settings import UNORDERED, correction, load_app_settings

    configure_logging()
    if unordered and (max_misalignment or strict):
        raise click.UsageError("--unordered goes with neither --max-misalignment nor --strict")
    if start_over and branch is None:
        raise click.UsageError("--start-over starts a correction over: give its --branch")
    window: dict[str, Any] = {
        "start": start,
        "end": end,
        "max_misalignment": UNORDERED if unordered else max_misalignment,
        "strict": strict or None,
        "regions": list(regions) or None,
    }
    overrides = {"mode": "backfill", "entry": entry, "output_table": output_table, "backfill": window,
                 "spark": spark_overrides(spark_conf)}  # fmt: skip
    endpoints = Endpoints.resolve(data_dir)
    with endpoints.explained():
        settings = load_app_settings(app, config_file, endpoints.app_defaults(app), overrides)
    if branch is not None:
        # The window is the correction's; the read window is widened by the output's warm-up and settle.
        settings = check_new_correction(correction(settings, branch, start_over=start_over), checkpoint)
    else:
        checkpoint = checkpoint or backfill_checkpoint(settings)
        settings = settings.model_copy(update={"checkpoint_location": checkpoint})
    run_application(settings, True, as_json)


for command in CORRECTION_COMMANDS:
    backfill.add_command(command)


@backfill.command("release")
@click.option("--checkpoint", default=None, help="The checkpoint of the backfill given up.")
@click.option("--table", "tables", multiple=True,
              help="Release only this table (default: every table of the namespace it holds).")  # fmt: skip
@click.option("--app", default=None, help="With --branch: the application whose correction is released.")
@click.option("--branch", default=None, help="Remove this correction's branch, its tags and its record.")
@click.option(
    "--output-table", default=None,
    help="With --branch: the application's output table (default: its file's), as a correction's other "
    "commands take it.",
)  # fmt: skip
@CATALOG_CONFIG
@SPARK_CONF
@DATA_DIR
def backfill_release(
    checkpoint: str | None,
    tables: tuple[str, ...],
    app: str | None,
    branch: str | None,
    output_table: str | None,
    config_file: Path | None,
    spark_conf: tuple[str, ...],
    data_dir: Path | None,
) -> None:
    """Let maintenance expire the snapshots a backfill that will not be resumed still holds (--checkpoint),
    or remove a correction's branch and tags (--app, --branch): what is published stays published."""
    from bergstream.backfill.read.planner import table_ref
    from bergstream.cli.correct import release_correction
    from bergstream.cli.endpoints import Endpoints
    from bergstream.runtime.pins import held_by, release, tag_of

    if (app is None) != (branch is None):
        raise click.UsageError("--app and --branch go together")
    if (checkpoint is None) == (branch is None):
        raise click.UsageError(
            "give --checkpoint (a backfill's snapshots) or --app and --branch (a correction)"
        )
    if output_table is not None and branch is None:
        raise click.UsageError("--output-table names a correction's table: it goes with --app and --branch")
    if branch is not None:
        assert app is not None
        release_correction(app, branch, output_table, config_file, spark_conf, data_dir)
        return
    assert checkpoint is not None
    configure_logging()
    catalog = Endpoints.resolve(data_dir).catalog(config_file)
    names = [table_ref(t, catalog).identifier for t in tables] if tables else held_by(catalog, checkpoint)
    released = release(catalog, names, checkpoint)
    if released:
        click.echo(f"released {tag_of(checkpoint)} of {', '.join(released)}: the next maintenance may expire "
                   "its snapshots; the backfill of that checkpoint can no longer resume")  # fmt: skip
    else:
        click.echo(f"no table holds a snapshot for the backfill of {checkpoint}")


@backfill.command("replay")
@click.option("--table", required=True, help="Archive table: T, archive.T or catalog.archive.T.")
@with_options(WINDOW)
@click.option("--to-topic", required=True, help="The Kafka topic to republish into (created when missing).")
@click.option("--include-dead-letters", is_flag=True, help="Also republish the raw dead-lettered records.")
@click.option(
    "--bootstrap-servers",
    "--bootstrap-server",
    default=None,
    help="Kafka to send to (default: the site settings', else the local stack's).",
)
@click.option(
    "--partitions", type=int, default=None, help="Partitions of a new topic (default: as the source)."
)
@click.option("--schema", default=None, help="Event schema (default: the table's bergstream.schema).")
@click.option("--encoding", type=click.Choice(["json", "avro"]), default=None,
              help="Value encoding (default: the table's bergstream.encoding).")  # fmt: skip
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A topic's settings file: its catalog, and its schema_registry section (with its login) to encode "
    "values with (default: the site's catalog, else the local stack's; the registry the router recorded).",
)
@CLIENT_CONFIG
@click.option(
    "--producer-option",
    "--producer-property",
    "producer_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="librdkafka producer setting (linger.ms=50, ...), repeatable.",
)
@JSON_REPORT
@DATA_DIR
@reports_json("backfill replay")
def backfill_replay(
    table: str,
    start: str,
    end: str,
    max_misalignment: str | None,
    regions: tuple[str, ...],
    strict: bool,
    to_topic: str,
    include_dead_letters: bool,
    bootstrap_servers: str | None,
    partitions: int | None,
    schema: str | None,
    encoding: str | None,
    config_file: Path | None,
    client_config: Path | None,
    producer_options: tuple[str, ...],
    as_json: bool,
    data_dir: Path | None,
) -> None:
    """Republish a window of the archive into a Kafka topic in backfill order, for consumers outside Spark.

    Exactly once for consumers that read with isolation.level=read_committed: records go out in Kafka
    transactions, with the replay's progress in the compacted topic bergstream-replay.TO_TOPIC. The same
    command resumes a replay that stopped (a Kafka or Iceberg error, Ctrl-C, a killed process) at the
    snapshots its first run read, and sends nothing again once it is complete. Delete that topic to start
    the replays into TO_TOPIC over. Records of one source partition go out in offset order within each
    epoch; with --strict, in (ingestion time, partition, offset) order."""
    from bergstream.backfill.read.batches import window_of
    from bergstream.backfill.replay import replay
    from bergstream.cli.endpoints import Endpoints
    from bergstream.runtime.settings import registry_from_file

    configure_logging()
    endpoints = Endpoints.resolve(data_dir)
    producer_config: dict[str, Any] = endpoints.kafka_client(bootstrap_servers, client_config)
    producer_config.update(key_values(producer_options, "--producer-option"))
    order = _ordering(max_misalignment, strict)
    report = replay(
        endpoints.catalog(config_file), table, window_of(start, end), order, to_topic, producer_config,
        regions=list(regions) or None, include_dead_letters=include_dead_letters,
        schema=schema, encoding=encoding, partitions=partitions,
        schema_registry=registry_from_file(config_file) if config_file is not None else None,
    )  # fmt: skip
    echo_report(as_json, "backfill replay", asdict(report), [report.summary()])
