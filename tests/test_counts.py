"""Counting a batch in the pass that writes it gives what a separate aggregation gives, whatever the
number of partitions."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import Observation

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.batch_counts import BatchCounts, count_batch, from_observation, observed_columns
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.schemas.archive import DEAD_LETTER_SUFFIX
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.integration

SCHEMA = "partition int, offset long, timestamp timestamp, error string"


def batch(spark: SparkSession, partitions: list[int], seed: int, most: int = 300) -> DataFrame:
    rng = random.Random(seed)
    start = datetime(2026, 11, 22, 16, tzinfo=UTC)
    rows = []
    for partition in partitions:
        first = rng.randrange(0, 10_000)
        for offset in range(first, first + rng.randrange(1, most)):
            error = "malformed JSON" if rng.random() < 0.1 else None
            rows.append((partition, offset, start + timedelta(milliseconds=rng.randrange(10**7)), error))
    rng.shuffle(rows)
    return spark.createDataFrame(rows, SCHEMA).repartition(3)


def observe(records: DataFrame) -> BatchCounts:
    observation = Observation("test-counts")
    records.observe(observation, *observed_columns(records.sparkSession)).write.format("noop").mode(
        "overwrite"
    ).save()
    return from_observation(observation.get)


def test_observed_counts_equal_an_aggregation(spark: SparkSession) -> None:
    # Shuffled over 3 tasks: each task sees every partition, in no order.
    records = batch(spark, [0, 1, 3, 7], seed=5)
    observed = observe(records)
    assert observed == count_batch(records)
    assert observed.dead_lettered > 0
    assert [read.partition for read in observed.partitions] == [0, 1, 3, 7]


def test_a_thousand_partitions_are_counted_in_the_pass(spark: SparkSession) -> None:
    records = batch(spark, list(range(0, 2000, 2)), seed=6, most=20)
    observed = observe(records)
    assert observed == count_batch(records)
    assert len(observed.partitions) == 1000


def test_an_empty_batch_counts_nothing(spark: SparkSession) -> None:
    records = spark.createDataFrame([], SCHEMA)
    assert observe(records) == BatchCounts(read=0, archived=0, newest=None, partitions=())


def test_a_topic_of_many_partitions_is_written_by_few_tasks_and_counted_per_partition(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    report = produce(
        ProduceRequest(
            topic=topic_name, schema="playback", count=2000, bad_fraction=0.02, partitions=24, seed=8
        ),
        stack.bootstrap_servers,
        show_progress=False,
    )
    config = RouterConfig.flat(
        topic=topic_name, schema="playback", encoding="json", table=topic_name,
        kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        checkpoint_location=str(tmp_path / "checkpoint"), catalog=stack.catalog, max_offsets_per_trigger=700,
        write_tasks=3,
    )  # fmt: skip
    totals = archive_available_now(spark, config)
    bad = sum(report.malformed.values())
    assert (totals.read, totals.archived, totals.dead_lettered) == (2000, 2000 - bad, bad)
    assert totals.per_partition == dict(report.per_partition)
    assert totals.batches >= 3
    # 24 partitions, 3 tasks: a batch writes at most 3 files to each hour it touches, in either table.
    table = stack.catalog.table_identifier(topic_name)
    for identifier in (table, f"{table}{DEAD_LETTER_SUFFIX}"):
        files = spark.sql(f"SELECT partition FROM {identifier}.files").collect()
        assert 0 < len(files) <= 3 * totals.batches * len({row.partition for row in files}), identifier


def test_small_batches_are_written_by_one_task_and_large_ones_by_several(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    produce(
        ProduceRequest(topic=topic_name, schema="playback", count=2400, partitions=4, seed=9),
        stack.bootstrap_servers,
        show_progress=False,
    )

    def files_per_batch_and_hour(records_per_write_task: int) -> list[int]:
        """Data files each batch's archive snapshot added to each hour, in commit order."""
        table = f"{topic_name}_per_task_{records_per_write_task}"
        config = RouterConfig.flat(
            topic=topic_name, schema="playback", encoding="json", table=table,
            kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
            checkpoint_location=str(tmp_path / table), catalog=stack.catalog, max_offsets_per_trigger=600,
            write_tasks=2, records_per_write_task=records_per_write_task,
        )  # fmt: skip
        totals = archive_available_now(spark, config)
        assert totals.read == 2400 and totals.batches >= 4
        identifier = stack.catalog.table_identifier(table)
        rows = spark.sql(
            f"SELECT s.committed_at, count(*) AS files FROM {identifier}.entries e "
            f"JOIN {identifier}.snapshots s ON e.snapshot_id = s.snapshot_id "
            "WHERE e.status = 1 GROUP BY s.committed_at, e.data_file.partition ORDER BY s.committed_at"
        ).collect()
        return [row.files for row in rows]

    # 600 records a batch: one task each after the first batch, whose predecessor is unknown.
    quiet = files_per_batch_and_hour(records_per_write_task=1000)
    assert quiet[0] == 2 and set(quiet[1:]) == {1}, quiet
    # 300 records a task: every batch is written by both (the last may hold one partition's remainder).
    busy = files_per_batch_and_hour(records_per_write_task=300)
    assert set(busy[:-1]) == {2}, busy
