"""One topic per table, one writer per topic, on a real broker, Spark and Iceberg: a router refuses a table
that holds another topic (two settings naming one table, two topic names mapped to one default table name),
and a router that finds another router's commit covering offsets its batch covers stops before archiving
them twice, naming the other."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bergstream.errors import ConfigError
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.config import RouterConfig, table_for_topic
from bergstream.router.driver.launch import archive_available_now
from bergstream.router.errors import RouterStopped
from bergstream.router.write import BATCH_ID, QUERY_ID
from bergstream.schemas.archive import DEAD_LETTER_SUFFIX
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def router(stack: Services, topic: str, checkpoint: Path, table: str | None = None) -> RouterConfig:
    return RouterConfig.flat(
        topic=topic, schema="playback", encoding="json", table=table or table_for_topic(topic),
        cluster="us-east-1", checkpoint_location=str(checkpoint), catalog=stack.catalog,
        kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
    )  # fmt: skip


def fill(stack: Services, topic: str, count: int, seed: int) -> None:
    request = ProduceRequest(topic=topic, schema="playback", count=count, partitions=2, seed=seed)
    produce(request, stack.bootstrap_servers, show_progress=False)


def test_a_table_that_holds_another_topic_is_refused(
    stack: Services, spark: SparkSession, tmp_path: Path
) -> None:
    # Kafka refuses shared.a beside shared_a (their metrics' names would collide), not shared-a.
    for topic in ("shared-a", "shared_a", "shared_b"):
        fill(stack, topic, 50, seed=len(topic))
    assert archive_available_now(spark, router(stack, "shared-a", tmp_path / "a")).archived == 50
    identifier = stack.catalog.table_identifier("shared_a")
    # Another topic whose default table name is the same, and another topic whose settings name the table.
    for topic, table in (("shared_a", None), ("shared_b", "shared_a")):
        with pytest.raises(ConfigError) as refused:
            archive_available_now(spark, router(stack, topic, tmp_path / topic, table))
        assert str(refused.value).startswith(
            f"table {identifier} archives topic shared-a (its property bergstream.topic), not {topic}: one "
            "table holds one topic"
        )
    assert spark.table(identifier).count() == 50, "nothing of the other topics written"


def test_a_second_router_of_a_topic_into_its_table_stops_before_archiving_a_record_twice(
    stack: Services, spark: SparkSession, tmp_path: Path
) -> None:
    """Two routers of one topic, each with its own checkpoint: the second starts where the table ends and
    archives what came since; the first, started again from its own checkpoint, would archive the same
    offsets. It stops instead, naming the other's query and snapshot."""
    topic = "two_writers"
    fill(stack, topic, 400, seed=1)
    first = router(stack, topic, tmp_path / "first")
    assert archive_available_now(spark, first).archived == 400
    fill(stack, topic, 300, seed=2)
    assert archive_available_now(spark, router(stack, topic, tmp_path / "second")).archived == 300
    identifier = stack.catalog.table_identifier(topic)
    table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{topic}")
    newest = table.current_snapshot()
    assert newest is not None and newest.summary is not None
    other_query = newest.summary.additional_properties[QUERY_ID]

    with pytest.raises(RouterStopped) as stopped:
        archive_available_now(spark, first)
    message = str(stopped.value)
    assert (
        f"topic {topic} (cluster us-east-1): another router writes it into {identifier}: its query "
        in message
    )
    assert f"query {other_query} committed partition " in message
    assert "This router stops; run one router per topic and table" in message
    rows = spark.table(identifier).select("__metadata__.partition", "__metadata__.offset").collect()
    assert len(rows) == len(set(rows)) == 700, "every offset archived once"


