"""Turning Kafka record values into typed events, or into the reason they cannot be.

A record is valid when its value decodes with the topic's schema, every field has its declared type,
every enum holds one of its symbols and every required field is present, nested ones included. Anything
else gets an error text and goes to the dead-letter table.

`Parser` runs on every record, so it only does what deciding needs: null tests, enum look-ups, a range
check per timestamp (2000 to 2200), and one decoding of each value by a strict decoder of bergstream's own.
Why a JSON value does not decode (malformed text, not an object, which field has the wrong type) is worked
out by `explain`, on dead-lettered rows only. Keeping the diagnosis out of the per-record expression also
keeps that expression's generated code under the size the JVM compiles (8,000 bytes of bytecode); above
it, every record would run interpreted.

A JSON value is decoded in one strict pass (`StrictJson`: Jackson's streaming parser over the value's
bytes, in bergstream's jar) that converts each field as Spark's `from_json` does, and keeps its leniency
where it loses nothing: a number or an object sent for a string field is kept as its JSON text. Where
Spark's reader would lose or change data, the pass is strict: it refuses what RFC 8259 refuses, a key
twice in any object (Spark keeps the last), and anything after the object (Spark ignores it). One pass
instead of Spark's reader and a strict check beside it (bench/router/breakdown, the "decode json" stage).

An Avro value is decoded by Avro's reader and Spark's own deserializer, as `from_avro` does (`StrictAvro`),
and the decoder's position after the record says whether bytes follow it: another schema's record that
decodes as far as it goes, or garbage after a valid record, is refused, which Spark's reader would not see.
Both decoders are expressions of Spark's own, called from the generated code of the projection, that
build Spark's internal rows themselves.

A topic with a schema registry carries values in the wire format (schemas/wire.py): a header, then the
payload. The parser checks the header, knows the ids of the subject's versions (`WireSchemas`, fetched by
the router before each batch), and decodes an Avro payload with its writer's schema resolved to the table's
schema, one branch per id; a JSON payload is parsed as above. A value with an id the router could not
resolve goes to the dead-letter table with a reason that names the id; in an application's live source, an
id its query does not know fails the batch instead (`UnknownSchemaId`), to be fetched before it starts again.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from pyspark import SparkContext
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from bergstream.schemas import wire
from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.event_schema import Encoding
from bergstream.schemas.spark_types import avro_enums, nested_fields, optional

EVENT = "event"
ERROR = "error"
# The provisional error of a JSON value that does not decode into the event: `explain` says why.
UNDECODABLE_JSON = "undecodable JSON"
CORRUPT_RECORD = "_corrupt_record"
_DECODED = "_decoded_json"
Check = tuple[Column, Column]
# Event times outside these years are garbage: milliseconds read as seconds, another schema's numbers.
_EARLIEST, _LATEST = "2000-01-01 00:00:00", "2200-01-01 00:00:00"
_EARLIEST_SECONDS, _LATEST_SECONDS = 946_684_800, 7_258_118_400
# Jackson refuses JSON nested deeper than 1,000 levels; the strict parse, one level less.
MAX_JSON_DEPTH = 999
_INTEGERS = ("TINYINT", "SMALLINT", "INT", "BIGINT")
# The statuses of the strict parse (StrictJson) other than 0 (valid) and a timestamp field's position.
_UNDECODABLE, _LONE_SURROGATE, _INVALID_UTF8 = -1, -2, -3
# The strict Avro decoder's (StrictAvro) status of a value with bytes after its record.
_LEFT_OVER = -4
_STATUS = "status"
_NON_NUMBERS = r"(?<![\w\"])[+-]?(?:NaN|Infinity|INF)(?![\w\"])"


@dataclass(frozen=True)
class WireSchemas:
    """What the parser of a wire-format topic knows of its schema ids."""

    subject: str
    # The subject's schemas by id: the writer's Avro schema as JSON text (for JSON the id alone counts).
    writers: dict[int, str]
    # Ids seen in a batch that the registry could not resolve, with the reason (it did not answer).
    unresolved: dict[int, str] = field(default_factory=dict)
    # An id neither known nor unresolved fails the batch (UnknownSchemaId), instead of a dead letter: for a
    # query that cannot look new versions up between batches, and starts again after fetching them.
    fail_on_unknown: bool = False

    def id_error(self, schema_id: Column) -> Column:
        """Why a value's id is not one to decode with; null for a known id."""
        unknown = F.concat(
            F.lit("schema id "),
            schema_id.cast("string"),
            F.lit(f" is not a version of subject {self.subject} in the schema registry"),
        )
        if self.fail_on_unknown:
            unknown = F.raise_error(
                F.concat(
                    F.lit(UnknownSchemaId.PREFIX),
                    schema_id.cast("string"),
                    F.lit(f" of subject {self.subject}"),
                )
            )
        error = F.when(schema_id.isin(*self.writers), F.lit(None).cast("string"))
        for unresolved_id, reason in sorted(self.unresolved.items()):
            error = error.when(schema_id == unresolved_id, F.lit(f"schema id {unresolved_id}: {reason}"))
        return error.otherwise(unknown)


