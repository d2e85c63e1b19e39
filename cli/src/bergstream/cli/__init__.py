"""The `bergstream` command line."""

from __future__ import annotations

import faulthandler
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from bergstream.errors import BergstreamError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from bergstream.local import LocalStack
    from bergstream.router.config import RouterConfig

DATA_DIR = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the local stack keeps its state (default: $BERGSTREAM_HOME or ./.bergstream).",
)


TABLE = click.option(
    "--table", default=None, help="Archive table (default: from the topic's file, else the topic's name)."
)
CLIENT_CONFIG = click.option(
    "--client-config",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Kafka client settings, Java client names (security.protocol, sasl.jaas.config, ...), as a "
    "properties file (default: the local stack's producer).",
)
ROUTER_CONFIG = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Settings file (default: deploy/topics/<topic>.yaml when it exists).",
)


def _data_dir(data_dir: Path | None) -> Path:
    from bergstream.local.stack import default_data_dir

    return data_dir.absolute() if data_dir is not None else default_data_dir()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bergstream", prog_name="bergstream")
def cli() -> None:
    """Archive Kafka topics into Apache Iceberg, and backfill streaming applications from the archive."""


@cli.group()
def local() -> None:
    """The embedded stack on 127.0.0.1: Kafka (one broker or three), an Iceberg catalog (SQLite JDBC, or
    Iceberg's REST server), a warehouse folder or an S3 object store."""


@local.command("up")
@DATA_DIR
@click.option("--host", default="127.0.0.1", show_default=True, help="Loopback address to listen on.")
@click.option("--kafka-port", type=int, default=9092, show_default=True)
@click.option("--controller-port", type=int, default=9093, show_default=True)
@click.option(
    "--security",
    type=click.Choice(["none", "sasl_ssl"]),
    default="none",
    show_default=True,
    help="sasl_ssl: TLS, SCRAM-SHA-512 users and ACLs; client settings are written into the stack's folder.",
)
@click.option(
    "--brokers",
    type=click.Choice(["1", "3"]),
    default="1",
    show_default=True,
    help="3: a KRaft cluster of three nodes (replication factor 3, min.insync.replicas 2), the others on "
    "the ports two and four up from --kafka-port and --controller-port.",
)
@click.option(
    "--object-store",
    type=click.Choice(["none", "s3"]),
    default="none",
    show_default=True,
    help="s3: the warehouse is s3://bergstream/warehouse on an S3 object store (versitygw), not a folder.",
)
@click.option("--object-store-port", type=int, default=7070, show_default=True)
@click.option(
    "--catalog",
    "catalog_kind",
    type=click.Choice(["jdbc", "rest"]),
    default="jdbc",
    show_default=True,
    help="rest: Iceberg's REST catalog server (over its own SQLite file) instead of a SQLite JDBC catalog.",
)
@click.option("--rest-port", type=int, default=8181, show_default=True)
@click.option(
    "--schema-registry",
    "with_registry",
    is_flag=True,
    help="Also run a schema registry (Confluent's REST API; schemas kept in memory until `down`).",
)
@click.option("--schema-registry-port", type=int, default=8081, show_default=True)
def local_up(
    data_dir: Path | None, host: str, kafka_port: int, controller_port: int, security: str, brokers: str,
    object_store: str, object_store_port: int, catalog_kind: str, rest_port: int, with_registry: bool,
    schema_registry_port: int,
) -> None:  # fmt: skip
    """Start the local stack."""
    import time

    from bergstream.local import LocalStack, StackConfig
    from bergstream.local import object_store as store_server

    started = time.monotonic()
    config = StackConfig(
        data_dir=_data_dir(data_dir), host=host, kafka_port=kafka_port, controller_port=controller_port,
        security=security, brokers=int(brokers),  # type: ignore[arg-type]
        object_store=object_store, catalog_kind=catalog_kind,  # type: ignore[arg-type]
        object_store_port=object_store_port, rest_port=rest_port,
        schema_registry_port=schema_registry_port if with_registry else None,
    )  # fmt: skip
    if config.object_store == "s3" and not store_server.installed():
        click.echo(f"building versitygw {store_server.VERSITYGW_VERSION} with go install (once)", err=True)
    _announce_registry_build(with_registry)
    status = LocalStack(config).up()
    click.echo(f"local stack up in {time.monotonic() - started:.1f}s")
    _print_status(status.to_json())


