"""What a micro-batch read, counted in the same pass that writes it.

The counts ride along with the archive append as a Spark observation: no second pass over the batch,
no cached copy of it. The count, first offset and last offset per Kafka partition come from one aggregate
of bergstream's own (`PartitionRanges`, in router/jvm), whose cost per record is the same for a topic of
one partition or of a thousand, and which needs no list of the partitions up front.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from bergstream.schemas.parse import ERROR

_READ, _ARCHIVED, _NEWEST, _RANGES = "read", "archived", "newest", "partition_ranges"
_PARTITION_RANGES = "io.bergstream.router.PartitionRanges"


@dataclass(frozen=True)
class PartitionRead:
    partition: int
    read: int
    first: int
    last: int


@dataclass(frozen=True)
class BatchCounts:
    read: int
    archived: int
    newest: datetime | None
    partitions: tuple[PartitionRead, ...]

    @property
    def dead_lettered(self) -> int:
        return self.read - self.archived


def observed_columns(spark: SparkSession) -> list[Column]:
    """Aggregates for `DataFrame.observe` over a stamped batch: totals and the range read per partition.

    Registers the per-partition aggregate with `spark`'s SQL functions (again, if already there)."""
    ranges = getattr(spark._jvm, _PARTITION_RANGES).register(spark._jsparkSession)
    return [
        F.count(F.lit(1)).alias(_READ),
        F.count(F.when(F.col(ERROR).isNull(), 1)).alias(_ARCHIVED),
        F.max("timestamp").alias(_NEWEST),
        F.call_function(ranges, F.col("partition"), F.col("offset")).alias(_RANGES),
    ]


def from_observation(metrics: dict[str, Any]) -> BatchCounts:
    ranges = metrics[_RANGES]
    return BatchCounts(
        read=int(metrics[_READ]),
        archived=int(metrics[_ARCHIVED]),
        newest=metrics[_NEWEST],
        partitions=tuple(
            PartitionRead(int(partition), int(read), int(first), int(last))
            for partition, read, first, last in zip(
                ranges.partitions, ranges.counts, ranges.firsts, ranges.lasts, strict=True
            )
        ),
    )


def count_batch(stamped: DataFrame) -> BatchCounts:
    """The same counts, by an aggregation of their own: one more pass over the batch."""
    rows = (
        stamped.groupBy("partition")
        .agg(
            F.count(F.lit(1)).alias(_READ),
            F.count(F.when(F.col(ERROR).isNull(), 1)).alias(_ARCHIVED),
            F.min("offset").alias("first"),
            F.max("offset").alias("last"),
            F.max("timestamp").alias(_NEWEST),
        )
        .collect()
    )
    newest = [row[_NEWEST] for row in rows if row[_NEWEST] is not None]
    return BatchCounts(
        read=sum(row[_READ] for row in rows),
        archived=sum(row[_ARCHIVED] for row in rows),
        newest=max(newest) if newest else None,
        partitions=tuple(
            PartitionRead(row.partition, row[_READ], row.first, row.last)
            for row in sorted(rows, key=lambda r: r.partition)
        ),
    )