def test_two_routers_committing_the_same_offsets_at_once_each_find_the_other_after_their_commit(
    stack: Services, spark: SparkSession, tmp_path: Path
) -> None:
    """Neither saw the other before its append: looking again past its own commit, each finds the other's."""
    from bergstream.router.write import BatchTableWriter
    from bergstream.schemas.batch_range import BatchRange, Origin

    fill(stack, "raced", 20, seed=3)
    archive_available_now(spark, router(stack, "raced", tmp_path / "raced"))
    source = stack.catalog.table_identifier("raced")
    identifier = stack.catalog.table_identifier("raced_copy")
    spark.sql(f"CREATE TABLE {identifier} USING iceberg AS SELECT * FROM {source} LIMIT 0")
    origin, covered = Origin("raced", "us-east-1"), BatchRange({0: 0, 1: 0}, {0: 5, 1: 5})
    first, second = (BatchTableWriter(spark, identifier, query) for query in ("query-a", "query-b"))
    assert first.overlapping(origin, covered) == [], "an empty table"
    for writer in (first, second):
        writer.append(spark.table(source).limit(3), 0, covered.properties(origin))
    for writer, other in ((first, "query-b"), (second, "query-a")):
        (overlap,) = writer.overlapping(origin, covered, batch_id=0)
        assert overlap.query_id == other and overlap.offsets == {0: (0, 5), 1: (0, 5)}
    assert second.overlapping(origin, BatchRange({0: 5, 1: 5}, {0: 9, 1: 9})) == [], "a later range"
    assert second.overlapping(Origin("raced", "eu-west-1"), covered, batch_id=0) == [], "another cluster"


def test_a_replayed_batch_is_written_by_the_one_writer_into_the_table_that_lacks_it_alone(
    stack: Services, spark: SparkSession, tmp_path: Path
) -> None:
    """A router that stopped between a batch's two commits (its archive's landed, its dead letters' did not)
    runs the batch again: the job that writes every batch writes the dead letters alone, once; the archive
    is not written again and its records are not counted twice."""
    topic = "replayed_half"
    config = router(stack, topic, tmp_path / "checkpoint")

    def bad_and_good(seed: int) -> None:
        request = ProduceRequest(topic=topic, schema="playback", count=200, partitions=2, seed=seed,
                                 bad_fraction=0.1)  # fmt: skip
        produce(request, stack.bootstrap_servers, show_progress=False)

    bad_and_good(1)
    first = archive_available_now(spark, config)
    bad_and_good(2)
    second = archive_available_now(spark, config)
    assert first.dead_lettered > 0 and second.dead_lettered > 0
    identifier = stack.catalog.table_identifier(topic)
    dead_letters = f"{identifier}{DEAD_LETTER_SUFFIX}"

    def snapshots(table: str) -> list[tuple[int, dict[str, str]]]:
        rows = spark.sql(
            f"SELECT s.snapshot_id, s.summary FROM {table}.snapshots s WHERE s.snapshot_id IN "
            f"(SELECT snapshot_id FROM {table}.history WHERE is_current_ancestor) ORDER BY s.committed_at"
        ).collect()
        return [(row.snapshot_id, dict(row.summary)) for row in rows]

    # As if the router had stopped after the archive's commit of batch 1: the dead-letter table rolled back
    # to batch 0, and the checkpoint without batch 1's commit.
    (batch_0, summary_0), (_, summary_1) = snapshots(dead_letters)
    assert (summary_0[BATCH_ID], summary_1[BATCH_ID]) == ("0", "1")
    namespace_table = dead_letters.split(".", 1)[1]
    spark.sql(f"CALL {stack.catalog.name}.system.rollback_to_snapshot('{namespace_table}', {batch_0})")
    (commit,) = [path for path in (tmp_path / "checkpoint").rglob("commits/1")]
    commit.unlink()
    third = archive_available_now(spark, config)

    assert third.replayed_batches == 1 and third.archived == 0, "the archive's records were counted before"
    written = snapshots(dead_letters)
    assert [summary[BATCH_ID] for _, summary in written] == ["0", "1"]
    # Spark's writer stamps its application in the summaries it commits; the one writer does not.
    assert "spark.app.id" not in written[1][1], written[1][1]
    appends = [summary[BATCH_ID] for _, summary in snapshots(identifier)]
    assert appends == ["0", "1"], "no second archive append"
    dead = spark.table(dead_letters).select("__metadata__.partition", "__metadata__.offset").collect()
    assert len(dead) == len(set(dead)) == first.dead_lettered + second.dead_lettered
    archived = spark.table(identifier).select("__metadata__.partition", "__metadata__.offset").collect()
    assert len(archived) == len(set(archived)) == 400 - len(dead)
