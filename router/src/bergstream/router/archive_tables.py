"""A topic's archive table and dead-letter table as the router needs them before its query starts:
created, described, bounded in their metadata, and evolved to the event's schema."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from bergstream.errors import ConfigError
from bergstream.router.config import RouterConfig
from bergstream.router.evolve import evolve_metadata, evolve_table
from bergstream.router.recorded_positions import RecordedHistory, recorded_history
from bergstream.router.schedule import warn_of_long_history
from bergstream.router.table import ensure_tables, maintained_properties
from bergstream.router.write import BatchTableWriter
from bergstream.schemas.archive import (
    ENCODING_PROPERTIES,
    ENCODING_PROPERTY,
    SCHEMA_PROPERTY,
    SCHEMA_REGISTRY_PROPERTY,
    SUBJECT_PROPERTY,
    TOPIC_PROPERTY,
    ArchiveLayout,
)


class ArchiveTables:
    """Sets up the topic's two tables and hands out their writers for a query."""

    def __init__(self, spark: SparkSession, config: RouterConfig) -> None:
        self.spark = spark
        self.config = config

    def prepare(self, layout: ArchiveLayout) -> dict[str, RecordedHistory]:
        """Create the tables, or bring their properties and schemas in line with the settings; their recorded
        histories as they are now, read once for every check at start (router/identity.py's too)."""
        config, settings = self.config, self.config.settings
        # What the table holds, for the backfill and the replay to read without the topic's settings.
        described = {
            TOPIC_PROPERTY: settings.topic,
            SCHEMA_PROPERTY: settings.schema_name,
            ENCODING_PROPERTY: settings.encoding,
        }
        if settings.schema_registry is not None and settings.subject is not None:
            described[SCHEMA_REGISTRY_PROPERTY] = settings.schema_registry.url
            described[SUBJECT_PROPERTY] = settings.subject
        properties = {**described, **ENCODING_PROPERTIES, **maintained_properties(config)}
        ensure_tables(self.spark, config.query.catalog, layout, settings.target_file_size_bytes, properties)
        histories = {}
        for table in (layout.table, layout.dead_letter_table):
            identifier = config.query.catalog.table_identifier(table)
            histories[identifier] = recorded_history(self.spark, identifier)
            others = sorted(histories[identifier].topics - {settings.topic})
            if others:
                raise ConfigError(
                    f"table {identifier} holds records of topic {', '.join(others)}, written by another "
                    f"router, and not of {settings.topic} alone: one table holds one topic. Give topic "
                    f"{settings.topic} a table of its own (`table:` in its settings file)"
                )
        warn_of_long_history(config)
        self.evolve(layout)
        evolve_metadata(self.spark, config.query.catalog.table_identifier(layout.dead_letter_table))
        return histories

    def evolve(self, layout: ArchiveLayout) -> None:
        """Add the columns of a newer event schema to the archive table."""
        evolve_table(self.spark, self.config.query.catalog.table_identifier(layout.table), layout)

    def columns(self, layout: ArchiveLayout) -> tuple[T.StructType, T.StructType]:
        """The archive table's columns and the dead-letter table's, as they are now: a table made by other
        hands, or evolved since, may hold them in another order than the rows are made in."""
        catalog = self.config.query.catalog
        tables = (layout.table, layout.dead_letter_table)
        schemas = [self.spark.table(catalog.table_identifier(table)).schema for table in tables]
        return schemas[0], schemas[1]

    def writers(self, layout: ArchiveLayout, query_id: str) -> tuple[BatchTableWriter, BatchTableWriter]:
        """The archive table's writer and the dead-letter table's, each idempotent per (query, batch)."""
        catalog = self.config.query.catalog
        return (
            BatchTableWriter(self.spark, catalog.table_identifier(layout.table), query_id),
            BatchTableWriter(self.spark, catalog.table_identifier(layout.dead_letter_table), query_id),
        )
