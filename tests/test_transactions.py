"""Topics written by transactional producers, on a real broker, Spark and Iceberg: the archive holds what a
read_committed consumer reads, each committed record once and no aborted one, whether a transaction is
committed or aborted between the router's micro-batches, inside one, or is still open while the router runs;
and a bootstrap over such an archive writes what a live run reading committed records writes."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bergstream.backfill.errors import BackfillConfigError
from bergstream.backfill.read.handover import Handover, agreed_isolation_level, refuse_lost_handover
from bergstream.router.config import RouterConfig, flat_settings
from bergstream.router.driver.launch import archive_available_now
from bergstream.runtime.run import run_app
from bergstream.schemas.batch_range import ISOLATION_LEVEL
from tests.commands import run_whole
from tests.jobs.identity_app import identity_settings
from tests.kafka_reads import read_committed
from tests.services import Services
from tests.transactions import Sent, TransactionalWriter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration
CLUSTER = "us-east-1"


def router(stack: Services, topic: str, checkpoint: Path) -> RouterConfig:
    # Micro-batches of at most 700 offsets: their ends fall inside transactions.
    return RouterConfig.flat(
        topic=topic, schema="playback", encoding="json", table=topic, cluster=CLUSTER,
        kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        checkpoint_location=str(checkpoint), catalog=stack.catalog, max_offsets_per_trigger=700,
    )  # fmt: skip


def archived(spark: SparkSession, stack: Services, topic: str) -> list[tuple[str, int, int]]:
    """(playback id, partition, offset) of every row of the topic's archive."""
    rows = spark.table(stack.catalog.table_identifier(topic)).select(
        "playback_id", "__metadata__.partition", "__metadata__.offset"
    )
    return [(row.playback_id, row.partition, row.offset) for row in rows.collect()]


def assert_once(rows: list[tuple[str, int, int]]) -> None:
    twice = [key for key, n in Counter((p, o) for _, p, o in rows).items() if n > 1]
    assert not twice, f"{len(twice)} offsets archived twice, e.g. {twice[:3]}"
    names = [name for name, _, _ in rows]
    assert len(names) == len(set(names)), "a record archived twice"


def test_the_archive_holds_each_committed_record_once_and_no_aborted_one(
    stack: Services, spark: SparkSession, tmp_path: Path
) -> None:
    topic = "txn_archive"
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    sent = Sent()
    first = TransactionalWriter(stack.bootstrap_servers, topic, "txn-archive-a", start, sent)
    second = TransactionalWriter(stack.bootstrap_servers, topic, "txn-archive-b", start, sent)
    first.transaction(1000, "commit")
    first.transaction(500, "abort")
    first.transaction(1000, "commit")
    readable = set(sent.committed)
    # Open while the router runs: the records after its first ones wait for it, committed or not.
    second.begin(300)
    first.transaction(500, "commit")
    config = router(stack, topic, tmp_path / "checkpoint")
    archive_available_now(spark, config)
    rows = archived(spark, stack, topic)
    assert_once(rows)
    names = {name for name, _, _ in rows}
    assert not names & sent.aborted, f"{len(names & sent.aborted)} aborted records archived"
    assert not names & sent.pending, f"{len(names & sent.pending)} records of an open transaction archived"
    assert names == readable

    second.end("abort")
    first.transaction(700, "commit")
    first.transaction(300, "abort")
    second.transaction(400, "commit")
    archive_available_now(spark, config)
    rows = archived(spark, stack, topic)
    assert_once(rows)
    assert {name for name, _, _ in rows} == sent.committed
    committed = read_committed({"bootstrap.servers": stack.bootstrap_servers}, topic)
    assert {(p, o) for _, p, o in rows} == {(m.partition(), m.offset()) for m in committed}
    table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{topic}")
    summary = table.current_snapshot().summary.additional_properties  # type: ignore[union-attr]
    assert summary[ISOLATION_LEVEL] == "read_committed"


