"""What every bench starts with: its options' parser, and a local stack of its own on free ports."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bergstream.local import LocalStack, StackConfig
from bergstream.local.processes import free_ports

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from bergstream.router.config import RouterConfig
    from bergstream.router.driver.query import TopicsQuery
    from bergstream.router.metrics import RouterMetrics


def bench_parser(description: str | None) -> argparse.ArgumentParser:
    """The parser of a bench whose module docstring is its help."""
    return argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_workload(parser: argparse.ArgumentParser, events: int) -> None:
    """The workload most benches take: how many events, of which topic's schema, encoded how."""
    parser.add_argument("--events", type=int, default=events)
    parser.add_argument("--topic", default="playback", choices=("playback", "impression"))
    parser.add_argument("--encoding", default="json", choices=("json", "avro"))


@contextmanager
def bench_home(name: str) -> Iterator[Path]:
    """A folder of the bench's own under the temporary folder, holding the scratch space of every Spark it
    starts too (a driver the bench kills cannot remove its own, 140 MB of copied jars each); removed at the
    end."""
    home = Path(tempfile.mkdtemp(prefix=f"bergstream-bench-{name}-"))
    before = os.environ.get("SPARK_LOCAL_DIRS")
    os.environ["SPARK_LOCAL_DIRS"] = str(home / "spark-local")
    try:
        yield home
    finally:
        if before is None:
            os.environ.pop("SPARK_LOCAL_DIRS", None)
        else:
            os.environ["SPARK_LOCAL_DIRS"] = before
        shutil.rmtree(home, ignore_errors=True)


@contextmanager
def throwaway_stack(name: str, **config: Any) -> Iterator[tuple[LocalStack, Any, Path]]:
    """A local stack (Kafka and a catalog, plus `config`'s StackConfig settings) on free ports, in a folder
    of its own: the stack, its status and its folder. Stopped and removed at the end."""
    with bench_home(name) as home:
        kafka_port, controller_port = free_ports(2)
        stack = LocalStack(
            StackConfig(data_dir=home, kafka_port=kafka_port, controller_port=controller_port, **config)
        )
        try:
            yield stack, stack.up(), home
        finally:
            stack.down()


def topic_query(
    spark: SparkSession, config: RouterConfig, metrics: RouterMetrics | None = None
) -> TopicsQuery:
    """The query of `router run --topic T`, for the topic of `config`, on `spark`, to run without a driver
    around it (no maintenance, no signals): what a bench times."""
    from bergstream.router.driver.query import TopicsQuery
    from bergstream.router.driver.settings import named_topics_settings
    from bergstream.router.metrics import RouterMetrics

    topic = config.settings.topic
    settings = named_topics_settings(topic, [config], None)
    return TopicsQuery(settings, lambda _: config, spark, metrics or RouterMetrics(topic), strict=True)
