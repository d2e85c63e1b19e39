"""Topics written by transactional producers, on a real broker, Spark and Iceberg: the archive holds what a
read_committed consumer reads, each committed record once and no aborted one, whether a transaction is
committed or aborted between the router's micro-batches, inside one, or is still open while the router runs;
and a bootstrap over such an archive writes what a live run reading committed records writes."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bergstream.backfill.runtime.run import run_app
from bergstream.backfill.runtime.settings import AppSettings
from bergstream.router.app import archive_available_now
from bergstream.router.config import RouterConfig
from bergstream.schemas.positions import ISOLATION_LEVEL
from tests.kafka_reads import read_committed
from tests.services import Services
from tests.transactions import Sent, TransactionalWriter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration
CLUSTER = "us-east-1"


def router(stack: Services, topic: str, checkpoint: Path) -> RouterConfig:
    # Micro-batches of at most 700 offsets: their ends fall inside transactions.
    return RouterConfig(
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


def identity(stack: Services, topic: str, checkpoint: Path, output: str, **mode: Any) -> AppSettings:
    return AppSettings.model_validate(
        {
            "app": "identity",
            "entry": "tests.jobs.identity_app:identity",
            "sources": {
                "playback": {"topic": topic, "table": topic, "schema": "playback", "cluster": CLUSTER}
            },
            "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
            "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
            "checkpoint_location": str(checkpoint),
            "output_table": output,
            "max_offsets_per_trigger": 900,
            "spark": {"master": "local[2]"},
            **mode,
        }
    )


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
        bootstrap = identity(stack, topic, tmp_path / "bootstrap", "txn_bootstrapped", mode="bootstrap",
                             backfill={"start": start, "max_misalignment": "15m"})  # fmt: skip
        report = run_app(spark, bootstrap, available_now=True, show_progress=False)
        assert report.position.phase == "kafka"
        live = identity(stack, topic, tmp_path / "live", "txn_live", mode="live")
        run_app(spark, live, available_now=True, show_progress=False)
    finally:
        second.end("abort")
    written = sorted(tuple(row) for row in spark.table("bergstream.apps.txn_bootstrapped").collect())
    assert written == sorted(tuple(row) for row in spark.table("bergstream.apps.txn_live").collect())
    assert len(written) == len(sent.committed)
    assert len({(p, o) for p, o, _ in written}) == len(written)
