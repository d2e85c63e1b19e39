"""Where the archive ends: every router commit records the Kafka range it covers in its snapshot summary, and
a router whose checkpoint is lost resumes there, its newest batch's dead letters appended once."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.router.recorded_positions import Recorded, newest_recorded, resume_offsets
from bergstream.router.write import QUERY_ID
from bergstream.schemas.batch_range import (
    BATCH_START,
    CLUSTER,
    ISOLATION_LEVEL,
    NEXT_OFFSETS,
    TOPIC,
    BatchRange,
    Origin,
)
from tests.routers import archived_offsets, produced_offsets
from tests.services import Services


def test_resume_offsets_take_the_furthest_position_and_earliest_for_a_new_partition() -> None:
    def recorded(batch: int, end: dict[int, int]) -> Recorded:
        return Recorded("t", batch, "q", batch, BatchRange("earliest", end))

    offsets = resume_offsets([recorded(3, {0: 10, 1: 7}), recorded(4, {0: 12})], [0, 1, 2])
    assert offsets == {0: 12, 1: 7, 2: -2}
    assert BatchRange({1: 5, 0: 3}, {0: 9, 1: 6}).properties(Origin("plays", "eu")) == {
        TOPIC: "plays",
        CLUSTER: "eu",
        ISOLATION_LEVEL: "read_committed",
        BATCH_START: '{"0":3,"1":5}',
        NEXT_OFFSETS: '{"0":9,"1":6}',
    }
    assert BatchRange({0: 3}, {0: 9}).starting_offsets("plays") == '{"plays": {"0": 3}}'
    summary = BatchRange("earliest", {0: 9, 1: 4}).properties(Origin("plays", "eu", topic_id="AAAA"))
    assert Origin.recorded(summary) == Origin("plays", "eu", "read_committed", "AAAA")
    assert Origin.recorded({TOPIC: "plays", CLUSTER: "eu"}) == Origin(
        "plays", "eu", "read_uncommitted", None
    ), "a commit from before levels were recorded was read with Spark's default"
    assert BatchRange.recorded(summary, "plays", "eu") == BatchRange("earliest", {0: 9, 1: 4})
    assert BatchRange.recorded(summary, "plays", "us") is None, "another cluster's position"
    assert BatchRange.recorded({"operation": "replace"}, "plays", "eu") is None, "not a router commit"


@pytest.mark.integration
def test_a_lost_checkpoint_resumes_where_the_tables_end_and_appends_missing_dead_letters_once(
    stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    config = RouterConfig.flat(
        {
            "topic": topic_name, "schema": "playback", "encoding": "json", "table": topic_name,
            "cluster": "test", "max_offsets_per_trigger": 400,
            "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
            "checkpoint_location": str(checkpoint), "catalog": stack.catalog,
        }
    )  # fmt: skip
    produced: set[tuple[int, int]] = set()

    def produce_some(seed: int) -> dict[int, int]:
        request = ProduceRequest(topic=topic_name, schema="playback", count=1000, bad_fraction=0.05,
                                 partitions=3, seed=seed)  # fmt: skip
        report = produce(request, stack.bootstrap_servers, show_progress=False)
        produced.update(produced_offsets(report.offsets))
        return {partition: high + 1 for partition, (_, high) in report.offsets.items()}

    produce_some(1)
    archive_available_now(spark, config)
    ends = produce_some(2)
    archive_available_now(spark, config)
    archive = stack.catalog.table_identifier(topic_name)
    dead_letters = stack.catalog.table_identifier(f"{topic_name}__dlq")
    newest = newest_recorded(spark, archive, topic_name, "test")
    newest_dead_letters = newest_recorded(spark, dead_letters, topic_name, "test")
    assert newest is not None and newest_dead_letters is not None
    assert newest.range.end == ends, "the newest commit covers every offset read"
    assert newest.batch == newest_dead_letters.batch, "the last batch had dead letters: the scenario below"
    summaries = spark.sql(f"SELECT summary FROM {archive}.snapshots ORDER BY committed_at").collect()
    assert all(row.summary[TOPIC] == topic_name and row.summary[QUERY_ID] for row in summaries)
    positions = [dict(sorted(next_offsets(row.summary).items())) for row in summaries]
    assert all(
        all(later[p] >= earlier.get(p, 0) for p in later) for earlier, later in itertools.pairwise(positions)
    ), "positions only move forward"

    # The router stopped between its last batch's two commits, and its checkpoint is gone.
    newest_id = newest_dead_letters.snapshot_id
    parent = spark.sql(
        f"SELECT parent_id FROM {dead_letters}.snapshots WHERE snapshot_id = {newest_id}"
    ).first()
    assert parent is not None and parent.parent_id is not None
    dead_letter_table = f"{stack.catalog.namespace}.{topic_name}__dlq"
    spark.sql(
        f"CALL {stack.catalog.name}.system.rollback_to_snapshot('{dead_letter_table}', {parent.parent_id})"
    )
    shutil.rmtree(checkpoint)
    produce_some(3)
    totals = archive_available_now(spark, config)
    assert totals.read == 1000, "resumed where the archive ends, not from the settings' earliest"

    seen = archived_offsets(stack, topic_name)
    assert len(seen) - len(set(seen)) == 0, "an offset archived or dead-lettered twice"
    assert set(seen) == produced, f"{len(produced - set(seen))} offsets lost"
    resumed = newest_recorded(spark, dead_letters, topic_name, "test")
    assert resumed is not None and resumed.range.end.keys() == {0, 1, 2}


def next_offsets(summary: dict[str, str]) -> dict[int, int]:
    return {int(p): int(o) for p, o in json.loads(summary[NEXT_OFFSETS]).items()}
