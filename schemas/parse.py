"""Turning Kafka record values into typed events, or into the reason they cannot be.

A record is valid when its value decodes with the topic's schema, every field has its declared type,
every enum holds one of its symbols and every required field is present, nested ones included. Anything
else gets an error text and goes to the dead-letter table.

`Parser` runs on every record, so it only does what deciding needs: null tests, enum look-ups, a range
check per timestamp and, for Avro, one re-encoding. Why a JSON value does not decode (malformed text,
not an object, which field has the wrong type) is worked out by `explain`, on dead-lettered rows only.
Keeping the diagnosis out of the per-record expression also keeps that expression's generated code under
the size the JVM compiles (8,000 bytes of bytecode); above it, every record would run interpreted.

Spark's JSON reader is lenient in ways that lose nothing: a number or an object sent for a string field
is kept as its JSON text.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.avro.functions import from_avro, to_avro

from schemas.archive import ArchiveLayout
from schemas.registry import Encoding
from schemas.spark_types import avro_enums, nested_fields

EVENT = "event"
ERROR = "error"
# The provisional error of a JSON value that does not decode into the event: `explain` says why.
UNDECODABLE_JSON = "undecodable JSON"
_CORRUPT = "_corrupt_record"
Check = tuple[Column, Column]
_EARLIEST, _LATEST = "1970-01-01 00:00:00", "2200-01-01 00:00:00"


class Parser:
    """The parsing expressions of one topic, built once and applied to every micro-batch.

    Building Spark columns costs a round trip to the JVM each; a micro-batch costs only two projections.
    A value over `max_value_bytes` is refused whatever it holds: one runaway producer must not make
    archive rows that readers of the table choke on.
    """

    def __init__(self, layout: ArchiveLayout, encoding: Encoding, max_value_bytes: int | None = None) -> None:
        build = _json_columns if encoding == "json" else _avro_columns
        self.event, error = build(layout)
        if max_value_bytes is not None:
            size = F.length(F.col("value"))
            oversize = F.concat(
                F.lit("value of "),
                size.cast("string"),
                F.lit(f" bytes is over the limit of {max_value_bytes}"),
            )
            error = F.when(size > max_value_bytes, oversize).otherwise(error)
        self.error = error

    def parse(self, records: DataFrame, *extra: Column) -> DataFrame:
        """`records` with `event` and `error` added, and the `extra` columns, which may use neither.

        `error` is null for a valid event and final otherwise, except for JSON that does not decode:
        there it is UNDECODABLE_JSON, and `explain` gives the reason."""
        return records.select("*", self.event.alias(EVENT), *extra).select("*", self.error.alias(ERROR))


def _first_error(checks: list[Check]) -> Column:
    error = F.when(*checks[0])
    for condition, message in checks[1:]:
        error = error.when(condition, message)
    return error


def _field(path: str) -> Column:
    column = F.col(EVENT)
    for part in path.split("."):
        column = column[part]
    return column


def _present(path: str) -> Column:
    """The field's parent struct is there (a missing optional struct has no required fields to check)."""
    parent = path.rpartition(".")[0]
    return _field(parent).isNotNull() if parent else F.lit(True)


def _content_checks(layout: ArchiveLayout) -> list[Check]:
    fields = nested_fields(layout.event_type)
    missing = [
        (_present(path) & _field(path).isNull(), F.lit(f"required field '{path}' is missing or null"))
        for path, struct_field in fields
        if not struct_field.nullable
    ]
    enums = [
        (
            _field(path).isNotNull() & ~_field(path).isin(symbols),
            F.concat(F.lit(f"field '{path}' is "), _field(path), F.lit(f", not one of {', '.join(symbols)}")),
        )
        for path, symbols in avro_enums(layout.event.avro).items()
    ]
    return [*missing, *enums]


