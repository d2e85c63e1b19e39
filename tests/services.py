"""Real services for the tests: a Kafka broker and an Iceberg catalog, started once per run.

Where a Docker engine answers and has the apache/kafka image of the pinned version, or can pull it (and
BERGSTREAM_TEST_SERVICES is not `local`), the broker runs in a container through testcontainers; otherwise
the local stack starts it as a process on 127.0.0.1.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bergstream import jars
from bergstream.catalog import CatalogConfig
from bergstream.local import LocalStack, StackConfig
from bergstream.local.processes import free_ports


@dataclass(frozen=True)
class Services:
    bootstrap_servers: str
    catalog: CatalogConfig
    kafka_log_dir: Path | None  # where the broker keeps its log segments, when it runs here


def kafka_image() -> str:
    return f"apache/kafka:{jars.pinned_versions().kafka}"


def docker_engine_reachable() -> bool:
    """An engine answers, and it has the broker's image or can pull it."""
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
    except Exception:  # no client library, no socket, or no engine behind it
        return False
    try:
        client.images.get(kafka_image())
    except Exception:
        try:
            client.images.pull(kafka_image())
        except Exception:  # an engine with no registry of images to pull from
            return False
    return True


def use_docker() -> bool:
    choice = os.environ.get("BERGSTREAM_TEST_SERVICES", "auto")
    if choice not in ("auto", "local", "docker"):
        raise ValueError(f"BERGSTREAM_TEST_SERVICES={choice!r}: use auto, local or docker")
    return choice == "docker" or (choice == "auto" and docker_engine_reachable())


@contextmanager
def local_services(data_dir: Path) -> Iterator[Services]:
    kafka_port, controller_port = free_ports(2)
    stack = LocalStack(StackConfig(data_dir=data_dir, kafka_port=kafka_port, controller_port=controller_port))
    status = stack.up()
    try:
        yield Services(status.bootstrap_servers, stack.config.catalog, stack.config.broker.log_dir)
    finally:
        stack.down()


@contextmanager
def container_services(data_dir: Path) -> Iterator[Services]:
    """The same broker as the local stack's, from the apache/kafka image of the pinned version."""
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    (port,) = free_ports(1)
    kafka = (
        DockerContainer(kafka_image())
        .with_bind_ports(9092, port)
        .with_env("KAFKA_NODE_ID", "1")
        .with_env("KAFKA_PROCESS_ROLES", "broker,controller")
        .with_env("KAFKA_LISTENERS", "PLAINTEXT://:9092,CONTROLLER://:9093")
        .with_env("KAFKA_ADVERTISED_LISTENERS", f"PLAINTEXT://127.0.0.1:{port}")
        .with_env("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
        .with_env("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT")
        .with_env("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093")
        .with_env("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
    )
    # testcontainers binds a port on every interface; docker-py takes (address, port) for loopback only.
    kafka.ports = {container_port: ("127.0.0.1", port) for container_port in kafka.ports}
    with kafka:
        wait_for_logs(kafka, "Kafka Server started", timeout=120)
        catalog = CatalogConfig.sqlite(data_dir / "catalog.db", data_dir / "warehouse")
        yield Services(f"127.0.0.1:{port}", catalog, None)


def services(data_dir: Path) -> Iterator[Services]:
    start = container_services if use_docker() else local_services
    with start(data_dir) as running:
        yield running
