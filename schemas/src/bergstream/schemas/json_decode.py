"""JSON values decoded into a topic's event, and why one does not decode.

A JSON value is decoded in one strict pass (`StrictJson`: Jackson's streaming parser over the value's
bytes, in bergstream's jar) that converts each field as Spark's `from_json` does, and keeps its leniency
where it loses nothing: a number or an object sent for a string field is kept as its JSON text. Where
Spark's reader would lose or change data, the pass is strict: it refuses what RFC 8259 refuses, a key
twice in any object (Spark keeps the last), and anything after the object (Spark ignores it). One pass
instead of Spark's reader and a strict check beside it (bench/router/breakdown, the "decode json" stage).

The router's hot path decides only that a value does not decode (UNDECODABLE_JSON); why (malformed text,
not an object, which field has the wrong type) is worked out by `json_reason`, on dead-lettered rows only.
"""

from __future__ import annotations

import hashlib

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.checks import (
    DECODED,
    EARLIEST_SECONDS,
    INVALID_UTF8,
    LATEST_SECONDS,
    LONE_SURROGATE,
    UNDECODABLE,
    Check,
    content_checks,
    first_error,
    time_checks,
)
from bergstream.schemas.spark_types import optional

# The provisional error of a JSON value that does not decode into the event: `json_reason` says why.
UNDECODABLE_JSON = "undecodable JSON"
CORRUPT_RECORD = "_corrupt_record"
# Jackson refuses JSON nested deeper than 1,000 levels; the strict parse, one level less.
MAX_JSON_DEPTH = 999
_INTEGERS = ("TINYINT", "SMALLINT", "INT", "BIGINT")
_NON_NUMBERS = r"(?<![\w\"])[+-]?(?:NaN|Infinity|INF)(?![\w\"])"


class StrictJson:
    """The strict decoding of a topic's JSON values into its event (`io.bergstream.schemas.StrictJson`, in
    schemas/jvm): one pass of Jackson over the value's bytes, converting as Spark's `from_json` does and
    strict where Spark's reader is lenient (see the module's docstring), which also finds the top-level
    timestamp fields sent as numbers out of range.

    It is an expression of Spark's own that calls the decoder from the projection's generated code and
    builds Spark's internal row itself (no conversion of each record's result, as a user-defined function
    would need); plans show it by a name that depends on what it decodes. Its result is a struct of the event
    (EVENT) and a status (STATUS), in this order of precedence: -3 (INVALID_UTF8, the event null) for a
    value that is not valid UTF-8 as Spark's `is_valid_utf8` judges it (checked there in one pass over the
    bytes when they are all ASCII, instead of Spark's decoding of every byte); -1 (UNDECODABLE, the event
    null) for a
    value that is not a single strict JSON object, nested at most MAX_JSON_DEPTH levels, whose fields
    convert to their types; -2 (LONE_SURROGATE) for one that escapes half of a UTF-16 surrogate pair,
    which Java would turn into "?"; n for a value whose n-th timestamp field (from 1, in `fields` order)
    holds a number outside the seconds of 2000 to 2200; 0 otherwise. Timestamps without a zone are read
    in the session's time zone, as Spark reads them."""

    _CLASS = "io.bergstream.schemas.StrictJson"
    EVENT = "event"
    STATUS = "status"

    def __init__(self, event_type: T.StructType, fields: list[str]) -> None:
        # Every field may come back null, required ones too: the checks after the decoding say why.
        nullable = optional(event_type)
        assert isinstance(nullable, T.StructType)
        self.event_type = nullable
        self.fields = fields
        checked = (
            f"{event_type.json()}/{','.join(fields)}/{EARLIEST_SECONDS}/{LATEST_SECONDS}/{MAX_JSON_DEPTH}"
        )
        self.name = f"bergstream_strict_json_{hashlib.sha256(checked.encode()).hexdigest()[:12]}"
        self._columns: dict[int, Column] = {}

    def column(self, spark: SparkSession, value: Column) -> Column:
        """The decoding of `value` (binary), timestamps without a zone read in `spark`'s time zone; one
        column per session, built once."""
        key = spark._jsparkSession.hashCode()
        column = self._columns.get(key)
        if column is None:
            jvm = spark._jvm
            assert jvm is not None
            java = getattr(jvm, self._CLASS).column(
                spark._jsparkSession, value._jc, self.name, self.event_type.json(), self.fields,
                EARLIEST_SECONDS, LATEST_SECONDS, MAX_JSON_DEPTH,
            )  # fmt: skip
            column = self._columns[key] = Column(java)
        return column


