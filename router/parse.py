"""Turning Kafka record values into typed events, or into the reason they cannot be.

A record is valid when its value decodes with the topic's schema, every field has its declared type and
every required field is present. Anything else gets an error text and goes to the dead-letter table.
The reasons are worked out only for the records that fail, so valid records pay for one decode.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.avro.functions import from_avro, to_avro

from schemas.archive import ArchiveLayout
from schemas.registry import Encoding

EVENT = "event"
ERROR = "error"
_CORRUPT = "_corrupt_record"


def parse(records: DataFrame, layout: ArchiveLayout, encoding: Encoding) -> DataFrame:
    """Add `event` (the typed event) and `error` (null when the event is valid) to Kafka records."""
    if encoding == "json":
        return _parse_json(records, layout)
    return _parse_avro(records, layout)


def _required(layout: ArchiveLayout) -> list[str]:
    return [f.name for f in layout.event_type.fields if not f.nullable]


def _first_error(checks: list[tuple[Column, Column]]) -> Column:
    error = F.when(*checks[0])
    for condition, message in checks[1:]:
        error = error.when(condition, message)
    return error


def _missing(layout: ArchiveLayout) -> list[tuple[Column, Column]]:
    return [
        (F.col(EVENT)[name].isNull(), F.lit(f"required field '{name}' is missing or null"))
        for name in _required(layout)
    ]


def _parse_json(records: DataFrame, layout: ArchiveLayout) -> DataFrame:
    parse_type = T.StructType([*layout.event_type.fields, T.StructField(_CORRUPT, T.StringType())])
    text = F.col("value").cast("string")
    variant = F.try_parse_json(text)
    kind = F.regexp_extract(F.schema_of_variant(variant), r"^(\w+)", 1)
    wrong_types = [
        (
            F.try_variant_get(variant, f"$.{field.name}", field.dataType.simpleString()).isNull()
            & ~F.is_variant_null(F.variant_get(variant, f"$.{field.name}", "variant")),
            F.lit(f"field '{field.name}' is not of type {field.dataType.simpleString()}"),
        )
        for field in layout.event_type.fields
    ]
    checks = [
        (F.col("value").isNull(), F.lit("null value")),
        (~F.is_valid_utf8(text), F.lit("value is not valid UTF-8")),
        (F.col(EVENT)[_CORRUPT].isNotNull() & variant.isNull(), F.lit("malformed JSON")),
        (
            F.col(EVENT)[_CORRUPT].isNotNull() & (kind != "OBJECT"),
            F.concat(F.lit("not a JSON object but "), kind),
        ),
        *[(F.col(EVENT)[_CORRUPT].isNotNull() & condition, message) for condition, message in wrong_types],
        (F.col(EVENT)[_CORRUPT].isNotNull(), F.lit(f"not a valid {layout.event.name} event")),
        *_missing(layout),
    ]
    parsed = records.withColumn(
        EVENT, F.from_json(text, parse_type, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT})
    )
    return parsed.withColumn(ERROR, _first_error(checks))


def _parse_avro(records: DataFrame, layout: ArchiveLayout) -> DataFrame:
    # The decoder stops at the record's end: bytes that encode more (another schema's record, garbage
    # after a valid prefix) show when the decoded event does not encode back to the value.
    # A value that does not decode comes back as null or as a row of nulls: a required field is null
    # only then, since Avro cannot encode a null into one.
    round_trip = to_avro(F.col(EVENT), layout.event.avro_json)
    undecodable = F.col(EVENT).isNull()
    for name in _required(layout):
        undecodable = undecodable | F.col(EVENT)[name].isNull()
    invalid = f"not a valid Avro {layout.event.name} record"
    checks = [
        (F.col("value").isNull(), F.lit("null value")),
        (undecodable, F.lit(invalid)),
        (round_trip != F.col("value"), F.lit(f"{invalid}: bytes are left over after the record")),
    ]
    parsed = records.withColumn(
        EVENT, from_avro(F.col("value"), layout.event.avro_json, {"mode": "PERMISSIVE"})
    )
    return parsed.withColumn(ERROR, _first_error(checks))
