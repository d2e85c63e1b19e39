"""`backfill replay` exactly once for read_committed consumers, on real Kafka and Iceberg: killed with SIGKILL
and run again, stopped by a Kafka error and by SIGINT and run again, over a redrive's leftover duplicate,
with a header that has no value, and in strict order.

One topic is produced over two past hours of ingestion time (a few offsets of its first quarter hour going
against time) and archived by the router; each test replays its own part of the window (the killed
replay's first hour gains rows between its two runs) into its own topic.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from confluent_kafka import Producer

from bergstream.backfill.read.batches import read_batches, window_of
from bergstream.backfill.read.order import BoundedOrder
from bergstream.backfill.read.planner import to_micros
from bergstream.backfill.replay import replay
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.schemas.event_schema import load_event_schema
from tests.kafka_reads import read_committed
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration
B = timedelta(minutes=15)
TOPIC = "rx_playback"
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Source:
    start: datetime  # of two hours archived
    nameless: int  # records with a header that has no value, ingested at start + 100 minutes


@pytest.fixture(scope="module")
def source(stack: Services, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Source:
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=4)
    request = ProduceRequest(topic=TOPIC, schema="playback", count=1600, encoding="json", partitions=3,
                             seed=11, late_fraction=0.05, bad_fraction=0.03, ingestion_start=start,
                             ingestion_span=timedelta(hours=2))  # fmt: skip
    produce(request, stack.bootstrap_servers, show_progress=False)
    schema = load_event_schema("playback")
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})

    def send(name: str, at: datetime, partition: int, headers: list[tuple[str, bytes | None]]) -> None:
        event = {"playback_id": name, "account_id": 1, "profile_id": 1, "show_id": 1, "event_type": "START",
                 "event_ts": at, "position_sec": 0, "view_duration_sec": 0,
                 "device": {"type": "tv", "os": "tvos", "app_version": "1"}, "country": "NL",
                 "bitrate_kbps": None}  # fmt: skip
        producer.produce(TOPIC, schema.encode(event, "json"), name.encode(), partition=partition,
                         timestamp=to_micros(at) // 1000, headers=headers)  # fmt: skip

    # Offsets whose ingestion times go backwards: the archive, sorted by ingestion time, has them the other
    # way round from Kafka.
    for second in range(20):
        send(f"backwards-{second}", start + timedelta(minutes=10, seconds=-second), 0, [])
    for partition in range(2):
        send(
            f"nameless-{partition}",
            start + timedelta(minutes=100),
            partition,
            [("trace", None), ("kind", b"test")],
        )
    assert producer.flush(30) == 0
    config = RouterConfig.flat(
        topic=TOPIC, schema="playback", encoding="json", table=TOPIC, cluster="us-east-1",
        kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        checkpoint_location=str(tmp_path_factory.mktemp("replay") / TOPIC), catalog=stack.catalog,
    )  # fmt: skip
    archive_available_now(spark, config)
    return Source(start, 2)


def progress_of(bootstrap: str, target: str) -> dict[str, Any] | None:
    """The newest progress the replays into `target` committed, where there is one."""
    from confluent_kafka.admin import AdminClient

    state = f"bergstream-replay.{target}"
    if state not in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics:
        return None
    committed = read_committed({"bootstrap.servers": bootstrap}, state)
    return json.loads(committed[-1].value()) if committed else None


def in_open_transaction(bootstrap: str, topic: str) -> bool:
    """Whether a partition of `topic` holds records of a transaction not yet ended: its last stable offset
    is behind its high watermark."""
    from confluent_kafka import Consumer, TopicPartition

    ends = []
    for level in ("read_committed", "read_uncommitted"):
        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "check-open", "isolation.level": level}
        )
        try:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            ends.append(
                [consumer.get_watermark_offsets(TopicPartition(topic, p), 10, False)[1] for p in partitions]
            )
        finally:
            consumer.close()
    return ends[0] != ends[1]


def source_of(message: Any) -> tuple[int, int]:
    headers = dict(message.headers())
    return int(headers["bergstream.source.partition"]), int(headers["bergstream.source.offset"])


def archived(
    stack: Services, lower: datetime, upper: datetime, dead_letters: bool = False
) -> set[tuple[int, int]]:
    """(partition, offset) of the rows a replay of [lower, upper) reads, at the tables' current snapshots."""
    iceberg = stack.catalog.load()
    found = set()
    for name in (TOPIC, f"{TOPIC}__dlq") if dead_letters else (TOPIC,):
        rows = iceberg.load_table(f"{stack.catalog.namespace}.{name}").scan().to_arrow().to_pylist()
        for row in rows:
            metadata = row["__metadata__"]
            if lower <= metadata["kafka_ingestion_ts"] < upper and row.get("redrive_id") is None:
                found.add((metadata["partition"], metadata["offset"]))
    return found


