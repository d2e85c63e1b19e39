"""`app run --from`: an application bootstrapped from the archive, then Kafka from where the archive ends, in
one query. Proof by equality: for both yardstick applications, the bootstrap and a plain live run over the
same records from Kafka (which still holds them all) write the same output."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from bergstream.backfill.errors import BackfillConfigError
from bergstream.backfill.read.planner import to_micros
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.runtime.run import run_app
from bergstream.runtime.run_report import RunReport
from bergstream.runtime.settings import AppSettings
from tests.commands import run_whole
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration
KINDS = {"impression": ("avro", 4000), "playback": ("json", 2000)}
# Within the applications' slack: events up to 30 minutes late, a watermark delay of an hour, B = 15m.
JITTER = timedelta(minutes=10)
# Each topic of its own region, as in a deployment with a Kafka cluster per region: a hand-over reads each
# source's rows of its own region from the archive, then its own cluster.
CLUSTERS = {"impression": "eu-west-1", "playback": "us-east-1"}


@dataclass(frozen=True)
class Topics:
    start: datetime
    names: dict[str, str]  # kind -> topic and table
    routers: dict[str, RouterConfig]  # kind -> the router that archived it, to archive more with


@pytest.fixture(scope="module")
def topics(stack: Services, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Topics:
    """Two hours archived, then half an hour more in Kafka alone, on a partition added after the archive
    too (the hand-over has no position for it). Kafka timestamps go back by up to JITTER inside partitions,
    never before the start: many records sit exactly at it, where the bootstrap starts."""
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    directory = tmp_path_factory.mktemp("bootstrap")
    names, routers = {}, {}
    for kind, (encoding, count) in KINDS.items():
        topic = f"boot_{kind}"
        archived = ProduceRequest(topic=topic, schema=kind, count=count, encoding=encoding, partitions=3,
                                  seed=7, late_fraction=0.05, bad_fraction=0.02, ingestion_start=start,
                                  ingestion_span=timedelta(hours=2), timestamp_jitter=JITTER)  # fmt: skip
        produce(archived, stack.bootstrap_servers, show_progress=False)
        config = RouterConfig.flat(
            topic=topic, schema=kind, encoding=encoding, table=topic, cluster=CLUSTERS[kind],
            kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
            checkpoint_location=str(directory / topic), catalog=stack.catalog,
        )  # fmt: skip
        archive_available_now(spark, config)
        backwards, at_start = archived_times(spark, stack.catalog.table_identifier(topic), start)
        assert backwards > count // 10 and at_start > 0
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
        later = ProduceRequest(topic=topic, schema=kind, count=count // 4, encoding=encoding, partitions=4,
                               seed=8, late_fraction=0.05, bad_fraction=0.02,
                               ingestion_start=start + timedelta(hours=2),
                               ingestion_span=timedelta(minutes=30), timestamp_jitter=JITTER)  # fmt: skip
        produce(later, stack.bootstrap_servers, show_progress=False)
        names[kind] = topic
        routers[kind] = config
    return Topics(start, names, routers)


def archived_times(spark: SparkSession, table: str, start: datetime) -> tuple[int, int]:
    """Of the archived records, how many have a Kafka timestamp earlier than that of the offset before them,
    and how many sit exactly at `start`."""
    row = spark.sql(
        f"""
        SELECT count_if(ts < previous) AS backwards,
               count_if(unix_micros(ts) = {to_micros(start)}) AS at_start
        FROM (
          SELECT __metadata__.kafka_ingestion_ts AS ts, lag(__metadata__.kafka_ingestion_ts)
            OVER (PARTITION BY __metadata__.partition ORDER BY __metadata__.offset) AS previous
          FROM {table})
        """
    ).first()
    assert row is not None
    return int(row.backwards), int(row.at_start)


def settings(
    stack: Services, topics: Topics, app: str, checkpoint: Path, output: str, **mode: Any
) -> AppSettings:
    kinds = {"sessionizer": ["playback"], "attribution": ["impression", "playback"]}
    return AppSettings.model_validate(
        {
            "app": app,
            "entry": f"bergstream.apps.{app}:{app}",
            "sources": {
                kind: {"topic": topics.names[kind], "table": topics.names[kind], "schema": kind,
                       "encoding": KINDS[kind][0], "cluster": CLUSTERS[kind]}
                for kind in kinds[app]
            },
            "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
            "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
            "checkpoint_location": str(checkpoint),
            "output_table": output,
            "max_offsets_per_trigger": 1500,
            "spark": {"master": "local[2]"},
            **mode,
        }
    )  # fmt: skip


def output_rows(spark: SparkSession, table: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(row) for row in spark.table(f"bergstream.apps.{table}").collect())


@pytest.mark.parametrize("app", ["sessionizer", "attribution"])
def test_a_bootstrap_from_the_archive_writes_what_a_live_run_writes(
    stack: Services, spark: SparkSession, topics: Topics, tmp_path: Path, app: str
) -> None:
    live = settings(stack, topics, app, tmp_path / "live", f"{app}_plain", mode="live")
    run_app(spark, live, available_now=True, show_progress=False)
    bootstrap = settings(stack, topics, app, tmp_path / "bootstrap", f"{app}_bootstrapped", mode="bootstrap",
                         backfill={"start": topics.start, "max_misalignment": "15m"})  # fmt: skip
    report = run_app(spark, bootstrap, available_now=True, show_progress=False)
    assert report.position.phase == "kafka", "the query went over to Kafka"
    assert report.position.epoch >= 8, "the archive phase read the two hours in epochs of 15 minutes"
    rows = output_rows(spark, f"{app}_plain")
    assert len(rows) > 10
    assert output_rows(spark, f"{app}_bootstrapped") == rows


def test_a_bootstrap_restarts_in_its_kafka_phase_once_its_snapshot_has_expired(
    stack: Services, spark: SparkSession, topics: Topics, tmp_path: Path
) -> None:
    """Switched to Kafka, a bootstrap no longer holds its snapshot, and maintenance expires it; the same
    command, run again on its checkpoint, reads on from Kafka alone, to what a plain live run writes."""
    backfill = {"start": topics.start, "max_misalignment": "15m"}
    bootstrap = settings(stack, topics, "sessionizer", tmp_path / "bootstrap", "expired_bootstrap",
                         mode="bootstrap", backfill=backfill)  # fmt: skip
    first = run_app(spark, bootstrap, available_now=True, show_progress=False)
    assert first.position.phase == "kafka"
    pinned = first.handovers["playback"].snapshot_id
    topic = topics.names["playback"]
    more = ProduceRequest(topic=topic, schema="playback", count=700, partitions=4, seed=10,
                          late_fraction=0.05, bad_fraction=0.02,
                          ingestion_start=topics.start + timedelta(hours=2, minutes=30),
                          ingestion_span=timedelta(minutes=20), timestamp_jitter=JITTER)  # fmt: skip
    produce(more, stack.bootstrap_servers, show_progress=False)
    # The router archives them, and expiry takes every snapshot but the newest: the pinned one with them.
    archive_available_now(spark, topics.routers["playback"])
    identifier = stack.catalog.table_identifier(topic)
    spark.sql(
        f"CALL {stack.catalog.name}.system.expire_snapshots(table => '{identifier}', "
        f"older_than => TIMESTAMP '{datetime.now(UTC) + timedelta(minutes=1):%Y-%m-%d %H:%M:%S}+00:00', "
        "retain_last => 1)"
    ).collect()
    table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{topic}")
    assert table.snapshot_by_id(pinned) is None, "the pinned snapshot expired"

    resumed = run_app(spark, bootstrap, available_now=True, show_progress=False)
    assert resumed.position.phase == "kafka"
    assert resumed.position.rows == {"playback": more.count}, "only the new records, from Kafka"
    plain = settings(stack, topics, "sessionizer", tmp_path / "plain", "expired_plain", mode="live")
    run_app(spark, plain, available_now=True, show_progress=False)
    assert output_rows(spark, "expired_bootstrap") == output_rows(spark, "expired_plain")


def _logged(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.glob("[0-9]*")) if folder.is_dir() else []


def _in_kafka(checkpoint: Path, batch: int) -> bool:
    """Whether micro-batch `batch` of the offset log ends in the Kafka phase."""
    return '"phase":"kafka"' in (checkpoint / "offsets" / str(batch)).read_text()


def _switch_logged(checkpoint: Path) -> bool:
    logged = _logged(checkpoint / "offsets")
    return bool(logged) and _in_kafka(checkpoint, logged[-1])


def _kafka_batch_committed(checkpoint: Path) -> bool:
    """Whether a micro-batch that started in the Kafka phase, after the switch, is committed."""
    return any(_in_kafka(checkpoint, batch - 1) for batch in _logged(checkpoint / "commits") if batch > 0)


def test_a_bootstrap_killed_in_the_archive_phase_at_the_switch_and_after_it_resumes_to_the_same_output(
    stack: Services, spark: SparkSession, topics: Topics, tmp_path: Path
) -> None:
    """`app run --from` killed with SIGKILL (driver and JVM) while it reads the archive, as more records
    arrive in Kafka; again once its switch to Kafka is in the offset log; again once it has committed a
    micro-batch of Kafka alone. The same command then finishes with what a plain live run over every record
    writes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    app = settings(stack, topics, "sessionizer", tmp_path / "unused", "killed_bootstrap", mode="live")
    config = tmp_path / "sessionizer.yaml"
    config.write_text(yaml.safe_dump(app.model_dump(mode="json", by_alias=True, exclude={"backfill"})))
    checkpoint = tmp_path / "checkpoint"
    command = [
        sys.executable, "-m", "bergstream", "app", "run", "--app", "sessionizer", "--config", str(config),
        "--from", topics.start.isoformat(), "--max-misalignment", "15m", "--checkpoint", str(checkpoint),
        "--available-now", "--json",
    ]  # fmt: skip
    # Beyond the hand-over, with the half hour already in Kafka: three Kafka micro-batches of at most 1,500.
    arriving = ProduceRequest(topic=topics.names["playback"], schema="playback", count=3500, partitions=4,
                              seed=9, late_fraction=0.05, bad_fraction=0.02,
                              ingestion_start=topics.start + timedelta(hours=2, minutes=30),
                              ingestion_span=timedelta(minutes=30), timestamp_jitter=JITTER)  # fmt: skip

    def arrive() -> None:
        produce(arriving, stack.bootstrap_servers, show_progress=False)
        assert not _switch_logged(checkpoint), "the records arrived once the archive phase was over"

    root = Path(__file__).parent.parent
    for killed_once, reached, then in (
        ("archive phase", lambda: len(_logged(checkpoint / "commits")) >= 1, arrive),
        ("switch", lambda: _switch_logged(checkpoint), None),
        ("Kafka phase", lambda: _kafka_batch_committed(checkpoint), None),
    ):
        log = tmp_path / f"killed in the {killed_once}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(command, cwd=root, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 300
        while not reached():
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"the bootstrap did not reach its {killed_once} in 300s"
            time.sleep(0.05)
        if then is not None:
            then()
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    resumed = run_whole(spark, command)  # the same command, run to its end on the tests' session
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    plain = settings(stack, topics, "sessionizer", tmp_path / "plain", "killed_plain", mode="live")
    run_app(spark, plain, available_now=True, show_progress=False)
    assert output_rows(spark, "killed_bootstrap") == output_rows(spark, "killed_plain")


