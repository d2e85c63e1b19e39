"""`bergstream router`: archive topics into Iceberg, maintain their tables, parse dead letters again."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bergstream.cli.options import (
    DATA_DIR,
    JSON_REPORT,
    ROUTER_CONFIG,
    SPARK_CONF,
    TABLE,
    TOPICS_DIR,
    configure_logging,
    echo_report,
    reports_json,
    spark_overrides,
)

if TYPE_CHECKING:
    from bergstream.cli.endpoints import Endpoints
    from bergstream.router.config import RouterConfig
    from bergstream.router.driver.named import RestartSettings
    from bergstream.router.driver.run import TopicOutcome


@click.group()
def router() -> None:
    """Spark Structured Streaming queries archiving Kafka topics into Iceberg."""


def topic_loader(
    endpoints: Endpoints,
    config_file: Path | None,
    topics_dir: Path | None,
    overrides: dict[str, Any],
    defaults_file: Path | None = None,
) -> Callable[[str], RouterConfig]:
    """Reads a topic's settings: `config_file`, else <topics dir>/<topic>.yaml over `defaults_file` (or the
    defaults file alone for a topic without one), over the endpoints."""
    from bergstream.router.config import load_router_config, topic_file
    from bergstream.router.driver.settings import topic_settings

    def load(topic: str) -> RouterConfig:
        if defaults_file is not None:
            return topic_settings(topic, defaults_file, topics_dir, endpoints.router_defaults, overrides)
        path = config_file if config_file is not None else topic_file(topic, topics_dir)
        return load_router_config(topic, path, endpoints.router_defaults(topic), overrides)

    return load


@router.command("run")
@click.option(
    "--topic", "topics", multiple=True,
    help="The Kafka topic to archive; repeated, its topics run in one driver and one query (one per set of "
    "query-level settings: trigger, rate limit, Kafka options).",
)  # fmt: skip
@click.option(
    "--all", "all_topics", is_flag=True,
    help="Every topic with a file in --topics-dir, in one driver and one query (named `all` unless --group "
    "says otherwise), as --topic repeated runs them.",
)  # fmt: skip
@click.option("--one-query", is_flag=True, hidden=True)
@click.option(
    "--pattern", default=None, metavar="REGEX",
    help="Every topic whose whole name matches, in one query: topics created later too, each into its "
    "own tables, with its own file in --topics-dir or else the --defaults.",
)  # fmt: skip
@click.option(
    "--defaults", "defaults_file", type=click.Path(path_type=Path), default=None,
    help="The settings under every topic's own file, and those of a topic without one; with --pattern, "
    "also the query's own (default: the site's topic_defaults); with several topics, its "
    "checkpoint_location is their query's.",
)  # fmt: skip
@click.option(
    "--name", default=None,
    help="With --pattern: the query's name, which names its checkpoint (default: from the pattern).",
)  # fmt: skip
@TOPICS_DIR
@click.option(
    "--group", default=None,
    help="With several topics or --all: the name of the driver (its Spark app) and of its query, which names "
    "its checkpoint.",
)  # fmt: skip
@click.option(
    "--restart-backoff", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
    help="With several topics or --all: seconds before a failed query starts again; doubles on each "
    "failure in a row, up to --max-restart-backoff.",
)  # fmt: skip
@click.option(
    "--max-restart-backoff", type=click.FloatRange(min=0, min_open=True), default=300.0, show_default=True,
    help="The longest wait before a failed query starts again.",
)  # fmt: skip
@click.option(
    "--schema", default=None, help="Event schema (default: from the topic's file, else the topic's name)."
)
@TABLE
@ROUTER_CONFIG
@click.option("--available-now", is_flag=True, help="Archive what the topic holds now, then exit.")
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus metrics on this port.")
@click.option(
    "--maintain-every", default=None, metavar="DURATION",
    help="Maintain the tables inside the router this often (1h, 30m): compact closed hours, expire "
    "snapshots, remove orphan files; never leaves it to `router maintain` (default: maintenance.every "
    "of the topic's file; else 1h).",
)  # fmt: skip
@SPARK_CONF
@JSON_REPORT
@DATA_DIR
@reports_json("router run")
def router_run(
    topics: tuple[str, ...],
    all_topics: bool,
    one_query: bool,
    pattern: str | None,
    defaults_file: Path | None,
    name: str | None,
    topics_dir: Path | None,
    group: str | None,
    restart_backoff: float,
    max_restart_backoff: float,
    schema: str | None,
    table: str | None,
    config_file: Path | None,
    available_now: bool,
    metrics_port: int | None,
    maintain_every: str | None,
    spark_conf: tuple[str, ...],
    as_json: bool,
    data_dir: Path | None,
) -> None:
    """Archive a topic into its Iceberg table, exactly once, until stopped (or once with --available-now).

    With --topic repeated or --all, one query archives every topic (one per set of query-level settings);
    with --pattern, one query archives every matching topic, those created later too. A topic whose
    settings do not load under --all or --pattern is dead-lettered whole, with why, while the others go on."""
    from bergstream.cli.endpoints import Endpoints
    from bergstream.router.config import topics_dir as topics_folder
    from bergstream.router.driver.launch import Launch, launch
    from bergstream.router.driver.named import RestartSettings, topics_in

    if one_query:
        raise click.UsageError("--one-query is gone: --all runs every topic in one query now; drop the flag")
    if sum((all_topics, bool(topics), pattern is not None)) > 1:
        raise click.UsageError("give one of --topic, --all (every topic of --topics-dir) and --pattern")
    if not all_topics and not topics and pattern is None:
        raise click.UsageError(
            "name the topic to archive with --topic (repeatable), or give --all or --pattern"
        )
    if pattern is None:
        if name is not None:
            raise click.UsageError("--name is for --pattern; --group names the query of several topics")
        if defaults_file is not None and config_file is not None:
            raise click.UsageError("give --config (one topic's whole settings) or --defaults, not both")
    else:
        for flag, value in (
            ("--config", config_file), ("--schema", schema), ("--table", table), ("--group", group),
        ):  # fmt: skip
            if value is not None:
                raise click.UsageError(
                    f"{flag} is not for one query of many topics: each topic's own file in --topics-dir, "
                    "else --defaults, sets it"
                )
        configure_logging()
        restart = RestartSettings(
            initial_backoff_seconds=restart_backoff, max_backoff_seconds=max_restart_backoff
        )
        outcomes = run_pattern(pattern, name, defaults_file, topics_dir, available_now, metrics_port,
                               maintain_every, spark_conf, data_dir, restart)  # fmt: skip
        report_outcomes(outcomes, as_json)
        return
    # One restart policy for every way of naming topics: a failing query of a driver of several topics
    # (`--topic` repeated, `--all`, `--pattern`) is started again alone, after a backoff, while the others go
    # on; one topic's driver is not: whatever runs it (Kubernetes) starts it again.
    alone = len(topics) == 1 and group is None
    if not alone:
        for flag, value in (
            ("--config", config_file), ("--schema", schema), ("--table", table),
            ("--maintain-every", maintain_every),
        ):  # fmt: skip
            if value is not None:
                raise click.UsageError(
                    f"{flag} is for one topic; with several, each topic's <topic>.yaml in --topics-dir "
                    "sets it"
                )
    configure_logging()
    overrides = {
        "schema": schema, "table": table, "metrics_port": metrics_port,
        "maintenance": None if maintain_every is None else {"every": maintain_every},
        "spark": spark_overrides(spark_conf),
    }  # fmt: skip
    endpoints = Endpoints.resolve(data_dir)
    request = Launch(
        topics=topics_in(topics_folder(topics_dir)) if all_topics else list(topics),
        load=topic_loader(endpoints, config_file, topics_dir, overrides, defaults_file),
        available_now=available_now,
        every_topic=all_topics,
        restart=None if alone else RestartSettings(
            initial_backoff_seconds=restart_backoff, max_backoff_seconds=max_restart_backoff
        ),
        metrics_port=metrics_port,
        group=group if group is not None or not all_topics else "all",
        checkpoint=defaults_checkpoint(defaults_file),
    )  # fmt: skip
    with endpoints.explained():
        outcomes = launch(request)
    report_outcomes(outcomes, as_json)


def defaults_checkpoint(defaults_file: Path | None) -> str | None:
    """The checkpoint a defaults file names: the query's, for a query of several topics."""
    from bergstream.settings_file import read_mapping

    if defaults_file is None:
        return None
    if not defaults_file.is_file():
        raise click.UsageError(f"--defaults {defaults_file}: no such file")
    location = read_mapping(defaults_file).get("checkpoint_location")
    return None if location is None else str(location)


