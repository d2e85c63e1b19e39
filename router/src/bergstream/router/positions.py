"""Where the archive ends: the Kafka position each router commit covers, kept in its Iceberg snapshot summary.

Every append of the router, to the archive table and to the dead-letter table, records beside the query
and batch ids the topic, the cluster it was read from, and the micro-batch's range as Spark's offset log
has it: the offset each partition started at (`bergstream.kafka.batch-start`, or `earliest` for a first
batch that started there) and the next offset of every partition after it (`bergstream.kafka.next-offsets`,
partitions without a record in the batch included). Every record below the next offsets that a consumer of
the router's isolation level reads (read_committed: no aborted record, no transaction marker) is in the
archive table, once, or is a dead letter: in the dead-letter table, or about to be, since that commit
follows the archive's. Iceberg's Kafka Connect sink keeps its offsets in its snapshots the same way.

A router whose checkpoint is lost resumes from these positions: the newest of both tables', among the
snapshots of their current history (a rolled-back append does not count). When the archive's newest batch
is not the dead-letter table's newest, the router may have stopped between that batch's two commits: the
batch's range is read from Kafka again and its dead letters appended under the batch's own query and batch
ids, so that they are appended once whatever happened before.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bergstream.router.write import BATCH_ID, QUERY_ID
from bergstream.schemas.positions import (
    CLUSTER,
    EARLIEST,
    NEXT_OFFSETS,
    TOPIC,
    TOPIC_ID,
    BatchRange,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("bergstream.router")
# Where Spark starts a partition it finds after a query began: its earliest offset.
EARLIEST_START = "earliest"


def batch_range(
    query: StreamingQuery,
    batch_id: int,
    topic: str,
    starting: str,
    previous_end: dict[int, int] | None = None,
) -> BatchRange:
    """Batch `batch_id`'s range, from the query's offset log (written before the batch runs); `starting`
    is the query's startingOffsets, the start of its first batch; `previous_end`, batch `batch_id - 1`'s
    end where the caller has it (one read of the log instead of two)."""
    end = _logged_offsets(query, batch_id, topic)
    if end is None:
        raise RuntimeError(f"{topic}: batch {batch_id} is not in the query's offset log")
    start: dict[int, int] | str | None = previous_end
    if start is None and batch_id:
        start = _logged_offsets(query, batch_id - 1, topic)
    if start is None:
        start = _parse_starting(starting, topic)
    return BatchRange(start, end)


def _logged_offsets(query: StreamingQuery, batch_id: int, topic: str) -> dict[int, int] | None:
    logged = logged_offsets(query, batch_id)
    return None if logged is None else logged.get(topic, {})


def logged_offsets(query: StreamingQuery, batch_id: int) -> dict[str, dict[int, int]] | None:
    """The end of batch `batch_id` of every topic the query reads, from its offset log; None when the log
    does not hold the batch."""
    logged = query._jsq.streamingQuery().offsetLog().get(batch_id)
    if not logged.isDefined():
        return None
    offset = logged.get().offsets().apply(0)
    if not offset.isDefined():
        return None
    return {topic: _per_partition(offsets) for topic, offsets in json.loads(offset.get().json()).items()}


def topic_ranges(
    query: StreamingQuery, batch_id: int, starting: str, previous_end: dict[str, dict[int, int]] | None
) -> dict[str, BatchRange]:
    """Batch `batch_id`'s range in every topic of a query of many (`router run --pattern`): from its offset
    log, where a topic missing from the previous batch's end (`previous_end`, else read from the log) is
    new, read from its earliest offset as Spark reads new partitions."""
    end = logged_offsets(query, batch_id)
    if end is None:
        raise RuntimeError(f"batch {batch_id} is not in the offset log of query {query.name}")
    previous = previous_end
    if previous is None and batch_id:
        previous = logged_offsets(query, batch_id - 1)
    ranges = {}
    for topic, offsets in end.items():
        start: dict[int, int] | str
        if previous is not None:
            start = previous.get(topic, EARLIEST_START)
        else:
            start = _first_start(_parse_starting(starting, topic))
        ranges[topic] = BatchRange(start, offsets)
    return ranges


def _first_start(start: dict[int, int] | str) -> dict[int, int] | str:
    """A first batch's start in one topic: Spark's -2 and -1 (earliest, latest) by name; a topic the
    query's startingOffsets leave out starts at its earliest offset."""
    if isinstance(start, str):
        return start
    if not start or all(offset == -2 for offset in start.values()):
        return EARLIEST_START
    if all(offset == -1 for offset in start.values()):
        return "latest"
    return start