@local.command("install")
def local_install() -> None:
    """Build and resolve what `local up` runs, once: the pinned jars (Kafka, Spark, the REST catalog), the
    S3 object store versitygw (with `go install`) and the schema registry (with `go build`)."""
    from bergstream import jars
    from bergstream.local import object_store as store_server
    from bergstream.local import schema_registry

    jars.resolve_all()
    if not store_server.installed():
        click.echo(f"building versitygw {store_server.VERSITYGW_VERSION} with go install (once)", err=True)
    click.echo(f"versitygw {store_server.VERSITYGW_VERSION}: {store_server.install()}")
    _announce_registry_build(True)
    click.echo(f"schema registry {schema_registry.pinned_version()}: {schema_registry.build()}")


def _announce_registry_build(wanted: bool) -> None:
    from bergstream.local import schema_registry

    if wanted and not schema_registry.binary_path().exists():
        click.echo(f"building the schema registry {schema_registry.pinned_version()} with go build (once, "
                   "about two minutes)", err=True)  # fmt: skip


@local.command("router-user")
@click.option("--topic", required=True, help="The topic whose router the user is for.")
@DATA_DIR
def local_router_user(topic: str, data_dir: Path | None) -> None:
    """On a secured stack, the Kafka user of a topic's router: it may read the topic and commit group
    bergstream-router.<topic>, nothing else. Made on first use; prints where its client settings are."""
    from bergstream.errors import StackError
    from bergstream.local import kafka_security

    stack = _running_stack(data_dir)
    security = stack.config.kafka_security
    if security is None:
        raise StackError(f"the local stack in {stack.config.data_dir} runs without security: it has no users")
    stack.router_client(topic)
    user = kafka_security.router_user(topic)
    click.echo(f"user {user} may read topic {topic} and commit group {kafka_security.router_group(topic)}")
    click.echo(f"its client settings (Java client names; as kafka.* in a router's settings): "
               f"{security.client_file(user)}")  # fmt: skip


@local.command("down")
@DATA_DIR
def local_down(data_dir: Path | None) -> None:
    """Stop the local stack; its data stays for the next `up`."""
    from bergstream.local import LocalStack

    stack = LocalStack.at(_data_dir(data_dir))
    stack.down()
    click.echo(f"local stack in {stack.config.data_dir} stopped")


@local.command("burrow")
@DATA_DIR
@click.option("--http-port", type=int, default=8000, show_default=True, help="Port of Burrow's HTTP API.")
def local_burrow(data_dir: Path | None, http_port: int) -> None:
    """Run Burrow (1.9.5 or newer; $BERGSTREAM_BURROW or the PATH) against the running local stack until
    Ctrl-C. Its settings are written to <data dir>/burrow/burrow.toml."""

    from bergstream.errors import StackError
    from bergstream.local.burrow import BurrowSettings, burrow_server

    stack = _running_stack(data_dir)
    if stack.config.security != "none":
        raise StackError(
            "`local burrow` watches a plain-text stack; a secured one needs Burrow's TLS and SASL settings"
        )
    settings = BurrowSettings(stack.config.bootstrap_servers, http_port)
    with burrow_server(settings, stack.config.data_dir / "burrow") as server:
        lag = f"{server.url}/v3/kafka/{settings.cluster}/consumer/bergstream-router.<topic>/lag"
        click.echo(f"Burrow watches {settings.bootstrap_servers}: {lag}; Ctrl-C stops it")
        _until_stopped()


@local.command("prometheus")
@click.option(
    "--target", "targets", multiple=True, required=True, help="A router's metrics, host:port (repeatable)."
)
@click.option(
    "--port", type=int, default=9090, show_default=True, help="Port of Prometheus's web UI and API."
)
@click.option("--scrape-interval", default="15s", show_default=True)
def local_prometheus(targets: tuple[str, ...], port: int, scrape_interval: str) -> None:
    """Run Prometheus (the machine's binary) scraping routers' metrics, with the alert rules of
    bergstream/deploy/prometheus/alerts.yml, until Ctrl-C or SIGTERM."""
    from bergstream.deploy import ALERT_RULES
    from bergstream.local.prometheus import prometheus_server

    with prometheus_server(list(targets), scrape_interval, rules=ALERT_RULES, port=port) as server:
        click.echo(f"Prometheus scrapes {', '.join(targets)} every {scrape_interval}: {server.url}/alerts")
        click.echo(f"  time lag: {server.url}/graph?g0.expr=max+by+(topic)(bergstream_router_lag_seconds)")
        click.echo("Ctrl-C or SIGTERM stops it")
        _until_stopped()


def _until_stopped() -> None:
    """Wait for SIGINT or SIGTERM, even where the shell started this in the background with SIGINT ignored,
    so that the server a command runs is stopped by the command's own cleanup."""
    import signal
    import threading

    stopped = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopped.set())
    stopped.wait()


