"""A router whose checkpoint holds no batch, and whose tables record where they end: where it resumes.

Without this, a lost checkpoint (a volume not kept, a path changed) starts the router over from its
settings' startingOffsets: the whole topic archived twice from `earliest`, or a gap from `latest`. The
tables record the Kafka range of every commit (recorded_positions.py); the router resumes after the
furthest one, and first appends the dead letters of the archive's newest batch if the dead-letter table may
lack them.
"""

from __future__ import annotations

import json
import logging
import uuid

from pyspark.sql import Observation, SparkSession

from bergstream.kafka_source import kafka_range
from bergstream.router.config import RouterConfig
from bergstream.router.consumer_group import GroupCommitter
from bergstream.router.offset_log import checkpoint_has_batches
from bergstream.router.recorded_positions import Recorded, newest_recorded, resume_offsets
from bergstream.router.together import TOPIC_WRITE, rows_plan, write_tables
from bergstream.router.transform import DEAD_LETTERED, RecordSplitter
from bergstream.router.write import BATCH_ID, QUERY_ID, BatchTableWriter
from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.batch_range import EARLIEST, Origin

log = logging.getLogger("bergstream.router")


def starting_offsets(
    spark: SparkSession,
    config: RouterConfig,
    origin: Origin,
    layout: ArchiveLayout,
    splitter: RecordSplitter,
    kafka: GroupCommitter,
) -> dict[int, int] | None:
    """Per partition, where the router starts when its checkpoint holds no batch and its tables record a
    position (EARLIEST for a partition they do not); None otherwise: the settings' startingOffsets hold."""
    if checkpoint_has_batches(spark, config.query.checkpoint_location):
        return None
    offsets = recorded_positions(spark, config, origin, layout, splitter, kafka)
    if offsets is None:
        return None
    listed = ", ".join(f"p{p}: {'earliest' if o == EARLIEST else o}" for p, o in sorted(offsets.items()))
    log.warning(
        "%s: the checkpoint %s holds no batch; resuming where the tables' snapshots say the archive ends "
        "(%s), not from the settings' startingOffsets",
        config.settings.topic, config.query.checkpoint_location, listed,
    )  # fmt: skip
    return offsets


def recorded_positions(
    spark: SparkSession,
    config: RouterConfig,
    origin: Origin,
    layout: ArchiveLayout,
    splitter: RecordSplitter,
    kafka: GroupCommitter,
) -> dict[int, int] | None:
    """Per partition, where the topic's tables say its archive ends (EARLIEST for a partition they do not);
    None when they record no position. The dead letters of the archive's newest batch are appended first
    if the dead-letter table may lack them."""
    catalog = config.query.catalog
    archive_id = catalog.table_identifier(layout.table)
    dead_letter_id = catalog.table_identifier(layout.dead_letter_table)
    archived = newest_recorded(spark, archive_id, config.settings.topic, config.query.cluster)
    dead_lettered = newest_recorded(spark, dead_letter_id, config.settings.topic, config.query.cluster)
    recorded = [position for position in (archived, dead_lettered) if position is not None]
    if not recorded:
        return None
    partitions = kafka.partitions()
    if archived is not None and not _covers(dead_lettered, archived):
        _append_dead_letters(spark, config, origin, archived, dead_letter_id, splitter, kafka, partitions)
    return resume_offsets(recorded, partitions)


def _covers(newer: Recorded | None, older: Recorded) -> bool:
    """Whether `newer` is `older`'s batch or a later one: its range ends at or past `older`'s everywhere."""
    if newer is None:
        return False
    return newer.batch == older.batch or all(
        newer.range.end.get(partition, -1) >= offset for partition, offset in older.range.end.items()
    )


def _append_dead_letters(
    spark: SparkSession,
    config: RouterConfig,
    origin: Origin,
    archived: Recorded,
    dead_letter_id: str,
    splitter: RecordSplitter,
    kafka: GroupCommitter,
    partitions: list[int],
) -> None:
    """The archive's newest batch may have stopped before its dead letters were appended: read its range
    from Kafka again and append them, under the batch's own ids (so never twice)."""
    topic = config.settings.topic
    batch = archived.range
    # Spark takes exact offsets only for every partition: one added since the batch reads nothing.
    low = {p: start for p, (start, _) in kafka.watermarks(partitions).items()}
    end = {p: batch.end.get(p, low[p]) for p in partitions}
    if isinstance(batch.start, str):
        starting = batch.start
    else:
        starting = json.dumps({topic: {str(p): batch.start.get(p, end[p]) for p in partitions}})
    ending = json.dumps({topic: {str(p): offset for p, offset in end.items()}})
    records = kafka_range(spark, topic, config.query.kafka, starting, ending)
    writer = BatchTableWriter(spark, dead_letter_id, archived.query_id)
    found = 0
    if writer.last_committed < archived.batch_id:
        # By the job that writes every batch, the archive table not written (it holds the batch).
        template = spark.createDataFrame([], records.schema)
        plan = rows_plan(splitter.combined_rows(splitter.stamp(template)))
        properties = {
            QUERY_ID: archived.query_id,
            BATCH_ID: str(archived.batch_id),
            **batch.properties(origin),
        }
        jvm = spark._jvm
        assert jvm is not None
        topic_write = getattr(jvm, TOPIC_WRITE)(topic, plan, None, dead_letter_id, True, False, properties)
        cores = spark.sparkContext.defaultParallelism
        written = write_tables(records, [topic_write], cores, {topic: cores}, commit_threads=1)
        (outcome,) = json.loads(written.json())
        if outcome["error"] is not None:
            written.rethrow(0)
            log.warning("%s: %s; the dead letters appended by Spark's writer", topic, outcome["error"])
            observation = Observation(f"bergstream-router-{topic}-resume-{uuid.uuid4().hex}")
            rows = splitter.dead_letter_rows(splitter.stamp(records), observation)
            appended = writer.append(rows, archived.batch_id, batch.properties(origin))
            found = int(observation.get[DEAD_LETTERED]) if appended is not None else 0
        else:
            found = int(outcome["totals"][1])
    log.warning(
        "%s: the dead-letter table may lack the dead letters of the archive's newest batch (query %s, batch "
        "%d): read offsets %s to %s from Kafka again, %d dead-lettered", topic, archived.query_id,
        archived.batch_id, starting, ending, found,
    )  # fmt: skip
