"""Running `bergstream router run` as its users do: a process of its own, configured by a YAML file."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.commands import Ran, run_in_process
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).parent.parent


def write_config(stack: Services, directory: Path, name: str, **settings: Any) -> Path:
    """A router's settings file for topic `name`, with `settings` replacing or adding keys."""
    topic = name
    config = {
        "topic": topic,
        "schema": settings.pop("schema", "playback"),
        "encoding": settings.pop("encoding", "json"),
        "table": topic,
        "cluster": "test",
        "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        "trigger_interval": "1 second",
        "max_offsets_per_trigger": 5000,
        "checkpoint_location": str(directory / "checkpoints" / topic),
        "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
        "spark": {
            "master": "local[2]",
            "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
        },
        **settings,
    }
    path = directory / f"{topic}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def write_defaults(stack: Services, directory: Path, **settings: Any) -> Path:
    """The defaults file of a router over several topics (`--pattern`, `--all`), checkpointing to
    directory/checkpoint and reading each topic from its earliest offset; `settings` replace or add keys."""
    defaults = {
        "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        "checkpoint_location": str(directory / "checkpoint"),
        "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false"}},
        **settings,
    }
    path = directory / "defaults.yaml"
    path.write_text(yaml.safe_dump(defaults))
    return path


def pattern_command(pattern: str, defaults: Path, topics_dir: Path, *flags: str) -> list[str]:
    """`bergstream router run --pattern`: one query over every topic whose name matches `pattern`."""
    return [
        sys.executable, "-m", "bergstream", "router", "run", "--pattern", pattern,
        "--defaults", str(defaults), "--topics-dir", str(topics_dir), *flags,
    ]  # fmt: skip


def router_command(topic: str, config: Path, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bergstream",
        "router",
        "run",
        "--topic",
        topic,
        "--config",
        str(config),
        *flags,
    ]


def run_router(
    topic: str, config: Path, *flags: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        router_command(topic, config, *flags),
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        cwd=ROOT,
    )


def archive_whole(spark: SparkSession, topic: str, config: Path, *flags: str) -> Ran:
    """`router run --topic T --config C --available-now`, run whole on the test's Spark session
    (commands.run_in_process): for a test that neither kills the router nor gives it Spark settings of its
    own."""
    command = ["router", "run", "--topic", topic, "--config", str(config), "--available-now", *flags]
    return run_in_process(spark, *command)


def start_router(topic: str, config: Path, log: Path, *flags: str) -> subprocess.Popen[bytes]:
    return start_command(router_command(topic, config, *flags), log)


def start_command(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`command` started in a session of its own (a SIGKILL of its group ends its Spark JVM too), its output
    appended to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )


def committed_offsets(stack: Services, topic: str, partitions: list[int]) -> dict[int, int]:
    consumer = Consumer(
        {"bootstrap.servers": stack.bootstrap_servers, "group.id": f"bergstream-router.{topic}"}
    )
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in committed}


def archived_offsets(stack: Services, table: str) -> list[tuple[int, int]]:
    """(partition, offset) of every row of the table and of its dead-letter table."""
    catalog = stack.catalog.load()
    seen: list[tuple[int, int]] = []
    for name in (table, f"{table}__dlq"):
        rows = catalog.load_table(f"{stack.catalog.namespace}.{name}").scan(selected_fields=("__metadata__",))
        metadata = rows.to_arrow().column("__metadata__").to_pylist()
        seen += [(m["partition"], m["offset"]) for m in metadata]
    return seen


def appended_by_spark(stack: Services, table: str) -> list[dict[str, str]]:
    """The summaries of the commits to the table and its dead-letter table that Spark's Iceberg writer made
    (it stamps its application in each): none where bergstream's one writer wrote every batch."""
    catalog = stack.catalog.load()
    found = []
    for name in (table, f"{table}__dlq"):
        for snapshot in catalog.load_table(f"{stack.catalog.namespace}.{name}").snapshots():
            summary = snapshot.summary
            if summary is not None and "spark.app.id" in summary.additional_properties:
                found.append(dict(summary.additional_properties))
    return found


def produced_offsets(report_offsets: dict[int, tuple[int, int]]) -> set[tuple[int, int]]:
    """Every (partition, offset) of a produce report's {partition: (first, last)}."""
    return {(p, o) for p, (low, high) in report_offsets.items() for o in range(low, high + 1)}


def eventually(check: Callable[[], bool], what: str, timeout: float = 180, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def recreate(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete `topic` and create it again under its name, once Kafka has finished deleting it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while True:
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
            return
        except KafkaException as error:  # still being deleted
            assert time.monotonic() < deadline, f"{topic}: not created again in 60s: {error}"
            time.sleep(0.2)


def unread_record(checkpoint: Path) -> dict[str, Any]:
    """The topics with a range unread that the newest record beside a router's checkpoint holds, each with
    where its range starts ({partition: offset}, partitions as text) and since when; {} while none is
    recorded, or while the newest is being written."""
    from bergstream.router.driver.unread import RECORDS_DIR

    records = checkpoint / RECORDS_DIR
    paths = sorted(records.glob("*.json"), key=lambda path: int(path.stem)) if records.is_dir() else []
    try:
        return dict(json.loads(paths[-1].read_text())["topics"]) if paths else {}
    except ValueError:  # cut off as it is written
        return {}
