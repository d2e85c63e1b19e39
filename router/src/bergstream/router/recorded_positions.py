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
from dataclasses import dataclass
from typing import TYPE_CHECKING

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


@dataclass(frozen=True)
class RecordedHistory:
    """What the router's commits record in a table's current history, read in one walk of its metadata
    (RecordedHistory, router/jvm), newest snapshot first: the topics they name, and per summary key, topic
    and cluster the newest snapshot whose summary has that key (snapshot_id, summary)."""

    topics: frozenset[str]
    newest: dict[tuple[str, str, str], tuple[int, dict[str, str]]]

    def newest_of(self, key: str, topic: str, cluster: str) -> tuple[int, dict[str, str]] | None:
        return self.newest.get((key, topic, cluster))


def recorded_history(spark: SparkSession, identifier: str) -> RecordedHistory:
    """The current history of table `identifier` as the router's commits record it; the table as it is now
    (Iceberg's metadata read again, not a catalog's cached copy)."""
    jvm = spark._jvm
    assert jvm is not None
    keys = spark.sparkContext._gateway.new_array(jvm.java.lang.String, 2)  # type: ignore[union-attr]
    keys[0], keys[1] = NEXT_OFFSETS, TOPIC_ID
    answer = json.loads(jvm.io.bergstream.router.RecordedHistory.of(spark._jsparkSession, identifier, TOPIC,
                                                                     CLUSTER, keys))  # fmt: skip
    newest = {
        (entry["key"], entry["topic"], entry["cluster"]): (int(entry["snapshot_id"]), dict(entry["summary"]))
        for entry in answer["newest"]
    }
    return RecordedHistory(frozenset(answer["topics"]), newest)


def newest_recorded(spark: SparkSession, identifier: str, topic: str, cluster: str) -> Recorded | None:
    """The newest snapshot in `identifier`'s current history that records a position of `topic` read from
    `cluster`; None when there is none."""
    newest = recorded_history(spark, identifier).newest_of(NEXT_OFFSETS, topic, cluster)
    if newest is None:
        return None
    snapshot_id, summary = newest
    recorded = BatchRange.recorded(summary, topic, cluster)
    assert recorded is not None, "selected for its position"
    return Recorded(
        identifier=identifier,
        snapshot_id=snapshot_id,
        query_id=summary[QUERY_ID],
        batch_id=int(summary[BATCH_ID]),
        range=recorded,
    )


def resume_offsets(recorded: list[Recorded], partitions: list[int]) -> dict[int, int]:
    """Where a router without a checkpoint starts: per partition, the furthest position any table recorded;
    `EARLIEST` for a partition none did (a partition added since)."""
    offsets = dict.fromkeys(partitions, EARLIEST)
    for position in recorded:
        for partition, offset in position.range.end.items():
            offsets[partition] = max(offsets.get(partition, EARLIEST), offset)
    return offsets