@dataclass(frozen=True)
class UnknownSchemaId:
    """A batch failed on a value whose schema id its query did not know (`WireSchemas.fail_on_unknown`)."""

    PREFIX = "unknown to the query: schema id "
    _FOUND = re.compile(re.escape(PREFIX) + r"(\d+) of subject (\S+)")

    schema_id: int
    subject: str

    @classmethod
    def find(cls, error_text: str) -> UnknownSchemaId | None:
        """The unknown id in the text of a query's error, if that is why it failed."""
        found = cls._FOUND.search(error_text)
        return None if found is None else cls(int(found.group(1)), found.group(2))


class Parser:
    """The parsing expressions of one topic, built once and applied to every micro-batch.

    Building Spark columns costs a round trip to the JVM each; a micro-batch costs only two projections.
    A value over `max_value_bytes` is refused whatever it holds, and not decoded at all: one runaway
    producer must not make archive rows that readers of the table choke on. With `wire`, values are in the
    schema registry's wire format.
    """

    def __init__(
        self,
        layout: ArchiveLayout,
        encoding: Encoding,
        max_value_bytes: int | None = None,
        wire_schemas: WireSchemas | None = None,
    ) -> None:
        self.wire = wire_schemas
        raw = F.col("value")
        value = raw if wire_schemas is None else wire.payload(raw)
        if max_value_bytes is not None:
            value = F.when(F.length(raw) <= max_value_bytes, value)
        self._value = value
        self._strict_json: StrictJson | None = None
        # The decoded columns, by name; for JSON, built in `parse`, with the session's time zone.
        self.decoded: dict[str, Column] = {}
        # The event, when the first projection yields it inside another column.
        self._event: Column | None = None
        if encoding == "json":
            self._strict_json = StrictJson(layout.event_type, _timestamps(layout))
            error = _json_error(
                layout, value, _header_checks(wire_schemas, plain_json=True), self._strict_json
            )
            self._event = F.col(_DECODED)[EVENT].alias(EVENT)
        else:
            self.decoded, error = _avro_columns(layout, value, wire_schemas)
            self._event = F.col(_DECODED)[EVENT].alias(EVENT)
        self.schema_id = wire.schema_id(raw) if wire_schemas is not None else F.lit(None).cast("int")
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
        columns = self.decoded
        if self._strict_json is not None:
            columns = {_DECODED: self._strict_json.column(records.sparkSession, self._value).alias(_DECODED)}
        decoded = records.select("*", *columns.values(), *extra)
        if self._event is not None:
            decoded = decoded.select("*", self._event)
        return decoded.select("*", self.error.alias(ERROR)).drop(*[name for name in columns if name != EVENT])


def _header_checks(wire_schemas: WireSchemas | None, plain_json: bool = False) -> list[Check]:
    """The checks of a value's wire-format header; on a topic without a registry, that it has none."""
    raw = F.col("value")
    header = F.concat(F.lit("(magic byte 0, schema id "), wire.schema_id(raw).cast("string"), F.lit(")"))
    if wire_schemas is None:
        # A JSON text never starts with a zero byte; an Avro record may, so that check is the Avro parser's.
        if not plain_json:
            return []
        return [(wire.has_header(raw), _plain_topic_reason(header))]
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


def _plain_topic_reason(header: Column) -> Column:
    return F.concat(
        F.lit("value starts with a schema registry's wire-format header "),
        header,
        F.lit(" but the topic's settings have no schema_registry"),
    )


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


def _timestamps(layout: ArchiveLayout) -> list[str]:
    return [f.name for f in layout.event_type.fields if isinstance(f.dataType, T.TimestampType)]


def _time_checks(layout: ArchiveLayout) -> list[Check]:
    return [
        (
            ~_field(name).between(F.lit(_EARLIEST).cast("timestamp"), F.lit(_LATEST).cast("timestamp")),
            F.lit(f"field '{name}' is out of range: before {_EARLIEST[:4]} or after {_LATEST[:4]}"),
        )
        for name in _timestamps(layout)
    ]


