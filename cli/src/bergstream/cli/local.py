"""`bergstream local`: the embedded stack on loopback, for the demo, the tests and a laptop."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from bergstream.cli.options import DATA_DIR, echo_mapping


@click.group()
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
    from bergstream.cli.endpoints import Endpoints
    from bergstream.local import LocalStack, StackConfig
    from bergstream.local import object_store as store_server

    started = time.monotonic()
    config = StackConfig(
        data_dir=Endpoints.local_stack(data_dir).data_dir, host=host, kafka_port=kafka_port,
        controller_port=controller_port,
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
    echo_mapping(status.to_json())


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
    from bergstream.cli.endpoints import Endpoints
    from bergstream.errors import StackError
    from bergstream.local import kafka_security

    stack = Endpoints.local_stack(data_dir).running_stack()
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
    from bergstream.cli.endpoints import Endpoints

    stack = Endpoints.local_stack(data_dir).stack
    stack.down()
    click.echo(f"local stack in {stack.config.data_dir} stopped")


@local.command("burrow")
@DATA_DIR
@click.option("--http-port", type=int, default=8000, show_default=True, help="Port of Burrow's HTTP API.")
def local_burrow(data_dir: Path | None, http_port: int) -> None:
    """Run Burrow (1.9.5 or newer; $BERGSTREAM_BURROW or the PATH) against the running local stack until
    Ctrl-C. Its settings are written to <data dir>/burrow/burrow.toml."""
    from bergstream.cli.endpoints import Endpoints
    from bergstream.errors import StackError
    from bergstream.local.burrow import BurrowSettings, burrow_server

    stack = Endpoints.local_stack(data_dir).running_stack()
    if stack.config.security != "none":
        raise StackError(
            "`local burrow` watches a plain-text stack; a secured one needs Burrow's TLS and SASL settings"
        )
    settings = BurrowSettings(stack.config.bootstrap_servers, http_port)
    with _until_stopped() as stopped, burrow_server(settings, stack.config.data_dir / "burrow") as server:
        lag = f"{server.url}/v3/kafka/{settings.cluster}/consumer/bergstream-router.<topic>/lag"
        click.echo(f"Burrow watches {settings.bootstrap_servers}: {lag}; Ctrl-C stops it")
        stopped.wait()


@local.command("prometheus")
@click.option(
    "--target", "targets", multiple=True, required=True, help="A router's metrics, host:port (repeatable)."
)
@click.option(
    "--port", type=int, default=9090, show_default=True, help="Port of Prometheus's web UI and API."
)
@click.option(
    "--spark-target", "spark_targets", multiple=True,
    help="A router's Spark UI, host:port (repeatable): Spark's own metrics of its driver and executors.",
)  # fmt: skip
@click.option("--scrape-interval", default="15s", show_default=True)
def local_prometheus(
    targets: tuple[str, ...], spark_targets: tuple[str, ...], port: int, scrape_interval: str
) -> None:
    """Run Prometheus (the machine's binary) scraping routers' metrics, with the alert rules of
    bergstream/deploy/prometheus/alerts.yml, until Ctrl-C or SIGTERM."""
    from bergstream.deploy import ALERT_RULES
    from bergstream.local.prometheus import prometheus_server

    with (
        _until_stopped() as stopped,
        prometheus_server(list(targets), scrape_interval, rules=ALERT_RULES, port=port,
                          spark_targets=list(spark_targets)) as server,
    ):  # fmt: skip
        scraped = ", ".join([*targets, *spark_targets])
        click.echo(f"Prometheus scrapes {scraped} every {scrape_interval}: {server.url}/alerts")
        click.echo(f"  time lag: {server.url}/graph?g0.expr=max+by+(topic)(bergstream_router_lag_seconds)")
        click.echo("Ctrl-C or SIGTERM stops it")
        stopped.wait()


@contextmanager
def _until_stopped() -> Iterator[threading.Event]:
    """An event that SIGINT or SIGTERM sets, even where the shell started this in the background with
    SIGINT ignored; the signals stay caught until the server a command runs has stopped in its cleanup."""
    from bergstream.signals import on_stop_signals

    stopped = threading.Event()
    with on_stop_signals(stopped.set):
        yield stopped


@local.command("status")
@DATA_DIR
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts and tests.")
def local_status(data_dir: Path | None, as_json: bool) -> None:
    """Say whether the stack runs and where its services are; exits 1 when it is not running."""
    from bergstream.cli.endpoints import Endpoints

    status = Endpoints.local_stack(data_dir).stack.status()
    if as_json:
        click.echo(json.dumps(status.to_json(), indent=2))
    else:
        echo_mapping(status.to_json())
    if not status.running:
        sys.exit(1)
