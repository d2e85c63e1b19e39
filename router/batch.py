"""Archive what a topic holds now, as one Spark batch job: the same parse and stamp as the router."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession

from bergstream.catalog import CatalogConfig
from router.table import ensure_tables
from router.transform import split
from schemas.archive import ArchiveLayout
from schemas.registry import Encoding


@dataclass(frozen=True)
class BatchResult:
    read: int
    archived: int
    dead_lettered: int


def archive_topic(
    spark: SparkSession,
    catalog: CatalogConfig,
    layout: ArchiveLayout,
    bootstrap_servers: str,
    topic: str,
    encoding: Encoding,
    cluster: str = "local",
) -> BatchResult:
    ensure_tables(spark, catalog, layout)
    records = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("includeHeaders", "true")
        .load()
        .cache()
    )
    try:
        archived, dead_letters = split(records, layout, encoding, cluster)
        archived.writeTo(catalog.table_identifier(layout.table)).append()
        dead_letters.writeTo(catalog.table_identifier(layout.dead_letter_table)).append()
        return BatchResult(
            read=records.count(), archived=archived.count(), dead_lettered=dead_letters.count()
        )
    finally:
        records.unpersist()