def _json_columns(layout: ArchiveLayout) -> tuple[Column, Column]:
    parse_type = T.StructType([*layout.event_type.fields, T.StructField(_CORRUPT, T.StringType())])
    text = F.col("value").cast("string")
    # Spark reads a JSON number into a timestamp as epoch seconds: milliseconds land tens of
    # thousands of years away. A range check costs a comparison, where looking at the text costs a scan.
    numeric_times = [
        (
            ~F.col(EVENT)[f.name].between(
                F.lit(_EARLIEST).cast("timestamp"), F.lit(_LATEST).cast("timestamp")
            ),
            F.lit(f"field '{f.name}' is out of range: send ISO-8601 text, not a number of milliseconds"),
        )
        for f in layout.event_type.fields
        if isinstance(f.dataType, T.TimestampType)
    ]
    checks: list[Check] = [
        (F.col("value").isNull(), F.lit("null value")),
        (F.length(F.col("value")) == 0, F.lit("empty value")),
        (~F.is_valid_utf8(text), F.lit("value is not valid UTF-8")),
        (F.col(EVENT)[_CORRUPT].isNotNull(), F.lit(UNDECODABLE_JSON)),
        (~F.rtrim(text).endswith("}"), F.lit("bytes are left over after the JSON object")),
        *numeric_times,
        *_content_checks(layout),
    ]
    event = F.from_json(text, parse_type, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT})
    return event, _first_error(checks)


def _json_reason(layout: ArchiveLayout) -> Column:
    """Why a JSON value did not decode into the event."""
    text = F.col("value").cast("string")
    variant = F.try_parse_json(text)
    kind = F.regexp_extract(F.schema_of_variant(variant), r"^(\w+)", 1)
    wrong_types = []
    for struct_field in layout.event_type.fields:
        member = F.variant_get(variant, f"$.{struct_field.name}", "variant")
        wrong_types.append(
            (
                member.isNotNull()
                & ~F.is_variant_null(member)
                & F.try_variant_get(
                    variant, f"$.{struct_field.name}", struct_field.dataType.simpleString()
                ).isNull(),
                F.lit(f"field '{struct_field.name}' is not of type {struct_field.dataType.simpleString()}"),
            )
        )
    return _first_error(
        [
            (variant.isNull(), F.lit("malformed JSON")),
            (kind != "OBJECT", F.concat(F.lit("not a JSON object but "), kind)),
            *wrong_types,
        ]
    ).otherwise(F.lit(f"not a valid {layout.event.name} event"))


def explain(layout: ArchiveLayout, encoding: Encoding) -> Column:
    """The final error text of a parsed row: `error` with UNDECODABLE_JSON replaced by its reason."""
    if encoding != "json":
        return F.col(ERROR)
    return F.when(F.col(ERROR) == UNDECODABLE_JSON, _json_reason(layout)).otherwise(F.col(ERROR))


def parse_and_explain(
    records: DataFrame, layout: ArchiveLayout, encoding: Encoding, max_value_bytes: int | None = None
) -> DataFrame:
    """Parsed records with every error final: for looking at a few records, not for the router's hot
    path, which explains dead-lettered rows only."""
    parsed = Parser(layout, encoding, max_value_bytes).parse(records)
    return parsed.withColumn(ERROR, explain(layout, encoding))


def _avro_columns(layout: ArchiveLayout) -> tuple[Column, Column]:
    # A value that does not decode comes back as null or as a row of nulls: a required field is null
    # only then, since Avro cannot encode a null into one.
    undecodable = F.col(EVENT).isNull()
    for struct_field in layout.event_type.fields:
        if not struct_field.nullable:
            undecodable = undecodable | _field(struct_field.name).isNull()
    invalid = f"not a valid Avro {layout.event.name} record"
    # The decoder stops at the record's end: bytes that encode more (another schema's record, garbage
    # after a valid prefix) show when the decoded event does not encode back to the value.
    round_trip = to_avro(F.col(EVENT), layout.event.avro_json)
    bad_text = [
        (~F.is_valid_utf8(_field(path)), F.lit(f"field '{path}' is not valid UTF-8"))
        for path, struct_field in nested_fields(layout.event_type)
        if isinstance(struct_field.dataType, T.StringType)
    ]
    checks: list[Check] = [
        (F.col("value").isNull(), F.lit("null value")),
        (undecodable, F.lit(invalid)),
        (round_trip != F.col("value"), F.lit(f"{invalid}: bytes are left over after the record")),
        *bad_text,
        *_content_checks(layout),
    ]
    event = from_avro(F.col("value"), layout.event.avro_json, {"mode": "PERMISSIVE"})
    return event, _first_error(checks)