class StrictJson:
    """The strict decoding of a topic's JSON values into its event (`io.bergstream.schemas.StrictJson`, in
    schemas/jvm): one pass of Jackson over the value's bytes, converting as Spark's `from_json` does and
    strict where Spark's reader is lenient (see the module's docstring), which also finds the top-level
    timestamp fields sent as numbers out of range.

    It is an expression of Spark's own that calls the decoder from the projection's generated code and
    builds Spark's internal row itself (no conversion of each record's result, as a user-defined function
    would need); plans show it by a name that depends on what it decodes. Its result is a struct of the event
    (EVENT) and a status (STATUS), in this order of precedence: -3 (_INVALID_UTF8, the event null) for a
    value that is not valid UTF-8 as Spark's `is_valid_utf8` judges it (checked there in one pass over the
    bytes when they are all ASCII, instead of Spark's decoding of every byte); -1 (_UNDECODABLE, the event
    null) for a
    value that is not a single strict JSON object, nested at most MAX_JSON_DEPTH levels, whose fields
    convert to their types; -2 (_LONE_SURROGATE) for one that escapes half of a UTF-16 surrogate pair,
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
            f"{event_type.json()}/{','.join(fields)}/{_EARLIEST_SECONDS}/{_LATEST_SECONDS}/{MAX_JSON_DEPTH}"
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
                _EARLIEST_SECONDS, _LATEST_SECONDS, MAX_JSON_DEPTH,
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


def _json_error(
    layout: ArchiveLayout, value: Column, header_checks: list[Check], strict_json: StrictJson
) -> Column:
    strict = F.col(_DECODED)[StrictJson.STATUS]
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
        (strict == _INVALID_UTF8, F.lit("value is not valid UTF-8")),
        (strict == _UNDECODABLE, F.lit(UNDECODABLE_JSON)),
        (
            strict == _LONE_SURROGATE,
            F.lit("a JSON string holds half of a UTF-16 surrogate pair, which is not text"),
        ),
        *numeric_times,
        *_time_checks(layout),
        *_content_checks(layout),
    ]
    return _first_error(checks)


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


def _json_reason(layout: ArchiveLayout, value: Column) -> Column:
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
    return _first_error(
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


def explain(layout: ArchiveLayout, encoding: Encoding, wire_schemas: WireSchemas | None = None) -> Column:
    """The final error text of a parsed row: `error` with UNDECODABLE_JSON replaced by its reason."""
    if encoding != "json":
        return F.col(ERROR)
    value = F.col("value") if wire_schemas is None else wire.payload(F.col("value"))
    return F.when(F.col(ERROR) == UNDECODABLE_JSON, _json_reason(layout, value)).otherwise(F.col(ERROR))


def parse_and_explain(
    records: DataFrame,
    layout: ArchiveLayout,
    encoding: Encoding,
    max_value_bytes: int | None = None,
    wire_schemas: WireSchemas | None = None,
) -> DataFrame:
    """Parsed records with every error final: for looking at a few records, not for the router's hot
    path, which explains dead-lettered rows only."""
    parsed = Parser(layout, encoding, max_value_bytes, wire_schemas).parse(records)
    return parsed.withColumn(ERROR, explain(layout, encoding, wire_schemas))


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


def _avro_columns(
    layout: ArchiveLayout, value: Column, wire_schemas: WireSchemas | None
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
    status = F.col(_DECODED)[_STATUS]
    undecodable, left_over = status == _UNDECODABLE, status == _LEFT_OVER
    plain_header = (
        [(wire.has_header(F.col("value")) & (undecodable | left_over),
          _plain_topic_reason(F.concat(F.lit("(magic byte 0, schema id "),
                                       wire.schema_id(F.col("value")).cast("string"), F.lit(")"))))]
        if wire_schemas is None else []
    )  # fmt: skip
    bad_text = [
        (~F.is_valid_utf8(_field(path)), F.lit(f"field '{path}' is not valid UTF-8"))
        for path, struct_field in nested_fields(layout.event_type)
        if isinstance(struct_field.dataType, T.StringType)
    ]
    checks: list[Check] = [
        (F.col("value").isNull(), F.lit("null value")),
        *_header_checks(wire_schemas),
        *plain_header,
        (undecodable, F.lit(invalid)),
        (left_over, F.lit(f"{invalid}: bytes are left over after the record")),
        *bad_text,
        # Another schema's record that happens to decode has small numbers for a timestamp: early 1970.
        *_time_checks(layout),
        *_content_checks(layout),
    ]
    return {_DECODED: decoded.alias(_DECODED)}, _first_error(checks)


def _avro_result_type(layout: ArchiveLayout) -> T.StructType:
    return T.StructType([T.StructField(EVENT, layout.event_type), T.StructField(_STATUS, T.IntegerType())])