def report_outcomes(outcomes: list[TopicOutcome], as_json: bool) -> None:
    """Each topic's totals; a failure when a topic did not end cleanly."""
    failed = [outcome.topic for outcome in outcomes if outcome.error is not None]
    failure = f"{len(failed)} of {len(outcomes)} topics failed: {', '.join(failed)}" if failed else None
    topics = [
        {
            "topic": outcome.topic,
            "error": outcome.error,
            "restarts": outcome.restarts,
            **asdict(outcome.totals),
        }
        for outcome in outcomes
    ]
    echo_report(as_json, "router run", {"topics": topics}, [o.summary() for o in outcomes], failure)


def run_pattern(
    pattern: str,
    name: str | None,
    defaults_file: Path | None,
    topics_dir: Path | None,
    available_now: bool,
    metrics_port: int | None,
    maintain_every: str | None,
    spark_conf: tuple[str, ...],
    data_dir: Path | None,
    restart: RestartSettings,
) -> list[TopicOutcome]:
    """`router run --pattern`: one query for every matching topic, but those whose own files set another
    trigger or rate limit (a query per set of them); a query that fails is started again alone."""
    from bergstream.cli.endpoints import Endpoints
    from bergstream.router.driver.launch import launch_pattern
    from bergstream.router.driver.settings import (
        load_pattern_settings,
        pattern_name,
        pattern_queries,
        pattern_topic_settings,
    )
    from bergstream.site import site_topic_defaults

    endpoints = Endpoints.resolve(data_dir)
    named = name or pattern_name(pattern)
    defaults = defaults_file if defaults_file is not None else site_topic_defaults()
    with endpoints.explained():
        settings = load_pattern_settings(
            pattern, named, defaults, endpoints.router_defaults(named),
            {"metrics_port": metrics_port, "spark": spark_overrides(spark_conf)},
        )  # fmt: skip
    # Every topic's maintenance, one topic at a time in one thread of the driver (RotatingMaintenance).
    overrides = {
        "spark": spark_overrides(spark_conf),
        "maintenance": None if maintain_every is None else {"every": maintain_every},
    }
    # Topics whose own files set another trigger or rate limit run in queries of their own.
    sources = (defaults, topics_dir, endpoints.router_defaults, overrides)
    queries = pattern_queries(settings, topics_dir, pattern_topic_settings(settings, *sources))
    load = pattern_topic_settings(settings, *sources, queries)
    return launch_pattern(settings, load, available_now, queries=queries, restart=restart)


