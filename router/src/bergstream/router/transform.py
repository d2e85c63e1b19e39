"""From Kafka records to archive rows and dead-letter rows; the same for a batch and a micro-batch."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from bergstream.schemas.archive import METADATA, REDRIVE_ID, REDRIVEN_AT, ArchiveLayout
from bergstream.schemas.event_schema import Encoding
from bergstream.schemas.parse import ERROR, Parser, WireSchemas, explain
from bergstream.schemas.stamp import archive_columns, metadata

DEAD_LETTERED = "dead_lettered"


class RecordSplitter:
    """A topic's expressions from Kafka records to archive and dead-letter rows, built once (and again
    when a schema registry has new versions of the topic's schema: `RegistryTopic`).

    `stamp` is also the parse of a dead letter's raw bytes, given as the Kafka source's columns (`value`,
    `key`, `topic`, ...); `reason` is then the final error text of a row that still does not parse."""

    def __init__(
        self,
        layout: ArchiveLayout,
        encoding: Encoding,
        cluster: str,
        max_value_bytes: int | None = None,
        wire_schemas: WireSchemas | None = None,
    ) -> None:
        self.layout = layout
        self.parser = Parser(layout, encoding, max_value_bytes, wire_schemas)
        self.metadata = metadata(cluster, self.parser.schema_id)
        self.valid = F.col(ERROR).isNull()
        self.reason = explain(layout, encoding, wire_schemas)
        self.archive_columns = archive_columns(layout)
        self.dead_letter_columns = [
            F.col("key").alias("raw_key"),
            F.col("value").alias("raw_value"),
            self.reason.alias("error"),
            F.lit(layout.event.name).alias("schema_name"),
            F.col(METADATA),
        ]

    def stamp(self, records: DataFrame) -> DataFrame:
        """Kafka records with `event`, `error` and `__metadata__` added."""
        return self.parser.parse(records, self.metadata)

    # Both kinds of rows are observed before they are filtered. Besides counting in the same pass, the
    # observation keeps Spark from pushing the filter on `error` below the projection that parses:
    # there it would parse each value again for every check the error expression makes.

    def archive_rows(self, stamped: DataFrame, observation: Observation, metrics: list[Column]) -> DataFrame:
        """The valid rows, as archive rows; `observation` gets `metrics` over every stamped row."""
        return stamped.observe(observation, *metrics).where(self.valid).select(*self.archive_columns)

    def dead_letter_rows(self, stamped: DataFrame, observation: Observation) -> DataFrame:
        """The invalid rows, as dead-letter rows; `observation` gets their number, as DEAD_LETTERED."""
        counted = stamped.observe(observation, F.count(F.when(~self.valid, 1)).alias(DEAD_LETTERED))
        return counted.where(~self.valid).select(*self.dead_letter_columns)

    def combined_rows(self, stamped: DataFrame) -> DataFrame:
        """Each stamped record as one of two structs: `a`, its archive row, when it parsed, else `d`, its
        dead letter, with every column of the dead-letter table; for a write of both tables in one pass
        (router/together.py)."""
        dead_letter = F.struct(
            *self.dead_letter_columns,
            F.lit(None).cast("timestamp").alias(REDRIVEN_AT),
            F.lit(None).cast("string").alias(REDRIVE_ID),
        )
        return stamped.select(
            F.when(self.valid, F.struct(*self.archive_columns)).alias("a"),
            F.when(~self.valid, dead_letter).alias("d"),
        )