def may_hold_records(covered: BatchRange) -> bool:
    """Whether a batch's range in a topic may hold records: it moved, or it starts at a name."""
    if isinstance(covered.start, str):
        return True
    start = covered.start
    return any(partition not in start or end > start[partition] for partition, end in covered.end.items())


def _parse_starting(starting: str, topic: str) -> dict[int, int] | str:
    try:
        parsed = json.loads(starting)
    except ValueError:
        return starting  # earliest, latest
    return _per_partition(parsed.get(topic, {})) if isinstance(parsed, dict) else starting


@dataclass(frozen=True)
class Recorded:
    """The newest position recorded in one table for one topic and cluster."""

    identifier: str
    snapshot_id: int
    query_id: str
    batch_id: int
    range: BatchRange

    @property
    def batch(self) -> tuple[str, int]:
        return self.query_id, self.batch_id


def _newest_of_topic(spark: SparkSession, identifier: str, topic: str, cluster: str, having: str) -> Any:
    """The newest snapshot in `identifier`'s current history whose summary records `topic` read from
    `cluster` and the property `having` (snapshot_id, summary); None when there is none."""
    rows = spark.sql(
        f"""
        SELECT s.snapshot_id, s.summary FROM {identifier}.snapshots s
        JOIN {identifier}.history h ON s.snapshot_id = h.snapshot_id
        WHERE h.is_current_ancestor AND s.summary['{having}'] IS NOT NULL
          AND s.summary['{TOPIC}'] = {_sql_string(topic)} AND s.summary['{CLUSTER}'] = {_sql_string(cluster)}
        ORDER BY h.made_current_at DESC, s.committed_at DESC
        LIMIT 1
        """
    ).collect()
    return rows[0] if rows else None


def newest_recorded(spark: SparkSession, identifier: str, topic: str, cluster: str) -> Recorded | None:
    """The newest snapshot in `identifier`'s current history that records a position of `topic` read from
    `cluster`; None when there is none."""
    row = _newest_of_topic(spark, identifier, topic, cluster, NEXT_OFFSETS)
    if row is None:
        return None
    summary = dict(row.summary)
    recorded = BatchRange.recorded(summary, topic, cluster)
    assert recorded is not None, "selected for its position"
    return Recorded(
        identifier=identifier,
        snapshot_id=int(row.snapshot_id),
        query_id=summary[QUERY_ID],
        batch_id=int(summary[BATCH_ID]),
        range=recorded,
    )


def recorded_topic_id(spark: SparkSession, identifier: str, topic: str, cluster: str) -> str | None:
    """The Kafka topic id of the newest commit in `identifier`'s current history that records one for
    `topic` read from `cluster`; None when none does."""
    row = _newest_of_topic(spark, identifier, topic, cluster, TOPIC_ID)
    return None if row is None else str(row.summary[TOPIC_ID])


def recorded_topics(spark: SparkSession, identifier: str) -> set[str]:
    """The topics the commits of `identifier`'s current history record rows of."""
    rows = spark.sql(
        f"""
        SELECT DISTINCT s.summary['{TOPIC}'] AS topic FROM {identifier}.snapshots s
        JOIN {identifier}.history h ON s.snapshot_id = h.snapshot_id
        WHERE h.is_current_ancestor AND s.summary['{TOPIC}'] IS NOT NULL
        """
    ).collect()
    return {str(row.topic) for row in rows}


def _per_partition(offsets: dict[str, int]) -> dict[int, int]:
    return {int(partition): int(offset) for partition, offset in offsets.items()}


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def resume_offsets(recorded: list[Recorded], partitions: list[int]) -> dict[int, int]:
    """Where a router without a checkpoint starts: per partition, the furthest position any table recorded;
    `EARLIEST` for a partition none did (a partition added since)."""
    offsets = dict.fromkeys(partitions, EARLIEST)
    for position in recorded:
        for partition, offset in position.range.end.items():
            offsets[partition] = max(offsets.get(partition, EARLIEST), offset)
    return offsets


def _logged_batches(spark: SparkSession, location: str, log: str) -> list[int]:
    """The batch ids in one of the query's checkpoint logs (`offsets`, `commits`)."""
    jvm = spark._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(f"{location.rstrip('/')}/{log}")
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(path):
        return []
    return [int(name) for status in fs.listStatus(path) if (name := status.getPath().getName()).isdigit()]


def checkpoint_has_batches(spark: SparkSession, location: str) -> bool:
    """Whether the query's checkpoint holds an offset log: Spark then resumes from it."""
    return bool(_logged_batches(spark, location, "offsets"))


def last_committed_batch(spark: SparkSession, location: str) -> int | None:
    """The newest batch the query's checkpoint records as committed; None before its first."""
    return max(_logged_batches(spark, location, "commits"), default=None)