def test_a_bootstrap_and_a_backfill_plan_made_while_the_router_leaves_records_unread_equal_those_made_after(
    stack: Services, spark: SparkSession, topics: Topics, tmp_path: Path
) -> None:
    """A router on an hour's target lag meets the newest records, records their range unread beside its
    checkpoint from where the table ends, reads and commits nothing, and is killed. A bootstrap made then
    hands over to Kafka where the table ends and reads the unread records from Kafka; a backfill plan of the
    archived hours reads what it read before, and a backfill of the hour the unread records are in reads the
    rows the table holds, its report saying the archive it read ends where the table ends. After a drain reads
    and commits the unread range, the same bootstrap hands over further on and writes the same output, the
    same plan reads the same files, and the same backfill reads the committed records too, its report saying
    the archive ends past them."""
    from pyspark.sql import functions as F

    from bergstream.backfill.read.handover import pin_handover
    from bergstream.backfill.read.order import BoundedOrder, Window
    from bergstream.backfill.read.planner import plan, table_ref
    from bergstream.schemas.batch_range import BatchRange
    from tests.routers import eventually, start_router, unread_record, write_config
    from tests.test_unread_ranges import killed

    topic = topics.names["playback"]
    ref = table_ref(topic, stack.catalog)
    more = ProduceRequest(topic=topic, schema="playback", count=800, partitions=4, seed=11,
                          late_fraction=0.05, bad_fraction=0.02,
                          ingestion_start=topics.start + timedelta(hours=2, minutes=40),
                          ingestion_span=timedelta(minutes=10), timestamp_jitter=JITTER)  # fmt: skip
    produce(more, stack.bootstrap_servers, show_progress=False)
    before = pin_handover(stack.catalog, ref, topic, CLUSTERS["playback"])
    last_hour = {"start": topics.start + timedelta(hours=2), "end": topics.start + timedelta(hours=3),
                 "max_misalignment": "15m"}  # fmt: skip

    def backfill_last_hour(name: str) -> RunReport:
        app = settings(stack, topics, "sessionizer", tmp_path / name, name, mode="backfill",
                       backfill=last_hour)  # fmt: skip
        report = run_app(spark, app, available_now=True, show_progress=False)
        assert report.complete and report.rows_read == report.rows_in_archive, report.problems
        return report

    def past(offsets: dict[int, int]) -> int:
        """The rows of the table at or past `offsets`."""
        table = stack.catalog.load().load_table(ref.pyiceberg_identifier)
        metadata = table.scan(selected_fields=("__metadata__",)).to_arrow().column("__metadata__").to_pylist()
        return sum(1 for m in metadata if m["offset"] >= offsets.get(m["partition"], 0))

    ingested = F.col("__metadata__.kafka_ingestion_ts")
    held = (
        spark.table(ref.identifier)
        .where((ingested >= F.lit(last_hour["start"])) & (ingested < F.lit(last_hour["end"])))
        .count()
    )
    # A checkpoint of its own: the router starts where the table ends.
    config = write_config(stack, tmp_path, topic, cluster=CLUSTERS["playback"], target_lag="1h")
    checkpoint = tmp_path / "checkpoints" / topic
    router = start_router(topic, config, tmp_path / "router.log")
    try:
        eventually(lambda: topic in unread_record(checkpoint), "the newest records' range recorded unread",
                   timeout=240)  # fmt: skip
    finally:
        killed(router)
    # Unread from where the archive ends, exactly.
    start = {int(p): o for p, o in unread_record(checkpoint)[topic]["start"].items()}
    assert {p: start.get(p) for p in before.offsets} == before.offsets, (start, before.offsets)
    # Made while the range is unread: the rows the table holds, and a hand-over where it ends.
    during = backfill_last_hour("unread_backfill")
    assert during.rows_read == {"playback": held}, "unread records read as archived"
    assert during.handovers["playback"].offsets == before.offsets
    pending = pin_handover(stack.catalog, ref, topic, CLUSTERS["playback"])
    assert pending == before, "the router committed nothing: its range is unread"

    window = Window(to_micros(topics.start), to_micros(topics.start + timedelta(hours=2)))
    archived_hours = plan(stack.catalog, [topic], window, BoundedOrder(timedelta(minutes=15)))
    backfill = {"start": topics.start, "max_misalignment": "15m"}
    while_unread = settings(stack, topics, "sessionizer", tmp_path / "while", "unread_bootstrap",
                            mode="bootstrap", backfill=backfill)  # fmt: skip
    first = run_app(spark, while_unread, available_now=True, show_progress=False)
    assert first.handovers["playback"].offsets == pending.offsets, "handed over where the table ends"

    router = topics.routers["playback"]
    drain = router.model_copy(
        update={"query": router.query.model_copy(update={"checkpoint_location": str(checkpoint)})}
    )
    archive_available_now(spark, drain)
    assert unread_record(checkpoint) == {}, "the unread range is read and committed"
    committed = pin_handover(stack.catalog, ref, topic, CLUSTERS["playback"])
    assert all(committed.offsets[p] >= o for p, o in pending.offsets.items())
    assert sum(committed.offsets.values()) - sum(pending.offsets.values()) >= more.count
    # Its commit records the whole range it read: from where the table ended to where it ends now.
    snapshot = stack.catalog.load().load_table(ref.pyiceberg_identifier).current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    recorded = BatchRange.recorded(snapshot.summary.additional_properties, topic, CLUSTERS["playback"])
    assert recorded is not None and not isinstance(recorded.start, str), recorded
    assert {p: recorded.start.get(p) for p in pending.offsets} == pending.offsets, recorded
    assert recorded.end == committed.offsets, recorded
    after = settings(stack, topics, "sessionizer", tmp_path / "after", "committed_bootstrap",
                     mode="bootstrap", backfill=backfill)  # fmt: skip
    second = run_app(spark, after, available_now=True, show_progress=False)
    assert second.handovers["playback"].offsets == committed.offsets
    rows = output_rows(spark, "committed_bootstrap")
    assert len(rows) > 10
    assert output_rows(spark, "unread_bootstrap") == rows
    # Made after the commit: the committed records read too, each once, and a hand-over past them.
    drained = past(pending.offsets)
    assert drained >= more.count * 0.9, f"{drained} of the {more.count} records committed"
    committed_backfill = backfill_last_hour("committed_backfill")
    assert committed_backfill.rows_read == {"playback": held + drained}
    assert committed_backfill.handovers["playback"].offsets == committed.offsets
    replanned = plan(stack.catalog, [topic], window, BoundedOrder(timedelta(minutes=15)))
    assert replanned.tables[0].snapshot_id != archived_hours.tables[0].snapshot_id
    assert replanned.splits == archived_hours.splits and replanned.epochs == archived_hours.epochs