def assert_in_offset_order(messages: list[Any]) -> None:
    """In each output partition, the records of one source partition and one epoch come in offset order."""
    last: dict[tuple[int, int, int], int] = {}
    width = B // timedelta(milliseconds=1)
    for message in messages:
        partition, offset = source_of(message)
        place = (message.partition(), partition, message.timestamp()[1] // width)
        assert last.get(place, -1) < offset, f"source partition {partition}: offset {offset} out of order"
        last[place] = offset


def append_to_archive(stack: Services, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa

    table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{TOPIC}")
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))


def archive_rows(stack: Services, lower: datetime, upper: datetime) -> list[dict[str, Any]]:
    table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{TOPIC}")
    rows = table.scan().to_arrow().to_pylist()
    return [row for row in rows if lower <= row["__metadata__"]["kafka_ingestion_ts"] < upper]


def test_a_replay_killed_mid_run_resumes_at_its_first_snapshot_and_delivers_each_record_once(
    stack: Services, spark: SparkSession, source: Source, tmp_path: Path
) -> None:
    """The CLI killed with SIGKILL once its first epoch is committed, in the next one's transaction, then run
    again with the same command after rows were appended to the window: a read_committed consumer sees every
    row of the first run's snapshot once, none of the appended ones, in offset order per source partition
    and epoch; and so does the router that archives the topic, the aborted sends left out."""
    lower, upper = source.start, source.start + timedelta(hours=1)
    target = "rx_killed"
    config = tmp_path / "catalog.yaml"
    config.write_text(yaml.safe_dump({"catalog": stack.catalog.model_dump(mode="json", exclude_none=True)}))
    # One record in flight at a time: the run takes seconds, so that it is killed mid-run.
    command = [
        sys.executable, "-m", "bergstream", "backfill", "replay", "--table", TOPIC,
        "--start", lower.isoformat(), "--end", upper.isoformat(), "--max-misalignment", "15m",
        "--to-topic", target, "--bootstrap-servers", stack.bootstrap_servers, "--config", str(config),
        "--producer-option", "queue.buffering.max.messages=1", "--producer-option", "linger.ms=5",
    ]  # fmt: skip
    expected = archived(stack, lower, upper)
    with (tmp_path / "killed.log").open("wb") as log:
        killed = subprocess.Popen(
            command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 120
    # Killed mid-transaction: an epoch committed, the next one's records in the log and not committed.
    while (
        (progress := progress_of(stack.bootstrap_servers, target)) is None
        or progress["epoch"] < 1
        or not in_open_transaction(stack.bootstrap_servers, target)
    ):
        assert killed.poll() is None, (tmp_path / "killed.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "the replay committed no epoch in 120s"
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    (snapshot,) = progress["snapshots"].values()

    later = archive_rows(stack, lower, upper)[:5]
    for row in later:
        row["__metadata__"]["offset"] += 1_000_000
    append_to_archive(stack, later)
    resumed = subprocess.run(
        [*command, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    report = json.loads(resumed.stdout)
    assert report["ok"] and report["epochs_done"] == report["epochs"] == 4, report
    assert list(report["snapshots"].values()) == [snapshot]
    # The killed run may have committed more epochs after the one seen, but not all four.
    assert report["resumed_at"][0] in (1, 2, 3), report

    messages = read_committed({"bootstrap.servers": stack.bootstrap_servers}, target)
    seen = [source_of(message) for message in messages]
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} records delivered twice"
    assert set(seen) == expected
    assert_in_offset_order(messages)
    again = replay(
        stack.catalog, TOPIC, window_of(lower, upper), BoundedOrder(B), target,
        {"bootstrap.servers": stack.bootstrap_servers},
    )  # fmt: skip
    assert again.already_complete and again.records == 0
    assert "complete already" in again.summary()

    # The target topic holds the killed run's aborted sends and their committed re-sends; its archive holds
    # each record once, as a read_committed consumer reads it.
    config = RouterConfig.flat(
        topic=target, schema="playback", encoding="json", table=target, cluster="us-east-1",
        kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        checkpoint_location=str(tmp_path / "router"), catalog=stack.catalog,
    )  # fmt: skip
    archive_available_now(spark, config)
    table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{target}")
    archived_sources = [
        (int(headers["bergstream.source.partition"]), int(headers["bergstream.source.offset"]))
        for row in table.scan().to_arrow().to_pylist()
        for headers in [{h["key"]: h["value"] for h in row["__metadata__"]["headers"]}]
    ]
    assert len(archived_sources) == len(set(archived_sources)), "a replayed record archived twice"
    assert set(archived_sources) == expected

    # And an application bootstrapped over that archive writes what it writes reading the topic live.
    from bergstream.runtime.run import run_app
    from tests.jobs.identity_app import identity_settings

    window = {"start": lower, "max_misalignment": "15m"}
    bootstrap = identity_settings(stack, target, "us-east-1", tmp_path / "bootstrap", "rx_bootstrapped",
                                  mode="bootstrap", backfill=window)  # fmt: skip
    assert run_app(spark, bootstrap, available_now=True, show_progress=False).position.phase == "kafka"
    live = identity_settings(stack, target, "us-east-1", tmp_path / "live", "rx_live", mode="live")
    run_app(spark, live, available_now=True, show_progress=False)
    written = sorted(tuple(row) for row in spark.table("bergstream.apps.rx_bootstrapped").collect())
    assert written == sorted(tuple(row) for row in spark.table("bergstream.apps.rx_live").collect())
    assert len(written) == len(expected)


def set_max_message_bytes(bootstrap: str, topic: str, value: str) -> None:
    """Set the topic's max.message.bytes and wait until the broker reports it."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("max.message.bytes", value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while True:
        (described,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
        if described.result(30)["max.message.bytes"].value == value:
            return
        assert time.monotonic() < deadline, f"{topic}: max.message.bytes not {value} after 30s"


def test_a_replay_failed_on_a_kafka_error_or_interrupted_resumes_exactly_once(
    stack: Services, source: Source
) -> None:
    """Stopped by a record too large for the topic in epoch 2, run again once the topic takes it, stopped by
    SIGINT after epoch 2, run again: every record once."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from bergstream.backfill.errors import BackfillError

    lower, upper = source.start + timedelta(hours=1), source.start + timedelta(hours=2)
    target = "rx_failed"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(target, num_partitions=3, replication_factor=1)])[target].result(30)

    def shrink(report: Any) -> None:
        if report.epochs_done == 2:
            set_max_message_bytes(stack.bootstrap_servers, target, "200")

    window, client = window_of(lower, upper), {"bootstrap.servers": stack.bootstrap_servers}
    with pytest.raises(BackfillError) as failed:
        replay(stack.catalog, TOPIC, window, BoundedOrder(B), target, client, on_epoch=shrink)
    assert (
        f"replay of bergstream.archive.{TOPIC} into {target} stopped in epoch 2 " in str(failed.value)
        and "too large" in str(failed.value)
        and "Epochs 0 to 1 were delivered whole; the same command goes on from there" in str(failed.value)
    ), str(failed.value)
    set_max_message_bytes(stack.bootstrap_servers, target, "1048588")

    def interrupt(report: Any) -> None:
        if report.epochs_done == 3:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(
        BackfillError, match=r"stopped in epoch 3 .*: stopped by a signal\. .*Epochs 0 to 2 were"
    ):
        replay(stack.catalog, TOPIC, window, BoundedOrder(B), target, client, on_epoch=interrupt)
    report = replay(stack.catalog, TOPIC, window, BoundedOrder(B), target, client)
    assert report.resumed_at == (3, 0) and report.epochs_done == report.epochs == 4
    seen = [
        source_of(message)
        for message in read_committed({"bootstrap.servers": stack.bootstrap_servers}, target)
    ]
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} records delivered twice"
    assert set(seen) == archived(stack, lower, upper)


