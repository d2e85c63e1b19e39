"""What a micro-batch read, counted in the same pass that writes it.

The counts ride along with the archive append as a Spark observation: no second pass over the batch,
no cached copy of it. Counts per Kafka partition need the partitions up front; the topic's partitions
are known from Kafka's metadata, and records from a partition added since are counted apart, so that
the batch can be counted again the slow way instead of losing them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.parse import ERROR

_READ, _ARCHIVED, _NEWEST, _OTHER = "read", "archived", "newest", "other_partitions"


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
    # Records from partitions that the observation was not told about.
    other_partitions: int = 0

    @property
    def dead_lettered(self) -> int:
        return self.read - self.archived


def observed_columns(partitions: list[int]) -> list[Column]:
    """Aggregates for `DataFrame.observe` over a stamped batch: totals and, per partition, count and range."""
    partition, offset = F.col("partition"), F.col("offset")
    columns = [
        F.count(F.lit(1)).alias(_READ),
        F.count(F.when(F.col(ERROR).isNull(), 1)).alias(_ARCHIVED),
        F.max("timestamp").alias(_NEWEST),
        F.count(F.when(~partition.isin(partitions), 1)).alias(_OTHER),
    ]
    for p in partitions:
        mine = partition == p
        columns += [
            F.count(F.when(mine, 1)).alias(f"read_{p}"),
            F.min(F.when(mine, offset)).alias(f"first_{p}"),
            F.max(F.when(mine, offset)).alias(f"last_{p}"),
        ]
    return columns


def from_observation(metrics: dict[str, Any], partitions: list[int]) -> BatchCounts:
    return BatchCounts(
        read=int(metrics[_READ]),
        archived=int(metrics[_ARCHIVED]),
        newest=metrics[_NEWEST],
        partitions=tuple(
            PartitionRead(p, int(metrics[f"read_{p}"]), metrics[f"first_{p}"], metrics[f"last_{p}"])
            for p in partitions
            if metrics[f"read_{p}"]
        ),
        other_partitions=int(metrics[_OTHER]),
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
