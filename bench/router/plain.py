"""(d) the Spark job a user would write by hand instead of the router, and the table layout it shares
with (e): the event's fields and the Kafka record timestamp, partitioned by the hour of that timestamp.

No dead letters, no metadata struct, no counts, no sort: decode the value with the topic's schema, keep
the timestamp beside it, append to Iceberg on the router's trigger.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.avro.functions import from_avro

from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.event_schema import load_event_schema
from bergstream.schemas.spark_types import ddl_columns, optional

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

# The Kafka source's record timestamp, kept as a column of its own.
TIMESTAMP = "timestamp"


def plain_columns(schema_name: str) -> T.StructType:
    """The event's fields, all optional (what from_json yields), and the Kafka timestamp."""
    event_type = optional(ArchiveLayout(load_event_schema(schema_name), schema_name).event_type)
    assert isinstance(event_type, T.StructType)
    return T.StructType([*event_type.fields, T.StructField(TIMESTAMP, T.TimestampType())])


def create_plain_table(spark: SparkSession, identifier: str, schema_name: str) -> None:
    """The table of (d) and (e), with Iceberg's default properties, partitioned by hours(timestamp)."""
    spark.sql(
        f"CREATE TABLE {identifier} (\n  {ddl_columns(plain_columns(schema_name))}\n) USING iceberg\n"
        f"PARTITIONED BY (hours(`{TIMESTAMP}`))"
    )


def decoded(records: DataFrame, schema_name: str, encoding: Literal["json", "avro"]) -> DataFrame:
    """The Kafka source's rows as the event's fields and the record timestamp."""
    event_schema = load_event_schema(schema_name)
    if encoding == "avro":
        event = from_avro(F.col("value"), event_schema.avro_json)
    else:
        event_type = ArchiveLayout(event_schema, schema_name).event_type
        event = F.from_json(F.col("value").cast("string"), event_type)
    return records.select(event.alias("event"), F.col(TIMESTAMP)).select("event.*", TIMESTAMP)


def start_plain_job(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    schema_name: str,
    encoding: Literal["json", "avro"],
    identifier: str,
    checkpoint: Path,
    max_offsets_per_trigger: int,
    trigger_interval: str | None,
) -> StreamingQuery:
    """Start the job on `topic` into the table `identifier`: availableNow when `trigger_interval` is None."""
    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
        .load()
    )
    writer = (
        decoded(records, schema_name, encoding)
        .writeStream.format("iceberg")
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        # Iceberg's documented setting for a streaming append to a partitioned table: no sort by partition.
        .option("fanout-enabled", "true")
    )
    if trigger_interval is None:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=trigger_interval)
    return writer.toTable(identifier)
