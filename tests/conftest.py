from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from bergstream.spark import build_spark_session
from tests.services import Services, services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """One Kafka broker and one Iceberg catalog for the whole run."""
    yield from services(tmp_path_factory.mktemp("stack"))


@pytest.fixture(scope="session")
def spark(stack: Services) -> Iterator[SparkSession]:
    session = build_spark_session(
        stack.catalog,
        master="local[2]",
        app_name="bergstream-tests",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"},
    )
    yield session
    session.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic of its own for each test, so that tests sharing the broker do not see each other's records."""
    name: str = request.node.name
    return "t_" + "".join(c if c.isalnum() else "_" for c in name)[:80]