def test_a_bootstrap_refuses_a_hand_over_kafka_no_longer_holds(
    stack: Services, spark: SparkSession, topics: Topics, tmp_path: Path
) -> None:
    """Last in this file: it deletes records of the topics the others read."""
    from confluent_kafka import TopicPartition

    from bergstream.backfill.read.handover import pin_handover
    from bergstream.backfill.read.planner import table_ref

    topic = topics.names["playback"]
    handover = pin_handover(stack.catalog, table_ref(topic, stack.catalog), topic, CLUSTERS["playback"])
    # Records beyond where the archive ends, whatever the tests before archived.
    later = ProduceRequest(topic=topic, schema="playback", count=200, partitions=4, seed=12,
                           ingestion_start=topics.start + timedelta(hours=2, minutes=55),
                           ingestion_span=timedelta(minutes=1))  # fmt: skip
    produce(later, stack.bootstrap_servers, show_progress=False)
    beyond = handover.offsets[0] + 1
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for future in admin.delete_records([TopicPartition(topic, 0, beyond)]).values():
        future.result(30)
    bootstrap = settings(stack, topics, "sessionizer", tmp_path / "refused", "refused", mode="bootstrap",
                         backfill={"start": topics.start, "max_misalignment": "15m"})  # fmt: skip
    with pytest.raises(BackfillConfigError) as refused:
        run_app(spark, bootstrap, available_now=True, show_progress=False)
    assert str(refused.value).startswith(
        f"Kafka no longer holds the hand-over offset: topic {topic} partition 0, hand-over offset "
        f"{handover.offsets[0]}, earliest offset {beyond}, next offset "
    )