@router.command("maintain")
@click.option("--topic", required=True, help="The topic whose tables to maintain.")
@TABLE
@ROUTER_CONFIG
@SPARK_CONF
@JSON_REPORT
@DATA_DIR
@reports_json("router maintain")
def router_maintain(
    topic: str,
    table: str | None,
    config_file: Path | None,
    spark_conf: tuple[str, ...],
    as_json: bool,
    data_dir: Path | None,
) -> None:
    """Compact closed hours, expire old snapshots, remove orphan files; safe while the router runs."""
    from bergstream.cli.endpoints import Endpoints
    from bergstream.router.maintain import maintain
    from bergstream.spark import spark_session

    configure_logging()
    overrides = {"table": table, "spark": spark_overrides(spark_conf)}
    endpoints = Endpoints.resolve(data_dir)
    with endpoints.explained():
        config = topic_loader(endpoints, config_file, None, overrides)(topic)
    with spark_session(config.query.catalog, config.query.spark, f"bergstream-maintain-{topic}") as spark:
        now = datetime.now(UTC)
        results = maintain(spark, config, now)
    lines = []
    for result in results:
        lines.append(result.summary())
        lines += [f"  {pin.describe(result.table, now)}" for pin in result.held]
    tables = [asdict(result) for result in results]
    echo_report(as_json, "router maintain", {"topic": topic, "tables": tables}, lines)


