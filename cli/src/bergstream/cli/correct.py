"""`bergstream backfill audit | publish | unpublish | verify`, and the release of a correction: the commands
on a correction that `backfill run --branch` wrote, each checked before Spark starts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bergstream.cli.app import APP_OPTIONS
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
from bergstream.runtime.settings import AppSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from bergstream.runtime.correct.state import Correction

CORRECTION = [
    click.option(
        "--app",
        required=True,
        help="The application whose output the branch corrects: its settings are <apps dir>/<app>.yaml.",
    ),
    APP_OPTIONS[1],  # --config
    click.option("--branch", required=True, help="The branch `backfill run --branch` wrote."),
    click.option(
        "--output-table", default=None, help="The application's output table (default: its file's)."
    ),
    JSON_REPORT,
    SPARK_CONF,
    DATA_DIR,
]


def correction_settings(
    app: str,
    config_file: Path | None,
    output_table: str | None,
    spark_conf: tuple[str, ...],
    data_dir: Path | None,
) -> AppSettings:
    """An application's settings for a command on one of its corrections: its output table, catalog, Spark
    settings and live query's checkpoint. The window is the branch's, read from its table; the settings'
    own is not used."""
    from bergstream.cli.endpoints import Endpoints
    from bergstream.runtime.settings import load_app_settings

    configure_logging()
    overrides = {
        "mode": "backfill", "output_table": output_table, "spark": spark_overrides(spark_conf),
        "backfill": {"start": "1970-01-01T00:00:00Z", "end": "1970-01-01T00:00:01Z"},
    }  # fmt: skip
    endpoints = Endpoints.resolve(data_dir)
    with endpoints.explained():
        return load_app_settings(app, config_file, defaults=endpoints.app_defaults(app), overrides=overrides)


@contextmanager
def on_correction(
    command: str,
    app: str,
    config_file: Path | None,
    branch: str,
    output_table: str | None,
    spark_conf: tuple[str, ...],
    data_dir: Path | None,
    publishing: bool = False,
) -> Iterator[tuple[SparkSession, AppSettings, str, Correction]]:
    """`app`'s correction in `branch`, checked before Spark starts (its rows of the window complete to its
    end when `publishing`), then a Spark session for `command`: the session, the settings, the output
    table's identifier and the correction."""
    from bergstream.runtime.correct.checks import recorded_correction
    from bergstream.spark import spark_session

    settings = correction_settings(app, config_file, output_table, spark_conf, data_dir)
    output, correction = recorded_correction(settings, branch, publishing=publishing)
    with spark_session(settings.catalog, settings.spark, f"bergstream-{command}-{app}") as spark:
        yield spark, settings, output.identifier, correction


@click.command("audit")
@with_options(CORRECTION)
@click.option(
    "--min-match",
    type=click.FloatRange(0, 1),
    default=None,
    help="Exit non-zero when fewer of the keys than this fraction are equal (0.999: a backfill expected to "
    "reproduce production).",
)
@click.option(
    "--sample", type=click.IntRange(0, 1000), default=5, help="Rows shown of each kind of difference."
)
@reports_json("backfill audit")
def backfill_audit(
    app: str,
    config_file: Path | None,
    branch: str,
    output_table: str | None,
    as_json: bool,
    spark_conf: tuple[str, ...],
    data_dir: Path | None,
    min_match: float | None,
    sample: int,
) -> None:
    """Compare a correction's rows of its window with main's, by the output's key: equal, changed, only in
    main, only in the branch; the match is the equal keys over all."""
    from bergstream.runtime.correct.audit import audit

    names = (app, config_file, branch, output_table, spark_conf, data_dir)
    with on_correction("audit", *names) as (spark, _, identifier, correction):
        report = audit(spark, identifier, correction, sample)
    failure = None
    if min_match is not None and report.match < min_match:
        failure = (
            f"{app}: branch {branch} matches main on {100 * report.match:.3f} % of its keys, below "
            f"--min-match {100 * min_match:.3f} %"
        )
    elif min_match is not None and report.duplicated:
        failure = (
            f"{app}: branch {branch} holds {report.duplicated:,} keys more often than main, and more than "
            "once: a publish would duplicate their rows (--min-match fails on any)"
        )
    echo_report(as_json, "backfill audit", report.to_json(), report.lines(), failure)