@local.command("status")
@DATA_DIR
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts and tests.")
def local_status(data_dir: Path | None, as_json: bool) -> None:
    """Say whether the stack runs and where its services are; exits 1 when it is not running."""
    from bergstream.local import LocalStack

    status = LocalStack.at(_data_dir(data_dir)).status()
    if as_json:
        click.echo(json.dumps(status.to_json(), indent=2))
    else:
        _print_status(status.to_json())
    if not status.running:
        sys.exit(1)


def _print_status(status: dict[str, Any]) -> None:
    shown = {key: value for key, value in status.items() if value is not None}
    width = max(len(key) for key in shown)
    for key, value in shown.items():
        click.echo(f"  {key:<{width}}  {value}")


@cli.command()
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
@click.option("--bootstrap-servers", default=None, help="Kafka to send to (default: the local stack's).")
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
    bootstrap_servers: str | None,
    client_config: Path | None,
    data_dir: Path | None,
    schema_registry: str | None,
) -> None:
    """Send realistic events, keyed by account id, into a Kafka topic."""
    from bergstream.loadgen.producer import ProduceRequest
    from bergstream.loadgen.producer import produce as run
    from bergstream.timeparse import parse_duration, parse_instant

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
        schema_registry=_registry_settings(schema_registry, data_dir),
    )
    settings = _kafka_client(bootstrap_servers, client_config, data_dir)
    bootstrap = settings.pop("bootstrap.servers")
    report = run(request, bootstrap, producer_config=settings, show_progress=sys.stderr.isatty())
    click.echo(report.summary())


def _registry_settings(url: str | None, data_dir: Path | None) -> Any:
    """--schema-registry: a registry's URL, or `local` for the local stack's."""
    from pydantic import ValidationError

    from bergstream.errors import ConfigError, StackError
    from bergstream.schemas.schema_registry import SchemaRegistrySettings

    if url is None:
        return None
    if url == "local":
        url = _running_stack(data_dir).status().schema_registry_url
        if url is None:
            raise StackError("the local stack has no registry; `local up --schema-registry` starts one")
    try:
        return SchemaRegistrySettings(url=url)
    except ValidationError as error:
        raise ConfigError(f"--schema-registry {url!r}: give http://host:port, or `local`") from error


def _running_stack(data_dir: Path | None) -> LocalStack:
    from bergstream.errors import StackError
    from bergstream.local import LocalStack

    stack = LocalStack.at(_data_dir(data_dir))
    if not stack.status().running:
        raise StackError(
            f"no local stack runs in {stack.config.data_dir}: start it with `bergstream local up` "
            "or name a broker with --bootstrap-servers"
        )
    return stack


def _kafka_client(
    bootstrap_servers: str | None, client_config: Path | None, data_dir: Path | None
) -> dict[str, str]:
    """librdkafka settings of `produce` and replay: those of --client-config (Java client names), else the
    local stack's producer; --bootstrap-servers over either."""
    from bergstream.errors import ConfigError
    from bergstream.kafka_settings import librdkafka_settings, read_properties

    if client_config is not None:
        java = read_properties(client_config)
    elif bootstrap_servers is None:
        java = _running_stack(data_dir).producer_client()
    else:
        java = {}
    if bootstrap_servers is not None:
        java["bootstrap.servers"] = bootstrap_servers
    if "bootstrap.servers" not in java:
        java["bootstrap.servers"] = _running_stack(data_dir).config.bootstrap_servers
    try:
        return librdkafka_settings(java)
    except ConfigError as error:
        raise ConfigError(f"{client_config}: {error}" if client_config is not None else str(error)) from error


@cli.group()
def router() -> None:
    """One Spark Structured Streaming job per topic, archiving it into Iceberg."""


def _router_defaults(data_dir: Path | None, topic: str) -> dict[str, Any]:
    """Endpoints from the site settings (BERGSTREAM_SITE), else from the local stack when it runs: weaker
    than the topic's file and the flags."""
    from bergstream.local import LocalStack
    from bergstream.site import router_defaults, site_file

    site = site_file()
    if site is not None:
        return router_defaults(site, topic)
    stack = LocalStack.at(_data_dir(data_dir))
    status = stack.status()
    if not status.running:
        return {}
    # Secured, the router logs in as its topic's own user.
    login = {f"kafka.{key}": value for key, value in stack.router_client(topic).items()}
    return {
        "kafka": {"kafka.bootstrap.servers": status.bootstrap_servers, **login},
        "catalog": stack.config.catalog.model_dump(mode="json", exclude_none=True),
        "checkpoint_location": str(stack.config.data_dir / "checkpoints" / topic),
    }


def _router_spark(config: RouterConfig, app_name: str) -> SparkSession:
    """The SparkSession of a topic's settings: its catalog, master and Spark configuration."""
    from bergstream.spark import build_spark_session

    return build_spark_session(
        config.catalog, master=config.spark.master, app_name=app_name, conf=config.spark.conf
    )