def test_a_bootstrap_over_a_transactional_topic_writes_what_a_live_run_reading_committed_records_writes(
    stack: Services, spark: SparkSession, tmp_path: Path
) -> None:
    """Archived with transactions aborted around and inside its micro-batches, then more of both in Kafka
    alone, and a transaction left open through both runs: the bootstrap is not refused, and writes what the
    live run writes, every committed record once."""
    topic = "txn_bootstrap"
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    sent = Sent()
    first = TransactionalWriter(stack.bootstrap_servers, topic, "txn-boot-a", start, sent)
    second = TransactionalWriter(stack.bootstrap_servers, topic, "txn-boot-b", start, sent)
    first.transaction(1500, "commit")
    second.begin(200)
    first.transaction(500, "abort")
    second.end("commit")
    first.transaction(800, "commit")
    archive_available_now(spark, router(stack, topic, tmp_path / "router"))
    first.transaction(600, "commit")
    first.transaction(400, "abort")
    first.transaction(300, "commit")
    second.begin(100)
    try:
        window = {"start": start, "max_misalignment": "15m"}
        bootstrap = identity_settings(stack, topic, CLUSTER, tmp_path / "bootstrap", "txn_bootstrapped",
                                      mode="bootstrap", backfill=window)  # fmt: skip
        report = run_app(spark, bootstrap, available_now=True, show_progress=False)
        assert report.position.phase == "kafka"
        live = identity_settings(stack, topic, CLUSTER, tmp_path / "live", "txn_live", mode="live")
        run_app(spark, live, available_now=True, show_progress=False)
    finally:
        second.end("abort")
    written = sorted(tuple(row) for row in spark.table("bergstream.apps.txn_bootstrapped").collect())
    assert written == sorted(tuple(row) for row in spark.table("bergstream.apps.txn_live").collect())
    assert len(written) == len(sent.committed)
    assert len({(p, o) for p, o, _ in written}) == len(written)


def test_an_archive_read_at_one_level_is_not_handed_over_to_a_source_reading_at_the_other() -> None:
    pinned = Handover("c.archive.t", "t", CLUSTER, 7, {0: 10}, "read_committed", None, 5)
    assert agreed_isolation_level(pinned, "read_committed") == pinned
    with pytest.raises(BackfillConfigError) as refused:
        agreed_isolation_level(pinned, "read_uncommitted")
    assert str(refused.value).startswith(
        "topic t: the archive in c.archive.t was read with isolation level read_committed (snapshot 5), and "
        "this source reads Kafka with read_uncommitted"
    )
    assert "Set kafka.isolation.level: read_committed on the source" in str(refused.value)
    older = Handover("c.archive.t", "t", CLUSTER, 7, {0: 10})
    assert agreed_isolation_level(older, "read_committed").isolation_level == "read_committed"


def test_both_hand_over_checks_ask_kafka_at_the_archive_s_level_past_an_open_transaction(
    stack: Services, spark: SparkSession
) -> None:
    """A hand-over at the high watermarks, past an open transaction's records: a reader of uncommitted
    records holds it; a reader of committed ones has not reached it. The Python check (at plan time) and the
    source's Java check (at start and at the switch) say the same for the same plan document, whatever the
    Kafka options say."""
    from confluent_kafka import Consumer, TopicPartition
    from py4j.protocol import Py4JJavaError

    topic = "txn_checks"
    writer = TransactionalWriter(stack.bootstrap_servers, topic, "txn-checks", datetime.now(UTC), Sent())
    writer.transaction(90, "commit")
    writer.begin(30)
    try:
        client = {"bootstrap.servers": stack.bootstrap_servers}
        consumer = Consumer({**client, "group.id": "txn-checks", "isolation.level": "read_uncommitted"})
        try:
            high = {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), cached=False)[1] for p in range(3)
            }
        finally:
            consumer.close()
        check_planned = spark._jvm.io.bergstream.backfill.Handover.checkPlanned  # type: ignore[union-attr]
        for level, other in (("read_uncommitted", "read_committed"), ("read_committed", "read_uncommitted")):
            handover = Handover(f"c.archive.{topic}", topic, CLUSTER, 1, high, level)
            options = {"kafka.bootstrap.servers": stack.bootstrap_servers, "kafka.isolation.level": other}
            document = json.dumps(handover.to_json())
            if level == "read_uncommitted":
                refuse_lost_handover(handover, client)
                check_planned(options, document, "at start")
                continue
            with pytest.raises(BackfillConfigError, match="Kafka has not reached the hand-over offset"):
                refuse_lost_handover(handover, client)
            with pytest.raises(Py4JJavaError, match="Kafka has not reached the hand-over offset"):
                check_planned(options, document, "at start")
    finally:
        writer.end("abort")


