"""From Kafka records to archive rows and dead-letter rows; the same for a batch and a micro-batch."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from router.parse import ERROR, EVENT, Parser, explain
from router.stamp import metadata
from schemas.archive import METADATA, ArchiveLayout
from schemas.registry import Encoding


class Stamper:
    """A topic's expressions from Kafka records to archive and dead-letter rows, built once."""

    def __init__(
        self,
        layout: ArchiveLayout,
        encoding: Encoding,
        cluster: str,
        max_value_bytes: int | None = None,
        with_headers: bool = True,
    ) -> None:
        self.parser = Parser(layout, encoding, max_value_bytes)
        self.metadata = metadata(cluster, with_headers)
        self.valid = F.col(ERROR).isNull()
        self.archive_columns = [
            *[F.col(f"{EVENT}.{f.name}").alias(f.name) for f in layout.event_type.fields],
            F.col(METADATA),
        ]
        self.dead_letter_columns = [
            F.col("key").alias("raw_key"),
            F.col("value").alias("raw_value"),
            explain(layout, encoding).alias("error"),
            F.lit(layout.event.name).alias("schema_name"),
            F.col(METADATA),
        ]

    def stamp(self, records: DataFrame) -> DataFrame:
        """Kafka records with `event`, `error` and `__metadata__` added."""
        return self.parser.parse(records, self.metadata)

    def archive_rows(self, stamped: DataFrame) -> DataFrame:
        return stamped.where(self.valid).select(*self.archive_columns)

    def dead_letter_rows(self, stamped: DataFrame) -> DataFrame:
        return stamped.where(~self.valid).select(*self.dead_letter_columns)