@router.command("aborted")
@click.option("--topic", required=True, help="The topic whose tables to look through.")
@click.option("--delete", is_flag=True, help="Remove the rows found, one commit per table.")
@TABLE
@ROUTER_CONFIG
@SPARK_CONF
@JSON_REPORT
@DATA_DIR
@reports_json("router aborted")
def router_aborted(
    topic: str,
    delete: bool,
    table: str | None,
    config_file: Path | None,
    spark_conf: tuple[str, ...],
    as_json: bool,
    data_dir: Path | None,
) -> None:
    """Find the records of aborted transactions that a router reading uncommitted records archived (the
    rows whose offsets a read_committed read of the topic does not return, where Kafka still holds them);
    with --delete, remove them."""
    from bergstream.cli.endpoints import Endpoints
    from bergstream.router.aborted import find_aborted
    from bergstream.spark import spark_session

    configure_logging()
    overrides = {"table": table, "spark": spark_overrides(spark_conf)}
    endpoints = Endpoints.resolve(data_dir)
    with endpoints.explained():
        config = topic_loader(endpoints, config_file, None, overrides)(topic)
    with spark_session(config.query.catalog, config.query.spark, f"bergstream-aborted-{topic}") as spark:
        report = find_aborted(spark, config, delete)
    echo_report(as_json, "router aborted", report.to_json(), report.lines())


@router.command("redrive")
@click.option("--topic", required=True, help="The topic whose dead letters to parse again.")
@click.option("--reason", default=None, help="Only the dead letters whose reason contains this text.")
@click.option("--dry-run", is_flag=True, help="Parse and report what would happen; write nothing.")
@click.option(
    "--schema", default=None, help="Event schema (default: from the topic's file, else the topic's name)."
)
@TABLE
@ROUTER_CONFIG
@SPARK_CONF
@JSON_REPORT
@DATA_DIR
@reports_json("router redrive")
def router_redrive(
    topic: str,
    reason: str | None,
    dry_run: bool,
    schema: str | None,
    table: str | None,
    config_file: Path | None,
    spark_conf: tuple[str, ...],
    as_json: bool,
    data_dir: Path | None,
) -> None:
    """Parse a topic's dead letters again: archive those that parse now, exactly once, and mark them."""
    from bergstream.cli.endpoints import Endpoints
    from bergstream.router.redrive import redrive
    from bergstream.spark import spark_session

    if reason is not None and not reason.strip():
        raise click.BadParameter("give some text of the reason", param_hint="--reason")
    configure_logging()
    overrides = {"schema": schema, "table": table, "spark": spark_overrides(spark_conf)}
    endpoints = Endpoints.resolve(data_dir)
    with endpoints.explained():
        config = topic_loader(endpoints, config_file, None, overrides)(topic)
    with spark_session(config.query.catalog, config.query.spark, f"bergstream-redrive-{topic}") as spark:
        report = redrive(spark, config, reason, dry_run=dry_run, show_progress=sys.stderr.isatty())
    echo_report(as_json, "router redrive", report.to_json(), report.lines())
