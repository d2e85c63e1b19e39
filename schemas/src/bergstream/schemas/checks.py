"""The checks every decoded value goes through, whatever its encoding: the wire-format header (or its
absence), each timestamp inside the years 2000 to 2200, every required field present, every enum one of its
symbols. Each check is a condition and the error text of a row that meets it; a row's error is that of the
first check it meets (`first_error`), null when it meets none.

The decoders (json_decode.py, avro_decode.py) put their result in the column DECODED: a struct of the event
(EVENT) and a status (STATUS), 0 for a value that decoded, or one of the statuses below.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from bergstream.schemas import wire
from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.spark_types import avro_enums, nested_fields

EVENT = "event"
ERROR = "error"
DECODED = "_decoded_json"
STATUS = "status"
Check = tuple[Column, Column]
# Event times outside these years are garbage: milliseconds read as seconds, another schema's numbers.
EARLIEST, LATEST = "2000-01-01 00:00:00", "2200-01-01 00:00:00"
EARLIEST_SECONDS, LATEST_SECONDS = 946_684_800, 7_258_118_400
# The decoders' statuses other than 0 (valid) and, for JSON, a timestamp field's position: a value that
# does not decode, one that escapes half of a surrogate pair, one that is not UTF-8, one with bytes after
# its record.
UNDECODABLE, LONE_SURROGATE, INVALID_UTF8, LEFT_OVER = -1, -2, -3, -4


def header_checks(wire_schemas: wire.WireSchemas | None, plain_json: bool = False) -> list[Check]:
    """The checks of a value's wire-format header; on a topic without a registry, that it has none."""
    raw = F.col("value")
    header = F.concat(F.lit("(magic byte 0, schema id "), wire.schema_id(raw).cast("string"), F.lit(")"))
    if wire_schemas is None:
        # A JSON text never starts with a zero byte; an Avro record may, so that check is the Avro parser's.
        if not plain_json:
            return []
        return [(wire.has_header(raw), plain_topic_reason(header))]
    return [
        (
            F.length(raw) < wire.HEADER_BYTES,
            F.concat(
                F.lit("value of "),
                F.length(raw).cast("string"),
                F.lit(f" bytes is shorter than the {wire.HEADER_BYTES}-byte header of the wire format"),
            ),
        ),
        (
            ~wire.has_header(raw),
            F.lit("value does not start with the wire format's magic byte 0: not from a registry serializer"),
        ),
        (wire.schema_id(raw).isNull(), F.lit("the wire-format header holds no valid schema id")),
        (wire_schemas.id_error(wire.schema_id(raw)).isNotNull(), wire_schemas.id_error(wire.schema_id(raw))),
    ]


def plain_topic_reason(header: Column) -> Column:
    return F.concat(
        F.lit("value starts with a schema registry's wire-format header "),
        header,
        F.lit(" but the topic's settings have no schema_registry"),
    )


def first_error(checks: list[Check]) -> Column:
    error = F.when(*checks[0])
    for condition, message in checks[1:]:
        error = error.when(condition, message)
    return error


def event_field(path: str) -> Column:
    column = F.col(EVENT)
    for part in path.split("."):
        column = column[part]
    return column


def _present(path: str) -> Column:
    """The field's parent struct is there (a missing optional struct has no required fields to check)."""
    parent = path.rpartition(".")[0]
    return event_field(parent).isNotNull() if parent else F.lit(True)


def content_checks(layout: ArchiveLayout) -> list[Check]:
    fields = nested_fields(layout.event_type)
    missing = [
        (_present(path) & event_field(path).isNull(), F.lit(f"required field '{path}' is missing or null"))
        for path, struct_field in fields
        if not struct_field.nullable
    ]
    enums = [
        (
            event_field(path).isNotNull() & ~event_field(path).isin(symbols),
            F.concat(
                F.lit(f"field '{path}' is "), event_field(path), F.lit(f", not one of {', '.join(symbols)}")
            ),
        )
        for path, symbols in avro_enums(layout.event.avro).items()
    ]
    return [*missing, *enums]


def timestamp_fields(layout: ArchiveLayout) -> list[str]:
    return [f.name for f in layout.event_type.fields if isinstance(f.dataType, T.TimestampType)]


def time_checks(layout: ArchiveLayout) -> list[Check]:
    """Every timestamp inside 2000 to 2200, those of nested records too (null where a record is missing)."""
    return [
        (
            ~event_field(path).between(F.lit(EARLIEST).cast("timestamp"), F.lit(LATEST).cast("timestamp")),
            F.lit(f"field '{path}' is out of range: before {EARLIEST[:4]} or after {LATEST[:4]}"),
        )
        for path, struct_field in nested_fields(layout.event_type)
        if isinstance(struct_field.dataType, T.TimestampType)
    ]
