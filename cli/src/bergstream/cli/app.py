"""`bergstream app`: an application of the apps' folder run live, its named sources read from Kafka."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bergstream.cli.options import (
    DATA_DIR,
    JSON_REPORT,
    SPARK_CONF,
    configure_logging,
    echo_report,
    reports_json,
    spark_overrides,
    with_options,
)

if TYPE_CHECKING:
    from bergstream.runtime.settings import AppSettings

APP_OPTIONS = [
    click.option(
        "--app",
        required=True,
        help="The application: its settings are <apps dir>/<app>.yaml (deploy/apps, "
        "or $BERGSTREAM_APPS_DIR, or the site settings' apps_dir).",
    ),
    click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Settings file (default: <apps dir>/<app>.yaml).",
    ),
    click.option("--entry", default=None, help="Run this module:function instead of the file's entry."),
    click.option("--checkpoint", default=None, help="Checkpoint location (default: one per run's request)."),
    click.option("--output-table", default=None, help="Where the application's output goes."),
    JSON_REPORT,
    SPARK_CONF,
]


def run_application(settings: AppSettings, available_now: bool, as_json: bool) -> None:
    """Run it in a session of its own and print its report."""
    from bergstream.runtime.run import run_app
    from bergstream.spark import spark_session

    with spark_session(settings.catalog, settings.spark, f"bergstream-app-{settings.app}") as spark:
        report = run_app(spark, settings, available_now=available_now, show_progress=sys.stderr.isatty())
    failure = None
    if report.problems:
        failure = f"{settings.app}: the {settings.mode} is incomplete: {'; '.join(report.problems)}"
    command = "backfill run" if settings.mode == "backfill" else "app run"
    echo_report(as_json, command, report.to_json(), report.lines(), failure)


@click.group()
def app() -> None:
    """Run an application live, reading its named sources from Kafka."""


@app.command("run")
@with_options(APP_OPTIONS)
@click.option("--available-now", is_flag=True, help="Read what the topics hold now, then stop.")
@click.option(
    "--from",
    "start_from",
    default=None,
    help="Bootstrap: read the archive from this ingestion time (ISO) as `backfill run` reads it, then Kafka "
    "from exactly where the archive ends: one query, its state carried over. The same command resumes it.",
)
@click.option(
    "--max-misalignment",
    default=None,
    help="With --from: B of the archive phase (15m, 1h; default: the file's backfill.max_misalignment).",
)
@DATA_DIR
@reports_json("app run")
def app_run(
    app: str,
    config_file: Path | None,
    entry: str | None,
    checkpoint: str | None,
    output_table: str | None,
    as_json: bool,
    spark_conf: tuple[str, ...],
    available_now: bool,
    start_from: str | None,
    max_misalignment: str | None,
    data_dir: Path | None,
) -> None:
    """Run an application live until stopped (or until caught up with --available-now); with --from,
    bootstrap it from the archive first."""
    from bergstream.cli.endpoints import Endpoints
    from bergstream.runtime.checkpoint_names import bootstrap_checkpoint
    from bergstream.runtime.settings import load_app_settings

    configure_logging()
    if max_misalignment is not None and start_from is None:
        raise click.UsageError("--max-misalignment bounds the archive phase of --from: give --from too")
    overrides: dict[str, object] = {
        "mode": "live" if start_from is None else "bootstrap",
        "entry": entry,
        "output_table": output_table,
        "spark": spark_overrides(spark_conf),
    }
    if start_from is not None:
        overrides["backfill"] = {"start": start_from, "max_misalignment": max_misalignment}
    endpoints = Endpoints.resolve(data_dir)
    with endpoints.explained():
        settings = load_app_settings(app, config_file, endpoints.app_defaults(app), overrides)
    if start_from is not None:
        checkpoint = checkpoint or bootstrap_checkpoint(settings)
    if checkpoint is not None:
        settings = settings.model_copy(update={"checkpoint_location": checkpoint})
    run_application(settings, available_now=available_now, as_json=as_json)
