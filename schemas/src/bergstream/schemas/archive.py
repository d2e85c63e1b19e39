"""The archive table's layout: the one place that knows its columns, partitioning, order and properties.

An archive table holds a topic's events, typed from the topic's schema, beside a `__metadata__` struct
that says where each came from in Kafka. Every column is optional in the table: the parser, not the
table, decides what is valid, and a record it refuses goes to the dead-letter table with its raw bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import types as T

from bergstream.schemas.event_schema import EventSchema
from bergstream.schemas.spark_types import ddl_columns, optional, record_to_struct

METADATA = "__metadata__"
INGESTION_TS = "kafka_ingestion_ts"
INGESTION_TS_COLUMN = f"{METADATA}.{INGESTION_TS}"
DEAD_LETTER_SUFFIX = "__dlq"
SCHEMA_ID = "schema_id"
PARTITION = "partition"
OFFSET = "offset"
WRITE_TS = "router_write_ts"

METADATA_TYPE = T.StructType(
    [
        # The Kafka record timestamp, so that a replay after a failure stamps the same value.
        T.StructField(INGESTION_TS, T.TimestampType()),
        T.StructField("topic", T.StringType()),
        T.StructField(PARTITION, T.IntegerType()),
        T.StructField(OFFSET, T.LongType()),
        T.StructField("key", T.BinaryType()),
        T.StructField(
            "headers",
            T.ArrayType(
                T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])
            ),
        ),
        T.StructField("timestamp_type", T.StringType()),  # CreateTime or LogAppendTime
        T.StructField("cluster", T.StringType()),  # the configured Kafka cluster or region name
        T.StructField(WRITE_TS, T.TimestampType()),
        # The schema registry's id of the value's schema (the wire format's header); null without a registry.
        T.StructField(SCHEMA_ID, T.IntegerType()),
    ]
)

# A backfill that may still read a snapshot of the table (running, or stopped and resumable) holds it from
# expiry with a tag `<BACKFILL_TAG_PREFIX><id>`, and names its checkpoint and application in the table
# property `<BACKFILL_PROPERTY_PREFIX><id>` (JSON); both go once it completes (runtime/pins.py).
# Maintenance reports the snapshots they hold past the retention (router/maintain.py).
BACKFILL_TAG_PREFIX = "bergstream-backfill-"
BACKFILL_PROPERTY_PREFIX = "bergstream.backfill."

# Set on a dead letter once `bergstream router redrive` has put its record into the archive table; null
# while it waits. The router leaves them out of its appends; a redrive adds them to an older table.
REDRIVEN_AT = "redriven_at"
REDRIVE_ID = "redrive_id"

DEAD_LETTER_TYPE = T.StructType(
    [
        T.StructField("raw_key", T.BinaryType()),
        T.StructField("raw_value", T.BinaryType()),
        T.StructField("error", T.StringType()),
        T.StructField("schema_name", T.StringType()),
        T.StructField(METADATA, METADATA_TYPE),
        T.StructField(REDRIVEN_AT, T.TimestampType()),
        T.StructField(REDRIVE_ID, T.StringType()),
    ]
)

# What the router records on both tables of a topic, so that readers of the archive (a backfill replay)
# know where the rows came from and how the topic encodes them.
TOPIC_PROPERTY = "bergstream.topic"
SCHEMA_PROPERTY = "bergstream.schema"
ENCODING_PROPERTY = "bergstream.encoding"
# Set when the topic's values are in a schema registry's wire format: the registry and the subject.
SCHEMA_REGISTRY_PROPERTY = "bergstream.schema-registry.url"
SUBJECT_PROPERTY = "bergstream.schema-registry.subject"

PARTITION_SPEC = f"hours(`{METADATA}`.`{INGESTION_TS}`)"
SORT_ORDER = f"`{METADATA}`.`{INGESTION_TS}`"

OFFSET_COLUMN = f"{METADATA}.{OFFSET}"
# The offsets of a partition are all distinct: Parquet would build a dictionary of them, check it against
# its limit on every value, give up on it, and keep it, larger than the values it stands for
# (bench/router/breakdown: 1.1 bytes and about 0.5 us per event). Set on new tables and on existing ones.
ENCODING_PROPERTIES: dict[str, str] = {f"write.parquet.dict-encoding-enabled.column.{OFFSET_COLUMN}": "false"}

TABLE_PROPERTIES: dict[str, str] = {
    "format-version": "2",
    "write.format.default": "parquet",
    "write.parquet.compression-codec": "zstd",
    "write.metadata.metrics.default": "truncate(16)",
    # Exact bounds on the ingestion time make per-file time ranges tight for the backfill planner.
    f"write.metadata.metrics.column.{INGESTION_TS_COLUMN}": "full",
    "write.spark.fanout.enabled": "true",
    "write.distribution-mode": "none",
    "write.target-file-size-bytes": str(128 * 1024 * 1024),
    # Row groups of a few minutes of a busy topic's ingestion time, where Iceberg's default (128 MiB) makes
    # one row group of a compacted file: a backfill's epoch then reads only its own row groups, in parallel
    # tasks, instead of the whole file on one core. bench/backfill, 4h archive: B = 15m 0.71 x the native
    # scan against 0.48 x, for 8 % more bytes. New tables only: an existing table keeps its own setting.
    "write.parquet.row-group-size-bytes": str(4 * 1024 * 1024),
    **ENCODING_PROPERTIES,
}


@dataclass(frozen=True)
class ArchiveLayout:
    """The archive table of one topic, and its dead-letter table beside it."""

    event: EventSchema
    table: str

    @property
    def dead_letter_table(self) -> str:
        return f"{self.table}{DEAD_LETTER_SUFFIX}"

    @property
    def event_type(self) -> T.StructType:
        """The event as its schema declares it, used to parse JSON and to check required fields."""
        return record_to_struct(self.event.avro)

    @property
    def table_type(self) -> T.StructType:
        event_fields = optional(self.event_type)
        assert isinstance(event_fields, T.StructType)
        return T.StructType([*event_fields.fields, T.StructField(METADATA, METADATA_TYPE)])

    def create_statements(self, identifier: str, properties: Mapping[str, str] | None = None) -> list[str]:
        """Spark SQL that creates the archive table `identifier` when it does not exist yet, with
        `properties` beside the archive's own."""
        return _create_statements(identifier, self.table_type, properties)

    def dead_letter_create_statements(
        self, identifier: str, properties: Mapping[str, str] | None = None
    ) -> list[str]:
        return dead_letter_create_statements(identifier, properties)


def dead_letter_create_statements(identifier: str, properties: Mapping[str, str] | None = None) -> list[str]:
    """Spark SQL that creates the dead-letter table `identifier`: the same for every topic."""
    return _create_statements(identifier, DEAD_LETTER_TYPE, properties)


def _create_statements(
    identifier: str, columns: T.StructType, given: Mapping[str, str] | None = None
) -> list[str]:
    settings = {**TABLE_PROPERTIES, **(given or {})}
    properties = ",\n  ".join(f"'{key}' = '{value}'" for key, value in settings.items())
    return [
        f"CREATE TABLE IF NOT EXISTS {identifier} (\n  {ddl_columns(columns)}\n)\nUSING iceberg\n"
        f"PARTITIONED BY ({PARTITION_SPEC})\nTBLPROPERTIES (\n  {properties}\n)",
        f"ALTER TABLE {identifier} WRITE LOCALLY ORDERED BY {SORT_ORDER}",
    ]
