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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bergstream.router.write import BATCH_ID, QUERY_ID
from bergstream.schemas.batch_range import (
    CLUSTER,
    EARLIEST,
    NEXT_OFFSETS,
    TOPIC,
    TOPIC_ID,
    BatchRange,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
