"""Avro values decoded into a topic's event.

An Avro value is decoded by Avro's reader and Spark's own deserializer, as `from_avro` does (`StrictAvro`, in
bergstream's jar), and the decoder's position after the record says whether bytes follow it: another
schema's record that decodes as far as it goes, or garbage after a valid record, is refused, which Spark's
reader would not see. With a schema registry, the payload is decoded with its writer's schema resolved to
the table's schema, one branch per id.
"""

from __future__ import annotations

import hashlib

from pyspark import SparkContext
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from bergstream.schemas import wire
from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.checks import (
    DECODED,
    EVENT,
    LEFT_OVER,
    STATUS,
    UNDECODABLE,
    Check,
    content_checks,
    event_field,
    first_error,
    header_checks,
    plain_topic_reason,
    time_checks,
)
from bergstream.schemas.spark_types import nested_fields


def _strict_avro(value: Column, writer: str, reader: str) -> Column:
    """`value` decoded with the writer's schema, resolved to the reader's (Avro's schema resolution), into a
    struct of the event and a status (`io.bergstream.schemas.StrictAvro`, in schemas/jvm): 0, -1 (the event
    null) for a value that does not decode, -4 (the event null) for one with bytes after the record."""
    jvm = SparkContext._jvm
    assert jvm is not None, "the strict Avro decoder needs a running Spark session"
    digest = hashlib.sha256(f"{writer}/{reader}".encode()).hexdigest()[:12]
    return Column(
        jvm.io.bergstream.schemas.StrictAvro.column(
            value._jc, f"bergstream_strict_avro_{digest}", writer, reader
        )
    )


def avro_columns(
    layout: ArchiveLayout, value: Column, wire_schemas: wire.WireSchemas | None
) -> tuple[dict[str, Column], Column]:
    invalid = f"not a valid Avro {layout.event.name} record"
    reader = layout.event.avro_json
    # The decoder knows where the record ends: bytes after it (another schema's record that decodes as far
    # as it goes, garbage after a valid one) are a status of their own.
    if wire_schemas is None:
        decoded = _strict_avro(value, reader, reader)
    else:
        # One branch per id; a value of another id has an error already, and nothing decoded.
        schema_id = wire.schema_id(F.col("value"))
        branches: Column | None = None
        for writer_id, writer in sorted(wire_schemas.writers.items()):
            resolved = _strict_avro(value, writer, reader)
            branches = (F.when if branches is None else branches.when)(schema_id == writer_id, resolved)
        decoded = branches if branches is not None else F.lit(None).cast(_avro_result_type(layout))
    status = F.col(DECODED)[STATUS]
    undecodable, left_over = status == UNDECODABLE, status == LEFT_OVER
    plain_header = (
        [(wire.has_header(F.col("value")) & (undecodable | left_over),
          plain_topic_reason(F.concat(F.lit("(magic byte 0, schema id "),
                                       wire.schema_id(F.col("value")).cast("string"), F.lit(")"))))]
        if wire_schemas is None else []
    )  # fmt: skip
    bad_text = [
        (~F.is_valid_utf8(event_field(path)), F.lit(f"field '{path}' is not valid UTF-8"))
        for path, struct_field in nested_fields(layout.event_type)
        if isinstance(struct_field.dataType, T.StringType)
    ]
    checks: list[Check] = [
        (F.col("value").isNull(), F.lit("null value")),
        *header_checks(wire_schemas),
        *plain_header,
        (undecodable, F.lit(invalid)),
        (left_over, F.lit(f"{invalid}: bytes are left over after the record")),
        *bad_text,
        # Another schema's record that happens to decode has small numbers for a timestamp: early 1970.
        *time_checks(layout),
        *content_checks(layout),
    ]
    return {DECODED: decoded.alias(DECODED)}, first_error(checks)


def _avro_result_type(layout: ArchiveLayout) -> T.StructType:
    return T.StructType([T.StructField(EVENT, layout.event_type), T.StructField(STATUS, T.IntegerType())])
