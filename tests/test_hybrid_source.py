"""bergstream-hybrid on real Kafka, Spark and Iceberg: a topic archived by the router, then read in one query
from the archive, epoch by epoch, and from Kafka on from the hand-over offsets the router recorded in the
archive snapshot the plan pins.

The topic has three partitions when archived: 0 and 1 hold events, 2 only malformed records (dead letters,
so no archived row, yet a recorded position). A fourth partition is added afterwards, which the hand-over
lacks. Every (partition, offset) read must come exactly once: from the archive while inside the window, from
Kafka from the hand-over on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from bergstream.backfill.read.order import BoundedOrder, Window
from bergstream.backfill.read.planner import plan, to_micros
from bergstream.kafka_topics import ensure_topic
from bergstream.loadgen.events import EventModel
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.router.recorded_positions import newest_recorded
from bergstream.schemas.event_schema import load_event_schema
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

pytestmark = pytest.mark.integration
HYBRID = "bergstream-hybrid"
CLUSTER = "us-east-1"
SOURCE = "playback"
B = timedelta(minutes=15)


@dataclass(frozen=True)
class Archived:
    topic: str
    plan: Path
    snapshot_id: int
    handover: dict[int, int]  # partition -> next offset, as the router recorded it
    epochs: list[tuple[int, int]]  # [lower, upper) in microseconds
    window_rows: dict[tuple[int, int], int]  # (partition, offset) -> ingestion time: the archive rows read


@dataclass(frozen=True)
class Seen:
    batch: int
    archived: bool  # from __archive__, else from Kafka's columns
    partition: int
    offset: int
    ts: int  # microseconds


def send(
    stack: Services,
    topic: str,
    counts: dict[int, int],
    start: datetime | None = None,
    span: timedelta | None = None,
    seed: int = 0,
) -> None:
    """counts[p] playback events to partition p, stamped evenly over [start, start + span), else now."""
    schema = load_event_schema("playback")
    clock = [start or datetime.now(UTC)]
    events = EventModel(seed=seed, clock=lambda: clock[0]).events("playback")
    with _producer(stack) as (producer, failures):
        for partition, count in counts.items():
            for index in range(count):
                if start is not None and span is not None:
                    clock[0] = start + span * (index / count)
                generated = next(events)
                timestamp = int(clock[0].timestamp() * 1000) if start is not None else 0
                producer.produce(topic, value=schema.encode(generated.event, "json"), key=generated.key,
                                 partition=partition, timestamp=timestamp, on_delivery=failures)  # fmt: skip


def send_malformed(stack: Services, topic: str, partition: int, count: int, at: datetime) -> None:
    with _producer(stack) as (producer, failures):
        for _ in range(count):
            producer.produce(topic, value=b"{not json", partition=partition,
                             timestamp=int(at.timestamp() * 1000), on_delivery=failures)  # fmt: skip


class _Failures:
    def __init__(self) -> None:
        self.errors: list[KafkaError] = []

    def __call__(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self.errors.append(error)


@contextmanager
def _producer(stack: Services) -> Iterator[tuple[Producer, _Failures]]:
    """A producer whose every record is delivered when the block ends, and which is closed then."""
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers, "enable.idempotence": True})
    failures = _Failures()
    try:
        yield producer, failures
        assert producer.flush(30) == 0 and not failures.errors, failures.errors
    finally:
        producer.close()


def kafka_ends(stack: Services, topic: str) -> dict[int, int]:
    """The next offset of every partition of `topic`."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": "hybrid-test-ends"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions
        }
    finally:
        consumer.close()


def archive(stack: Services, spark: SparkSession, topic: str, checkpoint: Path) -> None:
    config = RouterConfig.flat(
        {
            "topic": topic, "schema": "playback", "encoding": "json", "table": topic, "cluster": CLUSTER,
            "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
            "checkpoint_location": str(checkpoint), "catalog": stack.catalog,
        }
    )  # fmt: skip
    archive_available_now(spark, config)