def test_a_dead_letter_also_archived_by_a_killed_redrive_goes_out_once(
    stack: Services, source: Source
) -> None:
    """A redrive killed between its archive append and its dead-letter MERGE leaves a record in both
    tables; the replay sends it once, as the archive has it."""
    lower, upper = source.start + timedelta(minutes=90), source.start + timedelta(hours=2)
    dlq = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{TOPIC}__dlq")
    dead = next(
        row["__metadata__"]
        for row in dlq.scan().to_arrow().to_pylist()
        if lower <= row["__metadata__"]["kafka_ingestion_ts"] < upper
    )
    redriven = archive_rows(stack, lower, upper)[0]
    place = {key: dead[key] for key in ("partition", "offset", "kafka_ingestion_ts")}
    redriven["__metadata__"] = {**redriven["__metadata__"], **place}
    append_to_archive(stack, [redriven])
    report = replay(
        stack.catalog, TOPIC, window_of(lower, upper), BoundedOrder(B), "rx_redriven",
        {"bootstrap.servers": stack.bootstrap_servers}, include_dead_letters=True,
    )  # fmt: skip
    messages = read_committed({"bootstrap.servers": stack.bootstrap_servers}, "rx_redriven")
    seen = [source_of(message) for message in messages]
    assert len(seen) == len(set(seen)) == report.records + report.dead_letters
    assert set(seen) == archived(stack, lower, upper, dead_letters=True)
    (copy,) = [message for message in messages if source_of(message) == (dead["partition"], dead["offset"])]
    assert "bergstream.dead-letter.reason" not in dict(copy.headers())
    # The strict reader merges rows of files written by the router and by another writer (string and
    # large_string columns): every archived row of the window, in ingestion-time order.
    strict = [batch for batch in read_batches(TOPIC, lower, upper, catalog=stack.catalog, strict=True)]
    times = [
        t for batch in strict for t in batch.column("__metadata__").field("kafka_ingestion_ts").to_pylist()
    ]
    assert len(times) == len(archive_rows(stack, lower, upper)) and times == sorted(times)


