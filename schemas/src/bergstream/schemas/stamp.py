"""The `__metadata__` struct stamped on every archived and dead-lettered row, and the archive row itself."""

from __future__ import annotations

from pyspark import SparkContext
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.classic.column import Column as JvmColumn

from bergstream.schemas.archive import INGESTION_TS, METADATA, METADATA_TYPE, SCHEMA_ID, ArchiveLayout
from bergstream.schemas.parse import EVENT

_TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}
_WRITE_TIME = "io.bergstream.schemas.WriteTime"


def write_time() -> Column:
    """The time the query that writes a row started: `current_timestamp()`, one value per micro-batch.

    Spark folds `current_timestamp()` into a literal per query, and a literal timestamp is written into
    the text of the generated code: every micro-batch would compile its projection anew and run it
    interpreted until the JIT caught up, which costs a batch of a few thousand records more than the
    records themselves. Its digits as a binary literal are held by the generated code as a reference
    instead, and read back by a function of bergstream's jar (`WriteTime`, in schemas/jvm) that Spark
    compiles into the projection: the code is the same from batch to batch. (`reflect` kept the literal
    out too, but Spark cannot generate code for it, so the projection that parses each record ran apart
    from the rest of the batch's generated code: bench/router/breakdown.)
    """
    context = SparkContext._active_spark_context
    assert context is not None and context._jvm is not None
    digits = F.unix_micros(F.current_timestamp()).cast("string").cast("binary")
    assert isinstance(digits, JvmColumn)
    micros = JvmColumn(getattr(context._jvm, _WRITE_TIME).column(digits._jc))
    return F.timestamp_micros(micros)


def metadata(cluster: str, schema_id: Column | None = None) -> Column:
    """Built from the columns of Spark's Kafka source, read with includeHeaders; `schema_id` is the
    value's schema id in a schema registry (Parser.schema_id)."""
    timestamp_type = F.lit(None).cast("string")
    for code, name in _TIMESTAMP_TYPES.items():
        timestamp_type = F.when(F.col("timestampType") == code, name).otherwise(timestamp_type)
    headers_type = METADATA_TYPE[METADATA_TYPE.fieldNames().index("headers")].dataType
    return F.struct(
        F.col("timestamp").alias(INGESTION_TS),
        F.col("topic").alias("topic"),
        F.col("partition").alias("partition"),
        F.col("offset").alias("offset"),
        F.col("key").alias("key"),
        F.col("headers").cast(headers_type).alias("headers"),
        timestamp_type.alias("timestamp_type"),
        F.lit(cluster).alias("cluster"),
        write_time().alias("router_write_ts"),
        (schema_id if schema_id is not None else F.lit(None).cast("int")).alias(SCHEMA_ID),
    ).alias(METADATA)


def archive_columns(layout: ArchiveLayout) -> list[Column]:
    """An archive row from a parsed and stamped record: the event's fields, then `__metadata__`."""
    return [*[F.col(f"{EVENT}.{f.name}").alias(f.name) for f in layout.event_type.fields], F.col(METADATA)]