def hybrid_plan(
    stack: Services, spark: SparkSession, topic: str, start: datetime, path: Path
) -> tuple[Archived, dict[str, Any]]:
    """The plan of `topic`'s archive from `start` up to where the router's newest commit ended, with the
    positions that commit recorded as the hand-over, as bergstream pins them: one snapshot for both."""
    identifier = stack.catalog.table_identifier(topic)
    recorded = newest_recorded(spark, identifier, topic, CLUSTER)
    assert recorded is not None, "the router records its positions in its snapshots"
    table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{topic}")
    scan = table.scan(snapshot_id=recorded.snapshot_id, selected_fields=("__metadata__",))
    archived = {
        (m["partition"], m["offset"]): to_micros(m["kafka_ingestion_ts"])
        for m in scan.to_arrow().column("__metadata__").to_pylist()
    }
    window = Window(to_micros(start), max(archived.values()) + 1)
    made = plan(
        stack.catalog, [identifier], window, BoundedOrder(B), [CLUSTER], {identifier: recorded.snapshot_id}
    )
    source_plan = made.source_plan(identifier, SOURCE)
    source_plan["handover"] = {
        "topic": topic, "cluster": CLUSTER, "snapshot_id": recorded.snapshot_id,
        "offsets": {str(p): offset for p, offset in sorted(recorded.range.end.items())},
    }  # fmt: skip
    path.write_text(json.dumps(source_plan))
    return Archived(
        topic=topic,
        plan=path,
        snapshot_id=recorded.snapshot_id,
        handover=dict(recorded.range.end),
        epochs=[(lower, upper) for lower, upper in source_plan["epochs"]],
        window_rows={key: ts for key, ts in archived.items() if window.start <= ts < window.end},
    ), source_plan


@pytest.fixture(scope="module")
def archived(stack: Services, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Archived:
    directory = tmp_path_factory.mktemp("hybrid")
    topic = "hy_playback"
    ensure_topic({"bootstrap.servers": stack.bootstrap_servers}, topic, 3)
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    send(stack, topic, {0: 120, 1: 120}, start, timedelta(hours=1), seed=1)
    send_malformed(stack, topic, 2, 5, start + timedelta(minutes=30))
    archive(stack, spark, topic, directory / "router")
    found, _ = hybrid_plan(stack, spark, topic, start + timedelta(minutes=10), directory / "plan.json")
    assert found.handover == {0: 120, 1: 120, 2: 5}, "partition 2: dead letters only, a position recorded"
    assert len(found.epochs) == 4, "[:10, :15), [:15, :30), [:30, :45), [:45, the newest row]"
    assert 0 < len(found.window_rows) < 240, "rows archived before the window are not read"
    # Kafka moves on: partitions 0-2 beyond the hand-over, and partition 3, added since, from its start.
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})  # alive until its futures are done
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    send(stack, topic, {0: 10, 1: 10, 2: 10, 3: 10}, seed=2)
    return found


def kafka_options(stack: Services) -> dict[str, str]:
    return {"kafka.bootstrap.servers": stack.bootstrap_servers, "failOnDataLoss": "true"}


def read(
    stack: Services,
    spark: SparkSession,
    plan_path: Path,
    checkpoint: Path,
    attempts: list[tuple[int, list[Seen]]],
    fail_at: int | None = None,
    **options: str,
) -> StreamingQuery:
    """Run the hybrid source with an availableNow trigger to its end, every batch's rows appended to
    `attempts`; with `fail_at`, the query fails in that batch after its rows are seen (its offsets logged,
    never committed)."""
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import functions as F

    frame = (
        spark.readStream.format(HYBRID).option("plan", str(plan_path))
        .options(**kafka_options(stack), **options).load()
    )  # fmt: skip
    metadata = "__archive__.__metadata__"
    rows = frame.select(
        F.col("__archive__").isNotNull().alias("archived"),
        F.coalesce(F.col(f"{metadata}.partition").cast("int"), F.col("partition")).alias("partition"),
        F.coalesce(F.col(f"{metadata}.offset").cast("long"), F.col("offset")).alias("offset"),
        F.unix_micros(F.coalesce(F.col(f"{metadata}.kafka_ingestion_ts"), F.col("timestamp"))).alias("ts"),
        F.col("topic"),
    )

    def keep(batch: Any, batch_id: int) -> None:
        seen = []
        for row in batch.collect():
            assert (row.topic is None) == row.archived, "Kafka's columns are null in an archive row"
            seen.append(Seen(batch_id, row.archived, row.partition, row.offset, row.ts))
        attempts.append((batch_id, seen))
        if batch_id == fail_at:
            raise RuntimeError(f"the sink fails in batch {batch_id}")

    query = (
        rows.writeStream.foreachBatch(keep).trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint)).start()
    )  # fmt: skip
    if fail_at is None:
        assert query.awaitTermination(180), "an availableNow query stops once Kafka is caught up"
        assert query.exception() is None
    else:
        with pytest.raises(StreamingQueryException, match=f"the sink fails in batch {fail_at}"):
            query.awaitTermination(180)
    return query