def lenient_json(event_type: T.StructType, text: Column) -> Column:
    """Spark's own reading of a JSON value into the event, with CORRUPT_RECORD set where it fails."""
    parse_type = T.StructType([*event_type.fields, T.StructField(CORRUPT_RECORD, T.StringType())])
    # Spark takes NaN, Infinity and single-quoted text by default: none of them is JSON.
    options = {
        "mode": "PERMISSIVE",
        "columnNameOfCorruptRecord": CORRUPT_RECORD,
        "allowNonNumericNumbers": "false",
        "allowSingleQuotes": "false",
    }
    return F.from_json(text, parse_type, options)


def json_error(
    layout: ArchiveLayout, value: Column, header_checks: list[Check], strict_json: StrictJson
) -> Column:
    strict = F.col(DECODED)[StrictJson.STATUS]
    # Spark reads a JSON number into a timestamp as epoch seconds, times a million without overflow
    # checks: milliseconds land tens of thousands of years away, and microseconds or nanoseconds wrap
    # around into any year at all. The strict parse finds those numbers.
    numeric_times = [
        (
            strict == position,
            F.lit(f"field '{name}' is out of range: send ISO-8601 text, not a number of milliseconds"),
        )
        for position, name in enumerate(strict_json.fields, start=1)
    ]
    checks: list[Check] = [
        (F.col("value").isNull(), F.lit("null value")),
        *header_checks,
        (F.length(value) == 0, F.lit("empty value")),
        (strict == INVALID_UTF8, F.lit("value is not valid UTF-8")),
        (strict == UNDECODABLE, F.lit(UNDECODABLE_JSON)),
        (
            strict == LONE_SURROGATE,
            F.lit("a JSON string holds half of a UTF-16 surrogate pair, which is not text"),
        ),
        *numeric_times,
        *time_checks(layout),
        *content_checks(layout),
    ]
    return first_error(checks)


def _parses(text: Column) -> Column:
    return F.try_parse_json(text).isNotNull()


def _duplicate_key(text: Column) -> Column:
    """Which key of the outer object comes twice, or that a nested object has a key twice."""
    keys = F.array_sort(F.json_object_keys(text))
    repeated = F.filter(keys, lambda key, i: F.when(i > 0, key == F.try_element_at(keys, i)))
    first = F.try_element_at(repeated, F.lit(1))
    return F.when(
        first.isNotNull(), F.concat(F.lit("key '"), first, F.lit("' comes twice in the JSON object"))
    ).otherwise(F.lit("a nested JSON object has the same key twice"))


def json_reason(layout: ArchiveLayout, value: Column) -> Column:
    """Why a JSON value (the payload, with a registry) did not decode into the event."""
    text = value.cast("string")
    variant = F.try_parse_json(text)
    kind = F.regexp_extract(F.schema_of_variant(variant), r"^(\w+)", 1)
    # Whether Spark's lenient reader takes the value: then what is wrong is what the strict pass refuses.
    lenient = lenient_json(layout.event_type, text)
    decoded = lenient.isNotNull() & lenient[CORRUPT_RECORD].isNull()
    # Keys (without escapes) and blanks removed, a run of opening brackets is the nesting itself.
    skeleton = F.regexp_replace(F.regexp_replace(text, r'"[^"\\]*"\s*:', ""), r"\s+", "")
    wrong_types = []
    for struct_field in layout.event_type.fields:
        path = f"$.{struct_field.name}"
        member = F.variant_get(variant, path, "variant")
        type_name = struct_field.dataType.simpleString()
        fits = F.try_variant_get(variant, path, type_name).isNotNull()
        if isinstance(struct_field.dataType, T.IntegralType):
            fits = fits & F.schema_of_variant(member).isin(*_INTEGERS)
        if isinstance(struct_field.dataType, T.TimestampType):
            fits = fits & F.schema_of_variant(member).isin("STRING", *_INTEGERS)
        wrong_types.append(
            (
                member.isNotNull() & ~F.is_variant_null(member) & ~fits,
                F.lit(f"field '{struct_field.name}' is not of type {type_name}"),
            )
        )
    return first_error(
        [
            (
                variant.isNull() & _parses(F.regexp_replace(text, r"[\x00-\x1f]", " ")),
                F.lit("a control character is not escaped in the JSON text"),
            ),
            (
                variant.isNull() & _parses(F.regexp_replace(text, _NON_NUMBERS, "0")),
                F.lit("NaN and Infinity are not JSON numbers"),
            ),
            (
                skeleton.rlike(f"[\\[{{]{{{MAX_JSON_DEPTH}}}"),
                F.lit(f"JSON nested deeper than {MAX_JSON_DEPTH} levels"),
            ),
            (variant.isNull() & decoded, _duplicate_key(text)),
            (variant.isNull(), F.lit("malformed JSON")),
            (kind != "OBJECT", F.concat(F.lit("not a JSON object but "), kind)),
            (decoded, F.lit("bytes are left over after the JSON object")),
            *wrong_types,
        ]
    ).otherwise(F.lit(f"not a valid {layout.event.name} event"))