def _configure_logging() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("bergstream").setLevel(logging.INFO)
    logging.getLogger("router").setLevel(logging.INFO)
    logging.getLogger("backfill").setLevel(logging.INFO)


@router.command("run")
@click.option(
    "--topic", "topics", multiple=True,
    help="The Kafka topic to archive; repeated, its topics run in one driver, one query each.",
)  # fmt: skip
@click.option(
    "--all", "all_topics", is_flag=True, help="Every topic with a file in --topics-dir, in one driver."
)
@click.option(
    "--topics-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="With several topics or --all: where their <topic>.yaml files are (default: deploy/topics).",
)  # fmt: skip
@click.option(
    "--group", default=None, help="With several topics or --all: the driver's name (its Spark app)."
)
@click.option(
    "--restart-backoff", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
    help="With several topics or --all: seconds before a failed topic starts again; doubles on each "
    "failure in a row, up to --max-restart-backoff.",
)  # fmt: skip
@click.option(
    "--max-restart-backoff", type=click.FloatRange(min=0, min_open=True), default=300.0, show_default=True,
    help="The longest wait before a failed topic starts again.",
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
@DATA_DIR
def router_run(
    topics: tuple[str, ...],
    all_topics: bool,
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
    data_dir: Path | None,
) -> None:
    """Archive a topic into its Iceberg table, exactly once, until stopped (or once with --available-now).

    With --topic repeated or --all, one driver runs a query per topic; a topic that fails is reported
    and started again with backoff while the others go on."""
    if all_topics and topics:
        raise click.UsageError("give either --all (every topic of --topics-dir) or --topic, not both")
    if not all_topics and not topics:
        raise click.UsageError("name the topic to archive with --topic (repeatable), or give --all")
    if all_topics or len(topics) > 1 or group is not None:
        for flag, value in (
            ("--config", config_file), ("--schema", schema), ("--table", table),
            ("--maintain-every", maintain_every),
        ):  # fmt: skip
            if value is not None:
                raise click.UsageError(
                    f"{flag} is for one topic; with several, each topic's <topic>.yaml in --topics-dir "
                    "sets it"
                )
        _router_run_many(
            list(topics), all_topics, topics_dir, group, available_now, metrics_port, data_dir,
            restart=(restart_backoff, max_restart_backoff),
        )  # fmt: skip
        return
    (topic,) = topics
    if topics_dir is not None and config_file is None:
        from bergstream.router.config import topic_file

        config_file = topic_file(topic, topics_dir)
    from bergstream.router.app import Router
    from bergstream.router.config import load_router_config
    from bergstream.router.consumer_group import require_access
    from bergstream.router.metrics import RouterMetrics

    _configure_logging()
    config = load_router_config(
        topic,
        config_file,
        defaults=_router_defaults(data_dir, topic),
        overrides={
            "schema": schema,
            "table": table,
            "metrics_port": metrics_port,
            "maintenance": None if maintain_every is None else {"every": maintain_every},
        },
    )
    # A catalog that does not answer, a refused login, an untrusted certificate or a missing ACL is told
    # before Spark takes its time to start.
    config.catalog.check_reachable()
    require_access(config.topic, config.consumer_group, config.kafka_client_config())
    metrics = RouterMetrics(topic)
    if config.metrics_port is not None:
        port = metrics.serve(config.metrics_port, config.metrics_host)
        click.echo(f"metrics on http://{config.metrics_host}:{port}/metrics", err=True)
    spark = _router_spark(config, f"bergstream-router-{topic}")
    try:
        totals = Router(config, spark, metrics).run(available_now=available_now)
    finally:
        spark.stop()
    click.echo(totals.summary(topic))


def _router_run_many(
    topics: list[str],
    all_topics: bool,
    topics_dir: Path | None,
    group: str | None,
    available_now: bool,
    metrics_port: int | None,
    data_dir: Path | None,
    restart: tuple[float, float],
) -> None:
    """Several topics in one driver: router/fleet.py."""
    from bergstream.router.config import TOPICS_DIR, load_router_config, topic_file
    from bergstream.router.consumer_group import require_access
    from bergstream.router.fleet import (
        Fleet,
        RestartSettings,
        check_shared_driver,
        driver_settings,
        topics_in,
    )
    from bergstream.router.metrics import RouterMetrics

    _configure_logging()
    directory = topics_dir if topics_dir is not None else TOPICS_DIR
    topics = topics_in(directory) if all_topics else topics

    def load(topic: str) -> RouterConfig:
        path = topic_file(topic, directory)
        return load_router_config(
            topic,
            path if path.exists() or topics_dir is not None else None,
            defaults=_router_defaults(data_dir, topic),
            overrides={"metrics_port": metrics_port},
        )

    def prepare(config: RouterConfig) -> None:
        require_access(config.topic, config.consumer_group, config.kafka_client_config())

    driver = driver_settings(topics, load, strict=not all_topics)
    if not all_topics:  # topics named one by one are refused at start, as one topic is
        for topic in topics:
            prepare(load(topic))

    def load_checked(topic: str) -> RouterConfig:
        config = load(topic)
        check_shared_driver(config, driver)
        return config

    metrics = RouterMetrics(", ".join(topics))
    port = metrics_port if metrics_port is not None else driver.metrics_port
    if port is not None:
        bound = metrics.serve(port, driver.metrics_host)
        click.echo(
            f"metrics of {len(topics)} topics on http://{driver.metrics_host}:{bound}/metrics", err=True
        )
    settings = RestartSettings(initial_backoff_seconds=restart[0], max_backoff_seconds=restart[1])
    spark = _fleet_spark(driver, topics, group)
    try:
        fleet = Fleet(topics, load_checked, spark, metrics, settings, driver.catalog, prepare)
        outcomes = fleet.run(available_now)
    finally:
        spark.stop()
    for outcome in outcomes:
        click.echo(outcome.summary())
    failed = [outcome.topic for outcome in outcomes if outcome.error is not None]
    if failed:
        raise BergstreamError(f"{len(failed)} of {len(outcomes)} topics failed: {', '.join(failed)}")


def _fleet_spark(driver: RouterConfig, topics: list[str], group: str | None) -> SparkSession:
    from bergstream.router.fleet import fleet_app_name, fleet_spark_conf
    from bergstream.spark import build_spark_session

    return build_spark_session(
        driver.catalog, master=driver.spark.master, app_name=fleet_app_name(topics, group),
        conf=fleet_spark_conf(driver.spark.conf),
    )  # fmt: skip


@router.command("maintain")
@click.option("--topic", required=True, help="The topic whose tables to maintain.")
@TABLE
@ROUTER_CONFIG
@DATA_DIR
def router_maintain(topic: str, table: str | None, config_file: Path | None, data_dir: Path | None) -> None:
    """Compact closed hours, expire old snapshots, remove orphan files; safe while the router runs."""
    from bergstream.router.config import load_router_config
    from bergstream.router.maintain import maintain

    _configure_logging()
    config = load_router_config(
        topic, config_file, defaults=_router_defaults(data_dir, topic), overrides={"table": table}
    )
    spark = _router_spark(config, f"bergstream-maintain-{topic}")
    try:
        for result in maintain(spark, config):
            click.echo(result.summary())
    finally:
        spark.stop()


@router.command("redrive")
@click.option("--topic", required=True, help="The topic whose dead letters to parse again.")
@click.option("--reason", default=None, help="Only the dead letters whose reason contains this text.")
@click.option("--dry-run", is_flag=True, help="Parse and report what would happen; write nothing.")
@click.option(
    "--schema", default=None, help="Event schema (default: from the topic's file, else the topic's name)."
)
@TABLE
@ROUTER_CONFIG
@DATA_DIR
def router_redrive(
    topic: str,
    reason: str | None,
    dry_run: bool,
    schema: str | None,
    table: str | None,
    config_file: Path | None,
    data_dir: Path | None,
) -> None:
    """Parse a topic's dead letters again: archive those that parse now, exactly once, and mark them."""
    from bergstream.router.config import load_router_config
    from bergstream.router.redrive import redrive

    if reason is not None and not reason.strip():
        raise click.BadParameter("give some text of the reason", param_hint="--reason")
    _configure_logging()
    config = load_router_config(
        topic,
        config_file,
        defaults=_router_defaults(data_dir, topic),
        overrides={"schema": schema, "table": table},
    )
    spark = _router_spark(config, f"bergstream-redrive-{topic}")
    try:
        report = redrive(spark, config, reason, dry_run=dry_run, show_progress=sys.stderr.isatty())
    finally:
        spark.stop()
    for line in report.lines():
        click.echo(line)


@cli.group()
def backfill() -> None:
    """Read archive tables back in lateness-bounded order: plan a window, run an application over it."""


BACKFILL_WINDOW = [
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


_Command = TypeVar("_Command", bound=Callable[..., Any])


def _with(options: list[Callable[[Any], Any]]) -> Callable[[_Command], _Command]:
    """Several click options at once, in the order listed."""

    def decorate(function: _Command) -> _Command:
        for option in reversed(options):
            function = option(function)
        return function

    return decorate


def _catalog(config_file: Path | None, data_dir: Path | None) -> Any:
    """The catalog of a settings file (an application's or a topic's), else the local stack's."""
    from bergstream.backfill.runtime.settings import catalog_from_file
    from bergstream.errors import StackError
    from bergstream.local import LocalStack
    from bergstream.site import site_catalog, site_file

    if config_file is not None:
        return catalog_from_file(config_file)
    site = site_file()
    if site is not None and (catalog := site_catalog(site)) is not None:
        return catalog
    stack = LocalStack.at(_data_dir(data_dir))
    if not stack.status().running and not stack.config.catalog.uri.startswith("jdbc:sqlite:"):
        raise StackError(f"no local stack in {stack.config.data_dir}: name a settings file with --config")
    return stack.config.catalog


@backfill.command("plan")
@click.option(
    "--table",
    "tables",
    multiple=True,
    required=True,
    help="Archive table: T, archive.T or catalog.archive.T.",
)
@_with(BACKFILL_WINDOW)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A settings file whose catalog to use (default: the local stack's).",
)
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
    from bergstream.backfill.read.order import ordering
    from bergstream.backfill.read.planner import plan
    from bergstream.backfill.read.summary import plan_lines
    from bergstream.timeparse import parse_duration

    bound = parse_duration(max_misalignment, "--max-misalignment") if max_misalignment else None
    made = plan(
        _catalog(config_file, data_dir), list(tables), window_of(start, end), ordering(bound, strict),
        list(regions) or None,
    )  # fmt: skip
    if as_json:
        click.echo(made.dumps())
        return
    for line in plan_lines(made):
        click.echo(line)


def _app_defaults(data_dir: Path | None, app: str) -> dict[str, Any]:
    """Endpoints from the site settings (BERGSTREAM_SITE), else from the local stack when it runs: weaker
    than the app's file and the flags."""
    from bergstream.local import LocalStack
    from bergstream.site import app_defaults, site_file

    site = site_file()
    if site is not None:
        return app_defaults(site, app)
    stack = LocalStack.at(_data_dir(data_dir))
    defaults: dict[str, Any] = {"checkpoint_location": str(stack.config.data_dir / "apps" / app)}
    status = stack.status()
    if status.running:
        defaults["kafka"] = {"kafka.bootstrap.servers": status.bootstrap_servers}
        defaults["catalog"] = stack.config.catalog.model_dump(mode="json", exclude_none=True)
    return defaults


APP_OPTIONS = [
    click.option("--app", required=True, help="The application: its settings are deploy/apps/<app>.yaml."),
    click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Settings file (default: deploy/apps/<app>.yaml).",
    ),
    click.option("--entry", default=None, help="Run this module:function instead of the file's entry."),
    click.option("--checkpoint", default=None, help="Checkpoint location (default: one per run's request)."),
    click.option("--output-table", default=None, help="Where the application's output goes."),
    click.option("--json", "as_json", is_flag=True, help="Print the report as JSON."),
]


def _run_app(settings: Any, available_now: bool, as_json: bool) -> None:
    from bergstream.backfill.runtime.run import run_app
    from bergstream.spark import build_spark_session

    spark = build_spark_session(
        settings.catalog, master=settings.spark.master, app_name=f"bergstream-app-{settings.app}",
        conf=settings.spark.conf,
    )  # fmt: skip
    try:
        report = run_app(spark, settings, available_now=available_now, show_progress=sys.stderr.isatty())
    finally:
        spark.stop()
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        for line in report.lines():
            click.echo(line)


@backfill.command("run")
@_with(APP_OPTIONS)
@_with(BACKFILL_WINDOW)
@click.option("--unordered", is_flag=True, help="Read the window in one epoch, in no order.")
@DATA_DIR
def backfill_run(
    app: str,
    config_file: Path | None,
    entry: str | None,
    checkpoint: str | None,
    output_table: str | None,
    as_json: bool,
    start: str,
    end: str,
    max_misalignment: str | None,
    regions: tuple[str, ...],
    strict: bool,
    unordered: bool,
    data_dir: Path | None,
) -> None:
    """Run an application over a window of its archive; the same command resumes a stopped run."""
    from bergstream.backfill.runtime.settings import UNORDERED, backfill_checkpoint, load_app_settings

    _configure_logging()
    if unordered and (max_misalignment or strict):
        raise click.UsageError("--unordered goes with neither --max-misalignment nor --strict")
    window: dict[str, Any] = {
        "start": start,
        "end": end,
        "max_misalignment": UNORDERED if unordered else max_misalignment,
        "strict": strict or None,
        "regions": list(regions) or None,
    }
    overrides = {"mode": "backfill", "entry": entry, "output_table": output_table, "backfill": window}
    settings = load_app_settings(app, config_file, defaults=_app_defaults(data_dir, app), overrides=overrides)
    checkpoint = checkpoint or backfill_checkpoint(settings)
    _run_app(settings.model_copy(update={"checkpoint_location": checkpoint}), True, as_json)


@backfill.command("replay")
@click.option("--table", required=True, help="Archive table: T, archive.T or catalog.archive.T.")
@_with(BACKFILL_WINDOW)
@click.option("--to-topic", required=True, help="The Kafka topic to republish into (created when missing).")
@click.option("--include-dead-letters", is_flag=True, help="Also republish the raw dead-lettered records.")
@click.option("--bootstrap-servers", default=None, help="Kafka to send to (default: the local stack's).")
@click.option(
    "--partitions", type=int, default=None, help="Partitions of a new topic (default: as the source)."
)
@click.option("--schema", default=None, help="Event schema (default: the table's bergstream.schema).")
@click.option("--encoding", type=click.Choice(["json", "avro"]), default=None,
              help="Value encoding (default: the table's bergstream.encoding).")  # fmt: skip
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A settings file whose catalog to use (default: the local stack's).")  # fmt: skip
@CLIENT_CONFIG
@click.option("--producer-option", "producer_options", multiple=True, metavar="KEY=VALUE",
              help="librdkafka producer setting (linger.ms=50, ...), repeatable.")  # fmt: skip
@DATA_DIR
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
    data_dir: Path | None,
) -> None:
    """Republish a window of the archive into a Kafka topic in backfill order, for consumers outside Spark."""
    from bergstream.backfill.read.batches import window_of
    from bergstream.backfill.read.order import ordering
    from bergstream.backfill.replay import replay
    from bergstream.timeparse import parse_duration

    _configure_logging()
    producer_config: dict[str, Any] = _kafka_client(bootstrap_servers, client_config, data_dir)
    for option in producer_options:
        key, equals, value = option.partition("=")
        if not equals or not key:
            raise click.BadParameter(f"{option!r}: write KEY=VALUE", param_hint="--producer-option")
        producer_config[key] = value
    bound = parse_duration(max_misalignment, "--max-misalignment") if max_misalignment else None
    report = replay(
        _catalog(config_file, data_dir), table, window_of(start, end), ordering(bound, strict), to_topic,
        producer_config, regions=list(regions) or None, include_dead_letters=include_dead_letters,
        schema=schema, encoding=encoding, partitions=partitions,
    )  # fmt: skip
    click.echo(report.summary())


@cli.group()
def app() -> None:
    """Run an application of deploy/apps/ live, reading its named sources from Kafka."""


@app.command("run")
@_with(APP_OPTIONS)
@click.option("--available-now", is_flag=True, help="Read what the topics hold now, then stop.")
@DATA_DIR
def app_run(
    app: str,
    config_file: Path | None,
    entry: str | None,
    checkpoint: str | None,
    output_table: str | None,
    as_json: bool,
    available_now: bool,
    data_dir: Path | None,
) -> None:
    """Run an application live until stopped (or until caught up with --available-now)."""
    from bergstream.backfill.runtime.settings import load_app_settings

    _configure_logging()
    overrides = {
        "mode": "live",
        "entry": entry,
        "output_table": output_table,
        "checkpoint_location": checkpoint,
    }
    settings = load_app_settings(app, config_file, defaults=_app_defaults(data_dir, app), overrides=overrides)
    _run_app(settings, available_now=available_now, as_json=as_json)


@cli.group()
def deploy() -> None:
    """Render what runs a topic's router elsewhere: a spark-submit command, Kubernetes manifests."""


DEPLOY_TOPICS = click.option(
    "--topic", "topics", multiple=True, required=True,
    help="The topic whose router to render; repeated, with --group, one driver for them all.",
)  # fmt: skip
DEPLOY_GROUP = click.option(
    "--group", default=None,
    help="Render one driver running a query per --topic, named after this group (the topics' files "
    "from --topics-dir), instead of a driver per topic.",
)  # fmt: skip
TOPICS_DIR_OPTION = click.option(
    "--topics-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="With --group: where the topics' <topic>.yaml files are (default: deploy/topics).",
)  # fmt: skip


def _group_dir(
    topics: tuple[str, ...], group: str | None, config_file: Path | None, topics_dir: Path | None
) -> Path | None:
    """The folder of a group's settings files; None for one topic's own driver."""
    from bergstream.router.config import TOPICS_DIR

    if group is None:
        if len(topics) > 1:
            raise click.UsageError("several topics run in one driver: name it with --group")
        if topics_dir is not None:
            raise click.UsageError("--topics-dir is for a --group; one topic's file is given with --config")
        return None
    if config_file is not None:
        raise click.UsageError("--config is one topic's file; a group's files are read from --topics-dir")
    return topics_dir if topics_dir is not None else TOPICS_DIR


@deploy.command("spark-submit")
@DEPLOY_TOPICS
@DEPLOY_GROUP
@ROUTER_CONFIG
@TOPICS_DIR_OPTION
@click.option("--available-now", is_flag=True, help="Archive what the topic holds, then exit.")
@DATA_DIR
def deploy_spark_submit(
    topics: tuple[str, ...],
    group: str | None,
    config_file: Path | None,
    topics_dir: Path | None,
    available_now: bool,
    data_dir: Path | None,
) -> None:
    """Print the spark-submit command of a topic's router, with its master and Spark settings; with
    --group, of one driver archiving every --topic."""
    from bergstream.deploy.render import shell_command, spark_submit, spark_submit_group
    from bergstream.router.config import load_router_config, topic_file

    directory = _group_dir(topics, group, config_file, topics_dir)
    if group is not None and directory is not None:
        configs = [
            load_router_config(
                topic, topic_file(topic, directory), defaults=_router_defaults(data_dir, topic), overrides={}
            )
            for topic in topics
        ]
        click.echo(shell_command(spark_submit_group(group, configs, directory, available_now)))
        return
    (topic,) = topics
    config = load_router_config(topic, config_file, defaults=_router_defaults(data_dir, topic), overrides={})
    path = config_file if config_file is not None else topic_file(topic)
    click.echo(shell_command(spark_submit(config, path if path.exists() else None, available_now)))


@deploy.command("kubernetes")
@DEPLOY_TOPICS
@DEPLOY_GROUP
@ROUTER_CONFIG
@TOPICS_DIR_OPTION
def deploy_kubernetes(
    topics: tuple[str, ...], group: str | None, config_file: Path | None, topics_dir: Path | None
) -> None:
    """Print the Kubernetes manifests of a topic's router, for `kubectl apply -f -`; with --group, one
    Deployment whose driver archives every --topic, a query each.

    Nothing comes from the local stack: the topic's file names the cluster's Kafka, catalog and
    checkpoint location."""
    from bergstream.deploy.render import group_manifests, kubernetes_manifests, manifests_yaml
    from bergstream.router.config import load_router_config, topic_file

    directory = _group_dir(topics, group, config_file, topics_dir)
    if group is not None and directory is not None:
        configs = [
            load_router_config(topic, topic_file(topic, directory), defaults={}, overrides={})
            for topic in topics
        ]
        click.echo(manifests_yaml(group_manifests(group, configs)), nl=False)
        return
    (topic,) = topics
    config = load_router_config(topic, config_file, defaults={}, overrides={})
    click.echo(manifests_yaml(kubernetes_manifests(config)), nl=False)


@cli.group()
def jars() -> None:
    """The JVM jars pinned in core/src/bergstream/jvm/pom.xml."""


@jars.command("resolve")
@click.argument(
    "jar_sets",
    nargs=-1,
    type=click.Choice(["spark", "kafka", "rest-catalog", "kafka-connect", "iceberg-kafka-connect"]),
)
def jars_resolve(jar_sets: tuple[str, ...]) -> None:
    """Resolve the pinned jars into the local cache (once; later calls do nothing): those the local stack
    runs, or the sets named."""
    from bergstream import jars as pinned

    named = tuple(s for s in (*pinned.JAR_SETS, *pinned.ON_DEMAND_JAR_SETS) if s in jar_sets)
    chosen = named or pinned.JAR_SETS
    for jar_set, directory in pinned.resolve_all(jar_sets=chosen).items():
        click.echo(f"{jar_set}: {len(pinned.resolved_jars(jar_set))} jars in {directory}")
    click.echo(f"bergstream's Java: {pinned.project_jar()}")


@jars.command("versions")
def jars_versions() -> None:
    """Print the pinned Spark, Iceberg and Kafka versions."""
    from dataclasses import asdict

    from bergstream import jars as pinned

    _print_status(asdict(pinned.pinned_versions()))


@cli.command()
@DATA_DIR
@click.option("--count", type=int, default=20_000, show_default=True, help="Records per topic.")
def demo(data_dir: Path | None, count: int) -> None:
    """Start the stack, produce both topics, archive them into Iceberg, summarise, stop."""
    from bergstream.cli.demo import run_demo

    run_demo(_data_dir(data_dir) / "demo", count)


def main() -> None:
    # A crash inside a native library (librdkafka, the JVM bridge) prints the Python stacks, not nothing.
    faulthandler.enable()
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("bergstream: aborted", err=True)
        sys.exit(130)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except BergstreamError as error:
        click.echo(f"bergstream: error: {error}", err=True)
        sys.exit(1)
