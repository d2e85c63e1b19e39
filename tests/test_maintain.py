"""`bergstream router maintain` while the router runs: closed hours compacted, nothing lost or doubled."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bergstream.loadgen.events import EventModel
from bergstream.router import maintain
from bergstream.router.config import load_router_config
from bergstream.router.driver.launch import archive_available_now
from bergstream.router.maintain import closed_before, until_committed
from bergstream.router.retry import Backoff
from bergstream.schemas.event_schema import load_event_schema
from tests.commands import run_in_process
from tests.routers import archived_offsets, eventually, start_router, write_config
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def test_closed_hours_are_those_that_ended_a_grace_period_ago() -> None:
    now = datetime(2026, 11, 22, 15, 10, tzinfo=UTC)
    assert closed_before(now, timedelta(minutes=15)) == datetime(2026, 11, 22, 14, 0, tzinfo=UTC)
    assert closed_before(now, timedelta(minutes=5)) == datetime(2026, 11, 22, 15, 0, tzinfo=UTC)


def produce_at(bootstrap: str, topic: str, count: int, when: datetime, seed: int) -> None:
    schema = load_event_schema("playback")
    producer = Producer({"bootstrap.servers": bootstrap})
    events = EventModel(seed=seed).events("playback")
    for _ in range(count):
        generated = next(events)
        producer.produce(
            topic,
            key=generated.key,
            value=schema.encode(generated.event, "json"),
            timestamp=int(when.timestamp() * 1000),
        )
    assert producer.flush(30) == 0


def files_per_hour(stack: Services, table: str) -> Counter[int]:
    files = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{table}").inspect.files().to_pylist()
    return Counter(next(iter(f["partition"].values())) for f in files)


def test_maintain_while_the_router_runs(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(30)
    # Each closed hour's 300 records span at least three batches: three files or more to compact.
    config = write_config(stack, tmp_path, topic_name, max_offsets_per_trigger=100)
    now = datetime.now(UTC)
    closed_hours = [now - timedelta(hours=h) for h in (3, 2)]
    for index, when in enumerate(closed_hours):
        produce_at(stack.bootstrap_servers, topic_name, 300, when, seed=index)
    # The closed hours archived in the tests' own Spark session; the router process goes on from there.
    assert archive_available_now(spark, load_router_config(topic_name, config, {}, {})).read == 600
    before = files_per_hour(stack, topic_name)
    hours = {int(when.timestamp()) // 3600 for when in closed_hours}
    assert all(before[hour] > 2 for hour in hours), before

    stop = threading.Event()

    def keep_producing() -> None:
        seed = 100
        while not stop.is_set():
            produce_at(stack.bootstrap_servers, topic_name, 20, datetime.now(UTC), seed)
            seed += 1
            time.sleep(0.5)

    producing = threading.Thread(target=keep_producing)
    router_log = tmp_path / "router.log"
    router = start_router(topic_name, config, router_log)
    producing.start()
    try:
        # Maintenance while the router appends what is being produced now.
        eventually(
            lambda: router_log.read_text().count(" batch ") >= 2, "two batches of the live router", 180
        )
        # An operator's maintenance, on the tests' session: a driver beside the router's.
        operator = ["router", "maintain", "--topic", topic_name, "--config", str(config), "--json"]
        maintained = run_in_process(spark, *operator)
        assert maintained.returncode == 0, failure_lines(maintained.stderr)
        report = json.loads(maintained.stdout)
        assert report["ok"] and report["topic"] == topic_name
        compacted = {table["table"]: table for table in report["tables"]}
        assert (
            compacted[f"{stack.catalog.name}.{stack.catalog.namespace}.{topic_name}"]["rewritten_files"] > 2
        )
        stop.set()
        producing.join()
        # The live router goes on to archive all that was produced.
        produced = sum(high for _, high in admin_watermarks(stack, topic_name).values())
        eventually(lambda: len(archived_offsets(stack, topic_name)) >= produced, "every record archived")
    finally:
        stop.set()
        producing.join()
        router.send_signal(signal.SIGINT)
        router.wait(120)

    after = files_per_hour(stack, topic_name)
    warnings = [line for line in maintained.stderr.splitlines() if "WARN" in line and "bergstream" in line]
    assert all(after[hour] == 1 for hour in hours), (after, report["tables"], warnings)
    seen = archived_offsets(stack, topic_name)
    assert len(seen) == len(set(seen)), "an offset archived twice"
    assert len(seen) == produced, "an offset lost"


def failure_lines(stderr: str) -> str:
    """The error lines of a failed command and the Java exceptions under them, without their stack frames."""
    lines = [
        line for line in stderr.splitlines()
        if not line.lstrip().startswith("at ")
        and any(word in line.lower() for word in ("error", "exception", "caused by"))
    ]  # fmt: skip
    return "\n".join(lines[:40])[:8000]


def admin_watermarks(stack: Services, topic: str) -> dict[int, tuple[int, int]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": "watermarks"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in (0, 1)}
    finally:
        consumer.close()


def test_a_maintenance_commit_that_lost_to_another_commit_is_made_again_on_fresh_metadata(
    spark: SparkSession, stack: Services, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(maintain, "_LOST_RACE_BACKOFF", Backoff(initial_backoff_seconds=0.01))
    identifier = stack.catalog.table_identifier(topic_name)
    spark.sql(f"CREATE TABLE {identifier} (id BIGINT) USING iceberg")
    jvm = spark._jvm  # type: ignore[attr-defined]
    calls: list[int] = []

    def losing(times: int, java_error: Any) -> Callable[[], int]:
        """A step whose first `times` commits fail in Java with `java_error`, as a commit that lost does."""

        def step() -> int:
            calls.append(1)
            if len(calls) <= times:
                jvm.org.apache.iceberg.relocated.com.google.common.base.Throwables.throwIfUnchecked(
                    java_error
                )
            return len(calls)

        return step

    no_arguments = spark.sparkContext._gateway.new_array(jvm.java.lang.Object, 0)  # type: ignore[union-attr]
    lost = jvm.org.apache.iceberg.exceptions.CommitFailedException(
        "metadata location has changed", no_arguments
    )
    assert until_committed(spark, identifier, "a step", losing(2, lost)) == 3

    calls.clear()
    with pytest.raises(Exception, match="metadata location has changed"):
        until_committed(spark, identifier, "a step", losing(100, lost))
    assert len(calls) == maintain._LOST_RACE_ATTEMPTS

    calls.clear()
    refused = jvm.org.apache.iceberg.exceptions.ValidationException("a conflicting delete", no_arguments)
    with pytest.raises(Exception, match="a conflicting delete"):  # any other error, at once
        until_committed(spark, identifier, "a step", losing(1, refused))
    assert len(calls) == 1