@pytest.mark.parametrize("client", ["own", "shared"])
def test_an_open_transaction_shows_as_unstable_offsets_not_as_lag(stack: Services, client: str) -> None:
    """The router reads up to the last stable offset: the records of a transaction still open are not lag
    (no reader of committed records may read them) but unstable, until it ends. A topic's own client reads
    its partitions' bounds one by one; a router of many topics reads every topic's at once (SharedKafka),
    and the two agree."""
    from bergstream.router.consumer_group import GroupCommitter, LogBounds, SharedKafka
    from bergstream.router.lag import LagReporter
    from bergstream.router.metrics import RouterMetrics

    topic = f"txn_lag_{client}"
    now = datetime.now(UTC)
    writer = TransactionalWriter(stack.bootstrap_servers, topic, f"txn-lag-{client}", now, Sent())
    writer.transaction(60, "commit")
    writer.begin(40)
    settings = {"bootstrap.servers": stack.bootstrap_servers}
    kafka = GroupCommitter(topic, f"bergstream-router.{topic}", settings)
    shared = SharedKafka("txn", settings)
    metrics = RouterMetrics(topic)
    try:
        reader = kafka if client == "own" else shared.committer(topic, f"bergstream-router.{topic}")
        reporter = LagReporter(topic, CLUSTER, reader, metrics)

        def value(name: str, partition: int, **labels: str) -> float:
            labels = {"topic": topic, "partition": str(partition), **labels}
            found = metrics.registry.get_sample_value(name, labels)
            assert found is not None, f"{name} of partition {partition} is not set"
            return found

        def bounds() -> LogBounds | None:
            if client == "own":
                return None
            read = shared.log_bounds([topic, "no_such_topic"])[topic]
            watermarks = kafka.watermarks()
            assert read.start == {p: low for p, (low, _) in watermarks.items()}
            assert read.end == {p: high for p, (_, high) in watermarks.items()}
            assert read.high == kafka.high_watermarks(sorted(watermarks))
            return read

        def unstable_once_refreshed(expected: int) -> dict[int, int]:
            """The router at the last stable offsets, refreshed until `expected` records wait past them:
            a transaction's markers are written after its end is acknowledged, and move them then."""
            deadline = time.monotonic() + 30
            while True:
                stable = {p: high for p, (_, high) in kafka.watermarks().items()}
                reporter.refresh(stable, None, bounds())
                unstable = sum(value("bergstream_router_unstable_offsets", p) for p in stable)
                if unstable == expected:
                    return stable
                assert time.monotonic() < deadline, (
                    f"{unstable} records past the last stable offsets, not {expected}"
                )
                time.sleep(0.1)

        stable = unstable_once_refreshed(40)
        lag = {"group": f"bergstream-router.{topic}", "cluster_name": CLUSTER}
        assert sum(value("bergstream_router_lag_offsets", p, **lag) for p in stable) == 0
        assert {p: value("bergstream_router_last_stable_offset", p) for p in stable} == stable
        writer.end("abort")
        unstable_once_refreshed(0)
    finally:
        kafka.close()
        shared.close()


def test_router_aborted_finds_and_removes_the_aborted_records_a_router_reading_uncommitted_ones_archived(
    stack: Services, spark: SparkSession, tmp_path: Path
) -> None:
    """An archive made with read_uncommitted holds the aborted records; `router aborted` counts them per
    partition and table, and with --delete leaves each committed record once."""
    import sys

    import yaml

    topic = "txn_uncommitted"
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    sent = Sent()
    writer = TransactionalWriter(stack.bootstrap_servers, topic, "txn-uncommitted", start, sent)
    writer.transaction(700, "commit")
    writer.transaction(300, "abort")
    writer.transaction(400, "commit")
    writer.transaction(200, "abort")
    config = router(stack, topic, tmp_path / "checkpoint")
    kafka = {**config.query.kafka, "kafka.isolation.level": "read_uncommitted"}
    uncommitted = config.model_copy(update={"query": config.query.model_copy(update={"kafka": kafka})})
    archive_available_now(spark, uncommitted)
    assert {name for name, _, _ in archived(spark, stack, topic)} == sent.committed | sent.aborted

    settings = tmp_path / f"{topic}.yaml"
    settings.write_text(yaml.safe_dump(flat_settings(uncommitted, mode="json")))
    command = [sys.executable, "-m", "bergstream", "router", "aborted", "--topic", topic, "--config",
               str(settings), "--json"]  # fmt: skip
    found = run_whole(spark, command)
    assert found.returncode == 0, found.stderr[-3000:]
    report = json.loads(found.stdout)
    archive_report, dead_letter_report = report["tables"]
    assert archive_report["aborted"] == 500 and archive_report["deleted_in"] is None
    assert sum(archive_report["per_partition"].values()) == 500
    assert dead_letter_report["aborted"] == 0
    assert len(archived(spark, stack, topic)) == 1600, "nothing removed without --delete"

    removed = run_whole(spark, [*command, "--delete"])
    assert removed.returncode == 0, removed.stderr[-3000:]
    assert json.loads(removed.stdout)["tables"][0]["deleted_in"] is not None
    spark.sql(f"REFRESH TABLE {stack.catalog.table_identifier(topic)}")
    rows = archived(spark, stack, topic)
    assert_once(rows)
    assert {name for name, _, _ in rows} == sent.committed
    again = run_whole(spark, command)
    assert json.loads(again.stdout)["tables"][0]["aborted"] == 0
