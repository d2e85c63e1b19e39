"""Real services for the tests: a Kafka broker and an Iceberg catalog, started once per run.

Where a Docker engine answers (and BERGSTREAM_TEST_SERVICES is not `local`), the broker runs in a
container through testcontainers; otherwise the local stack starts it as a process on 127.0.0.1.
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
from bergstream.local.processes import free_port


@dataclass(frozen=True)
class Services:
    bootstrap_servers: str
    catalog: CatalogConfig
    kafka_log_dir: Path | None  # where the broker keeps its log segments, when it runs here


def docker_engine_reachable() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:  # no client library, no socket, or no engine behind it
        return False
    return True


def use_docker() -> bool:
    choice = os.environ.get("BERGSTREAM_TEST_SERVICES", "auto")
    return choice == "docker" or (choice == "auto" and docker_engine_reachable())


@contextmanager
def local_services(data_dir: Path) -> Iterator[Services]:
    stack = LocalStack(StackConfig(data_dir=data_dir, kafka_port=free_port(), controller_port=free_port()))
    status = stack.up()
    try:
        yield Services(status.bootstrap_servers, stack.config.catalog, stack.config.broker.log_dir)
    finally:
        stack.down()


@contextmanager
def container_services(data_dir: Path) -> Iterator[Services]:
    from testcontainers.kafka import KafkaContainer

    image = f"apache/kafka:{jars.pinned_versions().kafka}"
    with KafkaContainer(image).with_kraft() as kafka:
        catalog = CatalogConfig.sqlite(data_dir / "catalog.db", data_dir / "warehouse")
        yield Services(kafka.get_bootstrap_server(), catalog, None)


def services(data_dir: Path) -> Iterator[Services]:
    start = container_services if use_docker() else local_services
    with start(data_dir) as running:
        yield running