def failure_of(
    spark: SparkSession,
    plan_path: Path,
    checkpoint: Path,
    options: dict[str, str],
    on_batch: Callable[[Any, int], None],
) -> str:
    """The error of the hybrid source's query, run with an availableNow trigger until it fails."""
    from pyspark.errors import StreamingQueryException

    query = (
        spark.readStream.format(HYBRID).option("plan", str(plan_path)).options(**options)
        .load().writeStream.foreachBatch(on_batch).trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint)).start()
    )  # fmt: skip
    with pytest.raises(StreamingQueryException) as failed:
        query.awaitTermination(120)
    return str(failed.value)


def kafka_expected(archived: Archived, ends: dict[int, int]) -> set[tuple[int, int]]:
    """Kafka's offsets from the hand-over on; a partition the hand-over lacks from its start (0)."""
    return {(p, offset) for p, end in ends.items() for offset in range(archived.handover.get(p, 0), end)}


def progress_of(query: StreamingQuery) -> dict[int, dict[str, Any]]:
    """Each batch's progress of this source (description, startOffset, endOffset, metrics), from the
    progress's own JSON: PySpark's recentProgress gives offsets as Python's text of a dict, not JSON."""
    events = [json.loads(progress.json) for progress in query.recentProgress]
    return {event["batchId"]: event["sources"][0] for event in events}


def assert_once(
    archived: Archived, batches: dict[int, list[Seen]], ends: dict[int, int]
) -> tuple[list[Seen], list[Seen]]:
    """Every row of the window and every Kafka offset from the hand-over, exactly once; epoch i in batch i."""
    rows = [row for batch in sorted(batches) for row in batches[batch]]
    from_archive = [row for row in rows if row.archived]
    from_kafka = [row for row in rows if not row.archived]
    archive_keys = [(row.partition, row.offset) for row in from_archive]
    assert len(archive_keys) == len(set(archive_keys)), "an archive row read twice"
    assert set(archive_keys) == set(archived.window_rows), "the archive phase reads the window's rows"
    for row in from_archive:
        lower, upper = archived.epochs[row.batch]
        assert lower <= row.ts < upper, f"batch {row.batch} is epoch {row.batch}"
    kafka_keys = [(row.partition, row.offset) for row in from_kafka]
    assert len(kafka_keys) == len(set(kafka_keys)), "a Kafka record read twice"
    assert set(kafka_keys) == kafka_expected(archived, ends)
    assert all(row.batch >= len(archived.epochs) for row in from_kafka), "Kafka only after the last epoch"
    return from_archive, from_kafka


def test_reads_the_window_epoch_by_epoch_then_kafka_from_the_hand_over_each_offset_once(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path
) -> None:
    attempts: list[tuple[int, list[Seen]]] = []
    query = read(stack, spark, archived.plan, tmp_path / "query", attempts)
    ends = kafka_ends(stack, archived.topic)
    batches = dict(attempts)
    switch = len(archived.epochs)
    assert sorted(batches) == list(range(switch + 1)), "one batch per epoch, then one switch batch to Kafka"
    _, from_kafka = assert_once(archived, batches, ends)
    first = {p: min(row.offset for row in from_kafka if row.partition == p) for p in ends}
    assert first == {0: 120, 1: 120, 2: 5, 3: 0}, (
        "Kafka from the recorded hand-over, partition 2 (no archived row) too; partition 3 from its start"
    )

    progress = progress_of(query)
    for batch in range(switch):
        source = progress[batch]
        assert source["description"].startswith(f"bergstream-hybrid[{SOURCE}: archive epoch {batch + 1}/4 ")
        assert source["endOffset"]["phase"] == "archive" and source["endOffset"]["epoch"] == batch + 1
        assert source["metrics"]["phase"] == "archive" and source["metrics"]["epoch"] == str(batch + 1)
    switched = progress[switch]
    assert switched["startOffset"] == {
        "phase": "archive", "epoch": switch, "epochs": switch,
        "watermark": switched["startOffset"]["watermark"],
    }  # fmt: skip
    assert switched["endOffset"] == {
        "phase": "kafka",
        "epochs": switch,
        "kafka": {archived.topic: {str(p): end for p, end in ends.items()}},
    }
    kafka_phase = f"kafka {archived.topic} from hand-over (snapshot {archived.snapshot_id})"
    assert switched["description"] == f"bergstream-hybrid[{SOURCE}: {kafka_phase}]"
    metrics = switched["metrics"]
    assert metrics["phase"] == "kafka" and metrics["epoch"] == metrics["epochs"] == str(switch)
    assert json.loads(metrics["handover"]) == {archived.topic: {"0": 120, "1": 120, "2": 5}}
    assert metrics["snapshot"] == str(archived.snapshot_id)
    assert metrics["table"] == stack.catalog.table_identifier(archived.topic)
    assert metrics["maxOffsetsBehindLatest"] == "0", "Kafka's own metrics, caught up"
    assert not (tmp_path / "query" / "sources" / "0" / "kafka").exists(), "Kafka's stream writes nothing"