def test_a_header_without_a_value_is_replayed_without_one(stack: Services, source: Source) -> None:
    at = source.start + timedelta(minutes=100)
    replay(
        stack.catalog, TOPIC, window_of(at, at + timedelta(minutes=1)), BoundedOrder(B), "rx_headers",
        {"bootstrap.servers": stack.bootstrap_servers},
    )  # fmt: skip
    headers = [
        message.headers()
        for message in read_committed({"bootstrap.servers": stack.bootstrap_servers}, "rx_headers")
    ]
    nameless = [found for found in headers if ("kind", b"test") in found]
    assert len(nameless) == source.nameless
    assert all(("trace", None) in found for found in nameless), nameless


def test_a_strict_replay_sends_in_ingestion_time_then_partition_and_offset_order(
    stack: Services, source: Source
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from bergstream.backfill.read.order import StrictOrder

    target = "rx_strict"  # one partition: the order of sending, whole
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(target, num_partitions=1, replication_factor=1)])[target].result(30)
    lower, upper = source.start, source.start + timedelta(minutes=15)
    replay(
        stack.catalog, TOPIC, window_of(lower, upper), StrictOrder(), target,
        {"bootstrap.servers": stack.bootstrap_servers},
    )  # fmt: skip
    sent = [
        (message.timestamp()[1], *source_of(message))
        for message in read_committed({"bootstrap.servers": stack.bootstrap_servers}, target)
    ]
    assert sent == sorted(sent) and len(sent) == len(archived(stack, lower, upper))
    assert any(a[1:] > b[1:] for a, b in itertools.pairwise(sent)), "the window has offsets against time"


def test_a_replay_failed_reading_the_archive_resumes_exactly_once(stack: Services, source: Source) -> None:
    """The data files of the window gone from the warehouse after epoch 1 (as an object store refusing
    reads would leave it): the replay stops naming the epoch; with the files back, the same call goes on
    from epoch 2, and every record is delivered once."""
    from urllib.parse import urlparse

    from bergstream.backfill.errors import BackfillError

    lower, upper = source.start, source.start + timedelta(hours=1)
    target = "rx_unreadable"
    table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{TOPIC}")
    paths = sorted({Path(urlparse(task.file.file_path).path) for task in table.scan().plan_files()})
    moved: list[Path] = []

    def hide(report: Any) -> None:
        if report.epochs_done == 2:
            for path in paths:
                moved.append(path.rename(path.with_name(f"{path.name}.away")))

    window, client = window_of(lower, upper), {"bootstrap.servers": stack.bootstrap_servers}
    with pytest.raises(BackfillError) as failed:
        replay(stack.catalog, TOPIC, window, BoundedOrder(B), target, client, on_epoch=hide)
    assert moved, "the window's files were never hidden"
    assert (
        f"replay of bergstream.archive.{TOPIC} into {target} stopped in epoch 2 " in str(failed.value)
        and "reading the archive failed" in str(failed.value)
        and "Epochs 0 to 1 were delivered whole; the same command goes on from there" in str(failed.value)
    ), str(failed.value)
    for path in moved:
        path.rename(path.with_name(path.name.removesuffix(".away")))
    report = replay(stack.catalog, TOPIC, window, BoundedOrder(B), target, client)
    assert report.resumed_at == (2, 0) and report.epochs_done == report.epochs == 4
    seen = [
        source_of(message)
        for message in read_committed({"bootstrap.servers": stack.bootstrap_servers}, target)
    ]
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} records delivered twice"
    assert set(seen) == archived(stack, lower, upper)