@click.command("publish")
@with_options(CORRECTION)
@click.option(
    "--no-live-query",
    is_flag=True,
    help="No live query writes the output: publish without waiting for one (by default, the publish waits "
    "for the live query of the application's checkpoint_location to have written the window's rows).",
)
@reports_json("backfill publish")
def backfill_publish(
    app: str,
    config_file: Path | None,
    branch: str,
    output_table: str | None,
    as_json: bool,
    spark_conf: tuple[str, ...],
    data_dir: Path | None,
    no_live_query: bool,
) -> None:
    """Replace main's rows of a correction's window with its branch's, in one commit on main that keeps what
    the live query appends meanwhile; main's snapshot before it is tagged. Run again, it publishes once."""
    from bergstream.runtime.correct.publish import publish

    names = (app, config_file, branch, output_table, spark_conf, data_dir)
    with on_correction("publish", *names, publishing=True) as (spark, settings, identifier, _):
        report = publish(spark, identifier, branch, None if no_live_query else settings.checkpoint_location)
    echo_report(as_json, "backfill publish", report.to_json(), report.lines())


@click.command("unpublish")
@with_options(CORRECTION)
@click.option(
    "--keep-later-rows",
    is_flag=True,
    help="Keep the rows written into the window since the publish (`backfill verify` shows them): without "
    "it, an unpublish after such rows is refused, nothing changed.",
)
@reports_json("backfill unpublish")
def backfill_unpublish(
    app: str,
    config_file: Path | None,
    branch: str,
    output_table: str | None,
    as_json: bool,
    spark_conf: tuple[str, ...],
    data_dir: Path | None,
    keep_later_rows: bool,
) -> None:
    """Put main's rows of a published correction's window back as they were, in one commit on main."""
    from bergstream.runtime.correct.publish import unpublish

    names = (app, config_file, branch, output_table, spark_conf, data_dir)
    with on_correction("unpublish", *names) as (spark, _, identifier, _):
        report = unpublish(spark, identifier, branch, keep_later_rows)
    echo_report(as_json, "backfill unpublish", report.to_json(), report.lines())


@click.command("verify")
@with_options(CORRECTION)
@click.option("--sample", type=click.IntRange(0, 1000), default=5, help="Rows shown of each kind.")
@reports_json("backfill verify")
def backfill_verify(
    app: str,
    config_file: Path | None,
    branch: str,
    output_table: str | None,
    as_json: bool,
    spark_conf: tuple[str, ...],
    data_dir: Path | None,
    sample: int,
) -> None:
    """Show the rows written into a published correction's window since its publish, and those removed; exit
    non-zero when there are any."""
    from bergstream.runtime.correct.verify import verify

    names = (app, config_file, branch, output_table, spark_conf, data_dir)
    with on_correction("verify", *names) as (spark, _, identifier, _):
        report = verify(spark, identifier, branch, sample)
    failure = None
    if not report.ok:
        failure = (
            f"{app}: main's window of branch {branch} changed since its publish: {report.written_since:,} "
            f"rows written into it, {report.removed_since:,} removed"
        )
    echo_report(as_json, "backfill verify", report.to_json(), report.lines(), failure)


def release_correction(
    app: str,
    branch: str,
    output_table: str | None,
    config_file: Path | None,
    spark_conf: tuple[str, ...],
    data_dir: Path | None,
) -> None:
    """`backfill release --app --branch`: the correction and what its run kept, removed."""
    from bergstream.runtime.correct.checks import output_table as find_output
    from bergstream.runtime.correct.release import release
    from bergstream.runtime.correct.state import recorded
    from bergstream.spark import spark_session

    settings = correction_settings(app, config_file, output_table, spark_conf, data_dir)
    output = find_output(settings)
    if recorded(output.properties, branch) is None and output.branch_snapshot(branch) is None:
        raise click.ClickException(
            f"{output.identifier} has no correction in branch {branch}: nothing to release"
        )
    with spark_session(settings.catalog, settings.spark, f"bergstream-release-{app}") as spark:
        removed = release(spark, settings.catalog, output.identifier, branch)
    click.echo(f"{output.identifier}: removed {', '.join(removed)}; what was published stays in main")


CORRECTION_COMMANDS = [backfill_audit, backfill_publish, backfill_unpublish, backfill_verify]
