"""Where the archive ends: the Kafka position each router commit covers, kept in its Iceberg snapshot summary.

Every append of the router, to the archive table and to the dead-letter table, records beside the query
and batch ids the topic, the cluster it was read from, and the micro-batch's range as Spark's offset log
has it: the offset each partition started at (`bergstream.kafka.batch-start`, or `earliest` for a first
batch that started there) and the next offset of every partition after it (`bergstream.kafka.next-offsets`,
partitions without a record in the batch included). Every offset below the next offsets is in the archive
table, or is a dead letter: in the dead-letter table, or about to be, since that commit follows the
archive's. Iceberg's Kafka Connect sink keeps its offsets in its snapshots the same way.

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
from typing import TYPE_CHECKING

from bergstream.router.write import BATCH_ID, QUERY_ID

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("bergstream.router")

TOPIC = "bergstream.kafka.topic"
CLUSTER = "bergstream.kafka.cluster"
BATCH_START = "bergstream.kafka.batch-start"
NEXT_OFFSETS = "bergstream.kafka.next-offsets"
# Spark's startingOffsets for a partition that has no recorded position.
EARLIEST = -2


@dataclass(frozen=True)
class BatchRange:
    """A micro-batch's offsets: where each partition started (or `earliest`), and the next offset after it."""

    start: dict[int, int] | str
    end: dict[int, int]

    def properties(self, topic: str, cluster: str) -> dict[str, str]:
        """The snapshot properties that record the range."""
        start = self.start if isinstance(self.start, str) else _offsets_json(self.start)
        return {TOPIC: topic, CLUSTER: cluster, BATCH_START: start, NEXT_OFFSETS: _offsets_json(self.end)}

    def starting_offsets(self, topic: str) -> str:
        """The range's start as Spark's Kafka source takes it."""
        return self.start if isinstance(self.start, str) else json.dumps({topic: _keyed(self.start)})


def batch_range(query: StreamingQuery, batch_id: int, topic: str, starting: str) -> BatchRange:
    """Batch `batch_id`'s range, from the query's offset log (written before the batch runs); `starting`
    is the query's startingOffsets, the start of its first batch."""
    end = _logged_offsets(query, batch_id, topic)
    if end is None:
        raise RuntimeError(f"{topic}: batch {batch_id} is not in the query's offset log")
    start: dict[int, int] | str | None = _logged_offsets(query, batch_id - 1, topic) if batch_id else None
    if start is None:
        start = _parse_starting(starting, topic)
    return BatchRange(start, end)


def _logged_offsets(query: StreamingQuery, batch_id: int, topic: str) -> dict[int, int] | None:
    logged = query._jsq.streamingQuery().offsetLog().get(batch_id)
    if not logged.isDefined():
        return None
    offset = logged.get().offsets().apply(0)
    if not offset.isDefined():
        return None
    return _parse_offsets(json.loads(offset.get().json()).get(topic, {}))


def _parse_starting(starting: str, topic: str) -> dict[int, int] | str:
    try:
        parsed = json.loads(starting)
    except ValueError:
        return starting  # earliest, latest
    return _parse_offsets(parsed.get(topic, {})) if isinstance(parsed, dict) else starting


def _parse_offsets(offsets: dict[str, int]) -> dict[int, int]:
    return {int(partition): int(offset) for partition, offset in offsets.items()}


def _keyed(offsets: dict[int, int]) -> dict[str, int]:
    return {str(partition): offset for partition, offset in sorted(offsets.items())}


def _offsets_json(offsets: dict[int, int]) -> str:
    return json.dumps(_keyed(offsets), separators=(",", ":"))


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


def newest_recorded(spark: SparkSession, identifier: str, topic: str, cluster: str) -> Recorded | None:
    """The newest snapshot in `identifier`'s current history that records a position of `topic` read from
    `cluster`; None when there is none."""
    rows = spark.sql(
        f"""
        SELECT s.snapshot_id, s.summary FROM {identifier}.snapshots s
        JOIN {identifier}.history h ON s.snapshot_id = h.snapshot_id
        WHERE h.is_current_ancestor AND s.summary['{NEXT_OFFSETS}'] IS NOT NULL
          AND s.summary['{TOPIC}'] = {_sql_string(topic)} AND s.summary['{CLUSTER}'] = {_sql_string(cluster)}
        ORDER BY h.made_current_at DESC, s.committed_at DESC
        LIMIT 1
        """
    ).collect()
    if not rows:
        return None
    summary = dict(rows[0].summary)
    start_text = summary[BATCH_START]
    start: dict[int, int] | str = (
        _parse_offsets(json.loads(start_text)) if start_text.startswith("{") else start_text
    )
    return Recorded(
        identifier=identifier,
        snapshot_id=int(rows[0].snapshot_id),
        query_id=summary[QUERY_ID],
        batch_id=int(summary[BATCH_ID]),
        range=BatchRange(start, _parse_offsets(json.loads(summary[NEXT_OFFSETS]))),
    )


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


def checkpoint_has_batches(spark: SparkSession, location: str) -> bool:
    """Whether the query's checkpoint holds an offset log: Spark then resumes from it."""
    jvm = spark._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(location.rstrip("/") + "/offsets")
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(path):
        return False
    return any(status.getPath().getName().isdigit() for status in fs.listStatus(path))
