"""Creating a topic's archive table and its dead-letter table in the catalog."""

from __future__ import annotations

from pyspark.sql import SparkSession

from bergstream.catalog import CatalogConfig
from schemas.archive import ArchiveLayout

TARGET_FILE_SIZE = "write.target-file-size-bytes"


def ensure_tables(
    spark: SparkSession,
    catalog: CatalogConfig,
    layout: ArchiveLayout,
    target_file_size_bytes: int | None = None,
    properties: dict[str, str] | None = None,
) -> None:
    """Create the tables the first time; afterwards only bring the target file size and the other
    `properties` in line."""
    wanted = dict(properties or {})
    if target_file_size_bytes is not None:
        wanted[TARGET_FILE_SIZE] = str(target_file_size_bytes)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog.name}.{catalog.namespace}")
    for table, statements in (
        (layout.table, layout.create_statements),
        (layout.dead_letter_table, layout.dead_letter_create_statements),
    ):
        identifier = catalog.table_identifier(table)
        if not spark.catalog.tableExists(identifier):
            for statement in statements(identifier):
                spark.sql(statement)
        current = {row.key: row.value for row in spark.sql(f"SHOW TBLPROPERTIES {identifier}").collect()}
        changed = {key: value for key, value in wanted.items() if current.get(key) != value}
        if changed:
            settings = ", ".join(f"'{key}' = '{value}'" for key, value in changed.items())
            spark.sql(f"ALTER TABLE {identifier} SET TBLPROPERTIES ({settings})")
