"""Creating a topic's archive table and its dead-letter table in the catalog."""

from __future__ import annotations

from pyspark.sql import SparkSession

from bergstream.catalog import CatalogConfig
from schemas.archive import ArchiveLayout


def ensure_tables(spark: SparkSession, catalog: CatalogConfig, layout: ArchiveLayout) -> None:
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog.name}.{catalog.namespace}")
    for statement in layout.create_statements(catalog.table_identifier(layout.table)):
        spark.sql(statement)
    for statement in layout.dead_letter_create_statements(catalog.table_identifier(layout.dead_letter_table)):
        spark.sql(statement)
