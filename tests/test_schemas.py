from typing import Any

import pytest
from pyspark.sql import types as T

from bergstream.errors import ConfigError
from bergstream.schemas import ArchiveLayout, load_event_schema
from bergstream.schemas.archive import METADATA, TABLE_PROPERTIES
from bergstream.schemas.event_schema import available_schemas
from bergstream.schemas.spark_types import avro_to_spark, ddl_type


def test_both_topics_have_a_schema() -> None:
    assert {"playback", "impression"} <= set(available_schemas())


def test_unknown_schema_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"no event schema named 'clicks'.*impression, playback"):
        load_event_schema("clicks")


@pytest.mark.parametrize(
    ("avro", "spark", "nullable"),
    [
        ("long", T.LongType(), False),
        (["null", "int"], T.IntegerType(), True),
        ({"type": "long", "logicalType": "timestamp-millis"}, T.TimestampType(), False),
        ({"type": "enum", "name": "E", "symbols": ["A"]}, T.StringType(), False),
        ({"type": "array", "items": "string"}, T.ArrayType(T.StringType(), False), False),
        (
            {"type": "map", "values": ["null", "double"]},
            T.MapType(T.StringType(), T.DoubleType(), True),
            False,
        ),
        (
            {"type": "record", "name": "R", "fields": [{"name": "a", "type": "bytes"}]},
            T.StructType([T.StructField("a", T.BinaryType(), False)]),
            False,
        ),
    ],
)
def test_avro_types_map_to_spark(avro: Any, spark: T.DataType, nullable: bool) -> None:
    assert avro_to_spark(avro) == (spark, nullable)


def test_unsupported_union_is_refused_with_the_field_path() -> None:
    with pytest.raises(ConfigError, match=r"field device\.os"):
        avro_to_spark(["null", "int", "string"], "device.os")


def test_ddl_type_renders_nested_nullability() -> None:
    nested = T.StructType([T.StructField("a", T.LongType(), False), T.StructField("b", T.StringType())])
    assert ddl_type(T.ArrayType(nested)) == "ARRAY<STRUCT<`a`: BIGINT NOT NULL, `b`: STRING>>"


def test_archive_table_layout() -> None:
    layout = ArchiveLayout(load_event_schema("playback"), table="playback")
    columns = layout.table_type
    assert columns.fieldNames()[-1] == METADATA
    assert all(f.nullable for f in columns.fields), (
        "archive columns are optional; the parser enforces the schema"
    )
    assert columns["event_ts"].dataType == T.TimestampType()
    assert layout.event_type["account_id"].nullable is False
    create, order = layout.create_statements("c.archive.playback")
    assert "PARTITIONED BY (hours(`__metadata__`.`kafka_ingestion_ts`))" in create
    assert "'write.parquet.compression-codec' = 'zstd'" in create
    assert (
        order == "ALTER TABLE c.archive.playback WRITE LOCALLY ORDERED BY `__metadata__`.`kafka_ingestion_ts`"
    )
    assert TABLE_PROPERTIES["write.metadata.metrics.column.__metadata__.kafka_ingestion_ts"] == "full"
    assert int(TABLE_PROPERTIES["write.parquet.row-group-size-bytes"]) < 128 * 1024 * 1024
    assert layout.dead_letter_table == "playback__dlq"
