"""Creating a topic's archive table and its dead-letter table in the catalog, and the properties that keep
their commits cheap.

A router on a short trigger commits every few seconds. Each commit writes a new metadata file listing every
retained snapshot and the log of earlier metadata files, and a manifest list naming every manifest: without
bounds all three grow with the table's age, and so does the time a commit takes (bench/commits).
"""

from __future__ import annotations

import threading

from pyspark.sql import SparkSession

from bergstream.catalog import CatalogConfig
from bergstream.errors import ConfigError
from bergstream.router.config import RouterConfig
from bergstream.schemas.archive import TOPIC_PROPERTY, ArchiveLayout

TARGET_FILE_SIZE = "write.target-file-size-bytes"
# Metadata files beyond the newest `PREVIOUS_METADATA_VERSIONS` are deleted by the commit that supersedes
# them: the metadata log stays short, and the metadata folder does not keep one file per commit forever.
PREVIOUS_METADATA_VERSIONS = 100
# Spark's append is Iceberg's merge append: once a snapshot has this many small manifests, the commit merges
# them into manifests of up to the target size, so that a snapshot names a bounded number of manifests.
MANIFESTS_TO_MERGE = 100
MANIFEST_TARGET_BYTES = 8 * 1024 * 1024
_NAMESPACES = threading.Lock()


def maintained_properties(config: RouterConfig) -> dict[str, str]:
    """The table properties that bound metadata, manifests and snapshots. Snapshot retention is the one
    `router maintain` applies: any engine expiring snapshots with the table's defaults keeps as much."""
    return {
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": str(PREVIOUS_METADATA_VERSIONS),
        "commit.manifest-merge.enabled": "true",
        "commit.manifest.min-count-to-merge": str(MANIFESTS_TO_MERGE),
        "commit.manifest.target-size-bytes": str(MANIFEST_TARGET_BYTES),
        "history.expire.max-snapshot-age-ms": str(round(config.snapshot_retention_hours * 3_600_000)),
        "history.expire.min-snapshots-to-keep": str(config.settings.maintenance.retain_last_snapshots),
    }


def ensure_namespace(spark: SparkSession, catalog: CatalogConfig) -> None:
    """Make the catalog's namespace if it is missing. The queries of a driver start side by side: one at a
    time here. Another process making it at the same moment fails the JDBC catalog's insert; the namespace
    is there then, and that is all that is asked."""
    name = f"{catalog.name}.{catalog.namespace}"
    with _NAMESPACES:
        try:
            spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {name}")
        except Exception:
            if not spark.sql(f"SHOW NAMESPACES IN {catalog.name} LIKE '{catalog.namespace}'").collect():
                raise


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
    ensure_namespace(spark, catalog)
    for table, statements in (
        (layout.table, layout.create_statements),
        (layout.dead_letter_table, layout.dead_letter_create_statements),
    ):
        identifier = catalog.table_identifier(table)
        if not spark.catalog.tableExists(identifier):
            # Made with every property wanted, so that nothing is to be brought in line below, unless another
            # process made it first (read back, and checked, all the same).
            for statement in statements(identifier, wanted):
                spark.sql(statement)
        current = {row.key: row.value for row in spark.sql(f"SHOW TBLPROPERTIES {identifier}").collect()}
        archived = current.get(TOPIC_PROPERTY)
        if TOPIC_PROPERTY in wanted and archived is not None and archived != wanted[TOPIC_PROPERTY]:
            raise ConfigError(
                f"table {identifier} archives topic {archived} (its property {TOPIC_PROPERTY}), not "
                f"{wanted[TOPIC_PROPERTY]}: one table holds one topic, so that a backfill or a bootstrap of "
                f"either reads its own records alone. Give topic {wanted[TOPIC_PROPERTY]} a table of its own "
                f"(`table:` in its settings file)"
            )
        changed = {key: value for key, value in wanted.items() if current.get(key) != value}
        if changed:
            settings = ", ".join(f"'{key}' = '{value}'" for key, value in changed.items())
            spark.sql(f"ALTER TABLE {identifier} SET TBLPROPERTIES ({settings})")
