"""From Kafka records to archive rows and dead-letter rows; the same for a batch and a micro-batch."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from router.parse import ERROR, EVENT, explain, parse
from router.stamp import metadata
from schemas.archive import METADATA, ArchiveLayout
from schemas.registry import Encoding


def stamp(
    records: DataFrame,
    layout: ArchiveLayout,
    encoding: Encoding,
    cluster: str,
    max_value_bytes: int | None = None,
) -> DataFrame:
    """Kafka records with `event`, `error` and `__metadata__` added."""
    with_headers = "headers" in records.columns
    parsed = parse(records, layout, encoding, max_value_bytes)
    return parsed.withColumn(METADATA, metadata(cluster, with_headers))


def archive_rows(stamped: DataFrame, layout: ArchiveLayout) -> DataFrame:
    return stamped.where(F.col(ERROR).isNull()).select(
        *[F.col(f"{EVENT}.{f.name}").alias(f.name) for f in layout.event_type.fields], F.col(METADATA)
    )


def dead_letter_rows(stamped: DataFrame, layout: ArchiveLayout, encoding: Encoding) -> DataFrame:
    return stamped.where(F.col(ERROR).isNotNull()).select(
        F.col("key").alias("raw_key"),
        F.col("value").alias("raw_value"),
        explain(stamped, layout, encoding).alias("error"),
        F.lit(layout.event.name).alias("schema_name"),
        F.col(METADATA),
    )
