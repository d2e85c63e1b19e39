"""From Kafka records to archive rows and dead-letter rows; the same for a batch and a micro-batch."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from pyspark import SparkContext
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from bergstream.schemas.archive import METADATA, REDRIVE_ID, REDRIVEN_AT, ArchiveLayout
from bergstream.schemas.event_schema import Encoding
from bergstream.schemas.parse import ERROR, Parser, explain
from bergstream.schemas.stamp import archive_columns, metadata
from bergstream.schemas.wire import WireSchemas

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
        # What the expressions are made of, for topics to share the splitter (`shared_splitter`) and their
        # plan (router/archiver.py); None with a registry's wire schemas, a topic's own.
        self.made_of = (
            None if wire_schemas is not None else made_of(layout, encoding, cluster, max_value_bytes)
        )
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

    def combined_rows(
        self, stamped: DataFrame, tables: tuple[T.StructType, T.StructType] | None = None
    ) -> DataFrame:
        """Each stamped record as one of two structs: `a`, its archive row, when it parsed, else `d`, its
        dead letter, with every column of the dead-letter table; for a write of both tables in one pass
        (router/together.py). `tables`: the archive table's and the dead-letter table's columns, which
        each row then follows (in_table_order)."""
        archive = F.struct(*self.archive_columns)
        dead_letter = F.struct(
            *self.dead_letter_columns,
            F.lit(None).cast("timestamp").alias(REDRIVEN_AT),
            F.lit(None).cast("string").alias(REDRIVE_ID),
        )
        if tables is not None:
            have = stamped.select(archive.alias("a"), dead_letter.alias("d")).schema
            archive = in_table_order(archive, have["a"].dataType, tables[0])
            dead_letter = in_table_order(dead_letter, have["d"].dataType, tables[1])
        return stamped.select(
            F.when(self.valid, archive).alias("a"),
            F.when(~self.valid, dead_letter).alias("d"),
        )


def made_of(
    layout: ArchiveLayout, encoding: Encoding, cluster: str, max_value_bytes: int | None
) -> tuple[Any, ...]:
    """What a splitter's expressions depend on: not the topic, nor its table."""
    return (layout.event.name, layout.event.avro_json, encoding, cluster, max_value_bytes)


_SPLITTERS: weakref.WeakKeyDictionary[SparkContext, dict[tuple[Any, ...], RecordSplitter]] = (
    weakref.WeakKeyDictionary()
)
_SPLITTERS_LOCK = threading.Lock()


def shared_splitter(
    layout: ArchiveLayout, encoding: Encoding, cluster: str, max_value_bytes: int | None
) -> RecordSplitter:
    """The splitter of every topic made of the same schema, encoding, cluster and value limit, built once
    per Spark context: its expressions are thousands of calls into the JVM, which a driver meeting a
    thousand topics of one schema made a thousand times (half of a restart of 300 topics, bench/topics)."""
    context = SparkContext._active_spark_context
    assert context is not None, "a splitter's expressions need a running Spark context"
    key = made_of(layout, encoding, cluster, max_value_bytes)
    with _SPLITTERS_LOCK:
        splitters = _SPLITTERS.setdefault(context, {})
        if key not in splitters:
            splitters[key] = RecordSplitter(layout, encoding, cluster, max_value_bytes)
        return splitters[key]


def in_table_order(column: Column, have: T.DataType, want: T.DataType) -> Column:
    """`column`, a struct of type `have`, as a row of a table of columns `want`: its fields, nested ones
    too, by name in the table's order, and a column the table has and the row lacks (a field the event
    schema dropped) null. As it is where the orders agree already, where the row holds a field the table
    lacks, and where the table requires a field the row lacks (the writer then refuses it, naming both)."""
    if not isinstance(have, T.StructType) or not isinstance(want, T.StructType) or _same_order(have, want):
        return column
    fields = {field.name: field.dataType for field in have.fields}
    lacking = [field for field in want.fields if field.name not in fields]
    if not set(fields) <= set(want.names) or any(not field.nullable for field in lacking):
        return column
    parts = [
        in_table_order(column.getField(field.name), fields[field.name], field.dataType).alias(field.name)
        if field.name in fields
        else F.lit(None).cast(field.dataType).alias(field.name)
        for field in want.fields
    ]
    return F.when(column.isNotNull(), F.struct(*parts))


def _same_order(have: T.DataType, want: T.DataType) -> bool:
    if isinstance(have, T.StructType) and isinstance(want, T.StructType):
        return have.names == want.names and all(
            _same_order(a.dataType, b.dataType) for a, b in zip(have.fields, want.fields, strict=True)
        )
    return True