def test_restarts_in_the_archive_phase_at_the_switch_and_in_kafka_read_each_offset_once(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "query"
    switch = len(archived.epochs)
    attempts: list[tuple[int, list[Seen]]] = []

    def runs(batch: int) -> list[set[Seen]]:
        return [set(rows) for batch_id, rows in attempts if batch_id == batch]

    # An archive batch fails: its offsets are logged, not committed; the restart replays it.
    read(stack, spark, archived.plan, checkpoint, attempts, fail_at=2)
    # The switch batch fails the same way.
    read(stack, spark, archived.plan, checkpoint, attempts, fail_at=switch)
    send(stack, archived.topic, {0: 5, 1: 5, 2: 5, 3: 5}, seed=3)
    replayed = read(stack, spark, archived.plan, checkpoint, attempts)
    assert len(runs(2)) == 2 and runs(2)[0] == runs(2)[1], "the archive batch replayed as it was"
    assert len(runs(switch)) == 2 and runs(switch)[0] == runs(switch)[1], (
        "the switch batch replayed as it was"
    )
    assert switch + 1 in dict(attempts), "the records sent since the switch follow it"
    replay = progress_of(replayed)[switch]
    assert replay["endOffset"]["phase"] == "kafka" and replay["metrics"]["phase"] == "kafka"
    assert "maxOffsetsBehindLatest" not in replay["metrics"], "Kafka's metrics left out of a replayed batch"

    # A restart in the Kafka phase: Kafka's own read limit paces it.
    send(stack, archived.topic, {0: 6, 1: 6, 2: 6, 3: 6}, seed=4)
    before = len(attempts)
    paced = read(stack, spark, archived.plan, checkpoint, attempts, maxOffsetsPerTrigger="10")
    kafka_batches = attempts[before:]
    assert len(kafka_batches) >= 3 and all(len(rows) <= 10 for _, rows in kafka_batches)
    assert sum(len(rows) for _, rows in kafka_batches) == 24, "only what was sent since the last run"
    assert all(p["startOffset"]["phase"] == "kafka" for p in progress_of(paced).values())

    ends = kafka_ends(stack, archived.topic)
    assert_once(archived, dict(attempts), ends)  # the last attempt of every batch: what a sink keeps


def test_an_expired_hand_over_is_refused_at_the_switch_and_at_start_naming_the_offsets(
    stack: Services, spark: SparkSession, tmp_path: Path
) -> None:
    from py4j.protocol import Py4JJavaError

    topic = "hy_expiring"
    ensure_topic({"bootstrap.servers": stack.bootstrap_servers}, topic, 1)
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    send(stack, topic, {0: 3}, start, timedelta(minutes=30), seed=5)
    archive(stack, spark, topic, tmp_path / "router")
    found, _ = hybrid_plan(stack, spark, topic, start, tmp_path / "plan.json")
    assert found.handover == {0: 3}
    send(stack, topic, {0: 5}, seed=6)

    def refused(when: str) -> str:
        return (
            f"{topic}: {when}: Kafka no longer holds the hand-over offset: topic {topic} partition 0, "
            "hand-over offset 3, earliest offset 5, next offset 8"
        )

    def run(checkpoint: Path, on_batch: Callable[[Any, int], None]) -> str:
        return failure_of(spark, found.plan, checkpoint, kafka_options(stack), on_batch)

    # Retention deletes the records past the hand-over while the archive phase runs (in its last epoch).
    last_epoch = len(found.epochs) - 1

    def expire_in_last_epoch(_batch: Any, batch_id: int) -> None:
        if batch_id == last_epoch:  # an admin client of its own: the query keeps this function after the test
            admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
            admin.delete_records([TopicPartition(topic, 0, 5)])[TopicPartition(topic, 0, 5)].result(30)

    assert refused("at the switch") in run(tmp_path / "expiring", expire_in_last_epoch)
    assert (tmp_path / "expiring" / "commits" / str(last_epoch)).exists(), "refused at the switch, not before"

    check: Callable[..., None] = spark._jvm.io.bergstream.backfill.Handover.check  # type: ignore[union-attr]
    with pytest.raises(Py4JJavaError) as checked:
        check(kafka_options(stack), topic, '{"0": 3}', "at start")
    assert f"java.lang.IllegalStateException: {refused('at start')}" in str(checked.value)
    with pytest.raises(Py4JJavaError, match="the topic has no partition 1"):
        check(kafka_options(stack), topic, '{"0": 5, "1": 0}', "at start")
    check(kafka_options(stack), topic, json.dumps({topic: {"0": 5}}), "at start")  # held: no error

    assert refused("at start") in run(tmp_path / "expired", lambda _batch, _batch_id: None)
    assert not (tmp_path / "expired" / "commits" / "0").exists(), "refused before any batch"


def test_a_replayed_switch_batch_whose_hand_over_range_expired_fails_naming_it(
    stack: Services, spark: SparkSession, tmp_path: Path
) -> None:
    """The switch micro-batch logged, not committed, then the hand-over's first offsets deleted by retention:
    Spark replays the batch from its offset log without asking for a latest offset, and with failOnDataLoss
    false (bergstream's default for a live source) would skip them. The replay is refused, naming them."""

    topic = "hy_replayed_switch"
    ensure_topic({"bootstrap.servers": stack.bootstrap_servers}, topic, 1)
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    send(stack, topic, {0: 3}, start, timedelta(minutes=30), seed=7)
    archive(stack, spark, topic, tmp_path / "router")
    found, _ = hybrid_plan(stack, spark, topic, start, tmp_path / "plan.json")
    assert found.handover == {0: 3}
    send(stack, topic, {0: 5}, seed=8)
    switch = len(found.epochs)
    checkpoint = tmp_path / "query"

    options = {"kafka.bootstrap.servers": stack.bootstrap_servers, "failOnDataLoss": "false"}

    def run(fail_at: int | None) -> str:
        def on_batch(_batch: Any, batch_id: int) -> None:
            if batch_id == fail_at:
                raise RuntimeError(f"the sink fails in batch {batch_id}")

        return failure_of(spark, found.plan, checkpoint, options, on_batch)

    assert f"the sink fails in batch {switch}" in run(fail_at=switch)
    assert (checkpoint / "offsets" / str(switch)).exists() and not (
        checkpoint / "commits" / str(switch)
    ).exists()
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.delete_records([TopicPartition(topic, 0, 5)])[TopicPartition(topic, 0, 5)].result(30)
    assert (
        f"{topic}: reading the switch micro-batch: Kafka no longer holds the hand-over offset: topic {topic} "
        "partition 0, hand-over offset 3, earliest offset 5, next offset 8"
    ) in run(fail_at=None)
    assert not (checkpoint / "commits" / str(switch)).exists(), "nothing of the switch batch committed"


def test_options_that_would_read_elsewhere_and_plans_without_a_hand_over_are_refused(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path
) -> None:
    def load(plan_path: Path, source: str = HYBRID, **options: str) -> Any:
        return spark.readStream.format(source).option("plan", str(plan_path)).options(**options).load()

    frame = load(archived.plan, **kafka_options(stack))
    assert frame.columns == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers", "__archive__"
    ]  # fmt: skip
    assert "__metadata__" in frame.schema["__archive__"].dataType.fieldNames()
    for option, value in (
        ("startingOffsets", "earliest"),
        ("subscribePattern", "hy_.*"),
        ("assign", json.dumps({archived.topic: [0]})),
        ("subscribe", "another_topic"),
    ):
        with pytest.raises(Exception, match=f"sets subscribe, includeHeaders and startingOffsets itself, and "
                                            f"cannot take option {option}="):  # fmt: skip
            load(archived.plan, **kafka_options(stack), **{option: value})
    load(archived.plan, **kafka_options(stack), subscribe=archived.topic)  # the hand-over's own topic

    without = json.loads(archived.plan.read_text())
    del without["handover"]
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(without))
    with pytest.raises(Exception, match="has no 'handover'"):
        load(plain, **kafka_options(stack))
    backfill = load(plain, "bergstream-backfill")
    assert "__metadata__" in backfill.columns, "the same plan without a hand-over is bergstream-backfill's"
