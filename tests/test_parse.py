"""Parsing on Spark: every malformed value gets a reason, every valid one none, and none crashes the job."""

from __future__ import annotations

import io
import json
import random
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from bergstream.loadgen.events import EventModel
from bergstream.loadgen.malformed import MALFORMATIONS, malform
from bergstream.router.batch_counts import observed_columns
from bergstream.router.transform import RecordSplitter, in_table_order
from bergstream.schemas import ArchiveLayout, load_event_schema, wire
from bergstream.schemas.event_schema import Encoding, EventSchema
from bergstream.schemas.json_decode import CORRUPT_RECORD, MAX_JSON_DEPTH, StrictJson, lenient_json
from bergstream.schemas.parse import ERROR, EVENT
from bergstream.schemas.spark_types import record_to_struct
from bergstream.schemas.wire import WireSchemas
from tests.parsing import parse_and_explain

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

# Avro varints that claim a string, bytes or array far larger than the record.
HUGE_LENGTHS = [
    b"\xfe\xff\xff\xff\x0f" + b"x" * 10,
    b"\x02" * 3 + b"\xfe\xff\xff\xff\x07",
    b"\xff\xff\xff\xff\x0f",
]


@pytest.mark.parametrize(
    ("kind", "encoding"), [("playback", "json"), ("impression", "avro"), ("playback", "avro")]
)
def test_each_malformation_is_dead_lettered_with_a_reason(
    spark: SparkSession, kind: str, encoding: Encoding
) -> None:
    schema = load_event_schema(kind)
    layout = ArchiveLayout(schema, table=kind)
    rng = random.Random(3)
    events = EventModel(seed=3).events(kind)
    rows: list[tuple[str, bytes | None]] = []
    for _ in range(400):
        event = next(events).event
        rows.append(("valid", schema.encode(event, encoding)))
        bad = malform(event, schema, encoding, rng)
        rows.append((bad.kind, bad.value))
    if encoding == "avro":
        rows += [("huge_length", value) for value in HUGE_LENGTHS]
    records = spark.createDataFrame(rows, "kind string, value binary")

    result = (
        parse_and_explain(records, layout, encoding).select("kind", ERROR, f"{EVENT}.account_id").collect()
    )

    assert {r.kind for r in result} >= {"valid", *MALFORMATIONS[encoding]}
    escaped = [(r.kind, r.error) for r in result if r.kind != "valid" and r.error is None]
    assert not escaped, f"malformed values archived as events: {escaped[:5]}"
    refused = [r.error for r in result if r.kind == "valid" and r.error is not None]
    assert not refused, f"valid events dead-lettered: {refused[:5]}"
    assert all(r.account_id is not None for r in result if r.kind == "valid")


def test_reasons_name_what_is_wrong(spark: SparkSession) -> None:
    schema = load_event_schema("playback")
    layout = ArchiveLayout(schema, table="playback")
    valid = schema.encode(next(EventModel(seed=1).events("playback")).event, "json")
    event = json.loads(valid)
    cases = {
        b'{"playback_id": "x", "account_id": "abc"}': "field 'account_id' is not of type bigint",
        valid.replace(b'"country"', b'"countree"'): "required field 'country' is missing or null",
        valid[:-3]: "malformed JSON",
        b"[1, 2]": "not a JSON object but ARRAY",
        valid.replace(
            b'"bitrate_kbps":', b'"bitrate_kbps":"fast","x":'
        ): "field 'bitrate_kbps' is not of type int",
        b'{"playback_id": "\xe9"}': "value is not valid UTF-8",
        b"": "empty value",
        valid.replace(b'"event_type":"', b'"event_type":"BOGUS'): None,
        valid + b"xyz": "bytes are left over after the JSON object",
        json.dumps(
            {**event, "event_ts": 1795356889000}
        ).encode(): "field 'event_ts' is out of range: send ISO-8601 text, not a number of milliseconds",
        json.dumps(
            {**event, "device": {"type": "tv", "app_version": "1"}}
        ).encode(): "required field 'device.os' is missing or null",
    }
    bogus = json.loads(valid)["event_type"]
    cases[valid.replace(b'"event_type":"', b'"event_type":"BOGUS')] = (
        f"field 'event_type' is BOGUS{bogus}, not one of START, HEARTBEAT, STOP"
    )
    records = spark.createDataFrame([(v,) for v in cases], "value binary")
    errors = {
        r.value: r.error for r in parse_and_explain(records, layout, "json").select("value", ERROR).collect()
    }
    assert {bytes(v): e for v, e in errors.items()} == cases


def test_avro_reasons_name_what_is_wrong_and_a_resolved_record_ends_where_its_writer_ended(
    spark: SparkSession,
) -> None:
    """Bytes after a record are found by where the decoder stopped, also when the writer's schema has a
    field the reader's lacks (resolution reads it through): the event of a valid value is the one sent."""
    import fastavro

    schema = load_event_schema("playback")
    layout = ArchiveLayout(schema, table="playback")
    event = next(EventModel(seed=1).events("playback")).event
    valid = schema.encode(event, "avro")
    quality = {"name": "quality", "type": ["null", "string"], "default": None}
    newer = dict(schema.avro, fields=[*schema.avro["fields"], quality])
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(newer), {**event, "quality": "uhd"})
    written_newer = buffer.getvalue()
    invalid = "not a valid Avro playback record"
    plain = {
        valid: None,
        valid + b"\x00": f"{invalid}: bytes are left over after the record",
        valid[:-2]: invalid,
        wire.frame(7, valid): (
            "value starts with a schema registry's wire-format header (magic byte 0, schema id 7) "
            "but the topic's settings have no schema_registry"
        ),
    }
    registry = WireSchemas("playback-value", {1: schema.avro_json, 2: json.dumps(newer)})
    framed = {
        wire.frame(1, valid): None,
        wire.frame(2, written_newer): None,
        wire.frame(2, written_newer + b"\x02"): f"{invalid}: bytes are left over after the record",
        wire.frame(1, written_newer): f"{invalid}: bytes are left over after the record",
        wire.frame(2, valid): invalid,
    }
    for cases, registered in ((plain, None), (framed, registry)):
        records = spark.createDataFrame([(v,) for v in cases], "value binary")
        rows = parse_and_explain(records, layout, "avro", wire_schemas=registered).collect()
        assert {bytes(r.value): r[ERROR] for r in rows} == cases
        for row in rows:
            if row[ERROR] is None:
                decoded = row[EVENT].asDict(recursive=True)
                assert decoded["playback_id"] == event["playback_id"]
                assert decoded["account_id"] == event["account_id"]
                assert decoded["device"] == event["device"]


def test_the_strict_json_parse_at_its_edges(spark: SparkSession) -> None:
    """The nesting limit to the level, numbers no timestamp can hold, blanks, a BOM, escaped key names."""
    schema = load_event_schema("playback")
    layout = ArchiveLayout(schema, table="playback")
    valid = schema.encode(next(EventModel(seed=1).events("playback")).event, "json")
    event = json.loads(valid)

    def nested(depth: int) -> bytes:
        """The event with an unknown member of arrays, `depth` levels deep counting the event's object."""
        return valid[:-1] + b',"x":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"

    cases = {
        nested(MAX_JSON_DEPTH): None,
        nested(MAX_JSON_DEPTH + 1): f"JSON nested deeper than {MAX_JSON_DEPTH} levels",
        json.dumps({**event, "event_ts": 10**30}).encode(): "field 'event_ts' is not of type timestamp",
        json.dumps({**event, "event_ts": -5}).encode(): (
            "field 'event_ts' is out of range: send ISO-8601 text, not a number of milliseconds"
        ),
        b"  \n ": "malformed JSON",
        b"\xef\xbb\xbf" + valid: "malformed JSON",
        valid.decode().encode("utf-16-le"): "malformed JSON",  # Jackson would read it; Spark reads UTF-8
        valid.replace(b'"country"', b'"c\\u006fu\\u006etry"'): None,
        b'{"a":1,"b":{"c":[{"d":1,"d":2}]}}': "a nested JSON object has the same key twice",
    }
    half_a_pair = "a JSON string holds half of a UTF-16 surrogate pair, which is not text"
    for escaped, reason in (
        (rb"\uD83D\uDE00", None),
        (rb"\ud83d\ude00\ud83d\ude00", None),
        (rb"\ude00", half_a_pair),
        (rb"\ude00\ud83d", half_a_pair),
        (rb"\ud83d\u0041", half_a_pair),
        (rb"\ud83d", half_a_pair),
        (rb"\\ud800", half_a_pair),  # a backslash, then text that reads as an escape: refused whole
        (rb"\ud83", "malformed JSON"),  # not four hexadecimal digits: no escape at all
    ):
        cases[valid.replace(b'"country":"', b'"country":"' + escaped, 1)] = reason
    records = spark.createDataFrame([(v,) for v in cases], "value binary")
    errors = {
        bytes(r.value): r.error
        for r in parse_and_explain(records, layout, "json").select("value", ERROR).collect()
    }
    assert errors == cases


def test_avro_strings_must_be_utf8(spark: SparkSession) -> None:
    schema = load_event_schema("impression")
    layout = ArchiveLayout(schema, table="impression")
    event = next(EventModel(seed=1).events("impression")).event
    valid = schema.encode({**event, "country": "ZZ"}, "avro")
    latin1 = valid.replace(b"\x04ZZ", b"\x04Z\xe9")
    assert latin1 != valid
    records = spark.createDataFrame([(valid,), (latin1,)], "value binary")
    errors = [r.error for r in parse_and_explain(records, layout, "avro").select(ERROR).collect()]
    assert errors == [None, "field 'country' is not valid UTF-8"]


def test_an_oversize_value_is_dead_lettered_whatever_it_holds(spark: SparkSession) -> None:
    schema = load_event_schema("playback")
    layout = ArchiveLayout(schema, table="playback")
    event = next(EventModel(seed=1).events("playback")).event
    small = schema.encode(event, "json")
    large = schema.encode({**event, "country": "X" * 5000}, "json")
    records = spark.createDataFrame([(small,), (large,)], "value binary")
    errors = [
        r.error
        for r in parse_and_explain(records, layout, "json", max_value_bytes=4096).select(ERROR).collect()
    ]
    assert errors == [None, f"value of {len(large)} bytes is over the limit of 4096"]


KAFKA_RECORDS = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>"
)


@pytest.mark.parametrize(
    ("kind", "encoding", "decoders"),
    [
        ("playback", "json", ("bergstream_strict_json_",)),
        ("impression", "avro", ("bergstream_strict_avro_",)),
    ],
)
def test_filtering_archive_and_dead_letter_rows_decodes_each_value_once(
    spark: SparkSession, kind: str, encoding: Encoding, decoders: tuple[str, ...]
) -> None:
    layout = ArchiveLayout(load_event_schema(kind), table=kind)
    splitter = RecordSplitter(layout, encoding, cluster="test", max_value_bytes=1 << 20)
    stamped = splitter.stamp(spark.createDataFrame([], KAFKA_RECORDS))
    for rows in (
        splitter.archive_rows(stamped, Observation("archive"), observed_columns(spark)),
        splitter.dead_letter_rows(stamped, Observation("dead-letters")),
    ):
        plan = rows._jdf.queryExecution().optimizedPlan().toString()
        assert all(plan.count(decoder) == 1 for decoder in decoders), plan[:2000]
    # Without the observation in between, Spark would decode once per check of the error expression.
    parsed = splitter.parser.parse(spark.createDataFrame([], KAFKA_RECORDS))
    filtered = parsed.where(splitter.valid).select(f"{EVENT}.*")
    assert filtered._jdf.queryExecution().optimizedPlan().toString().count(decoders[0]) > 1


@pytest.mark.parametrize(("kind", "encoding"), [("playback", "json"), ("impression", "avro")])
def test_each_projection_of_a_batch_runs_in_generated_code(
    spark: SparkSession, kind: str, encoding: Encoding
) -> None:
    """No expression of the parse, the stamp and the archive row keeps its projection out of whole-stage
    code generation, where each record's row would be built apart and read again by the next stage. (The
    dead-letter rows' reason may: it runs on dead letters only.)"""
    layout = ArchiveLayout(load_event_schema(kind), table=kind)
    splitter = RecordSplitter(layout, encoding, cluster="test", max_value_bytes=1 << 20)
    stamped = splitter.stamp(spark.createDataFrame([], KAFKA_RECORDS))
    rows = splitter.archive_rows(stamped, Observation("archive"), observed_columns(spark))
    plan = rows._jdf.queryExecution().executedPlan().toString()
    projects = [line for line in plan.splitlines() if "Project [" in line]
    assert projects and all("*(" in line for line in projects), plan[:3000]


def _compilations(spark: SparkSession) -> int:
    """How many classes Spark's code generator has compiled in this JVM so far."""
    codegen = getattr(spark._jvm.org.apache.spark.metrics.source, "CodegenMetrics$")  # type: ignore[union-attr]
    return int(codegen.__getattr__("MODULE$").METRIC_COMPILATION_TIME().getCount())


@pytest.mark.parametrize(("kind", "encoding"), [("playback", "json"), ("impression", "avro")])
def test_a_micro_batch_runs_the_code_an_earlier_one_compiled(
    spark: SparkSession, kind: str, encoding: Encoding
) -> None:
    """Nothing in the stamped rows changes the generated code from batch to batch (a literal write
    time would): a batch compiles nothing, and its records run code the JIT has already compiled. The
    write time is still one value per batch."""
    schema = load_event_schema(kind)
    layout = ArchiveLayout(schema, table=kind)
    splitter = RecordSplitter(layout, encoding, cluster="test", max_value_bytes=1 << 20)
    events = EventModel(seed=5).events(kind)
    now = datetime.now(UTC).replace(tzinfo=None)
    rows: list[tuple[Any, ...]] = [
        (b"k", schema.encode(next(events).event, encoding), kind, 0, offset, now, 0, [])
        for offset in range(20)
    ]

    def batch() -> tuple[int, list[Any]]:
        before = _compilations(spark)
        stamped = splitter.stamp(spark.createDataFrame(rows, KAFKA_RECORDS))
        written = splitter.archive_rows(stamped, Observation(), observed_columns(spark))
        archived = written.select("__metadata__.router_write_ts").collect()
        return _compilations(spark) - before, [r.router_write_ts for r in archived]

    batch()
    time.sleep(0.05)
    started = datetime.now(UTC).replace(tzinfo=None)
    compiled, written_at = batch()
    assert len(written_at) == len(rows) and len(set(written_at)) == 1, written_at[:3]
    assert started - timedelta(seconds=1) <= written_at[0] <= datetime.now(UTC).replace(tzinfo=None)
    assert compiled == 0


# Every type a schema can give a field (schemas/spark_types.py), for the strict decoder against from_json.
EVERY_TYPE = T.StructType(
    [
        T.StructField("s", T.StringType()),
        T.StructField("b", T.BooleanType()),
        T.StructField("i", T.IntegerType()),
        T.StructField("l", T.LongType()),
        T.StructField("f", T.FloatType()),
        T.StructField("d", T.DoubleType()),
        T.StructField("bin", T.BinaryType()),
        T.StructField("t", T.TimestampType()),
        T.StructField("dt", T.DateType()),
        T.StructField(
            "n", T.StructType([T.StructField("x", T.StringType()), T.StructField("t", T.TimestampType())])
        ),
        T.StructField("a", T.ArrayType(T.IntegerType())),
        T.StructField("m", T.MapType(T.StringType(), T.LongType())),
        T.StructField("as", T.ArrayType(T.StructType([T.StructField("x", T.LongType())]))),
    ]
)
# JSON texts of every kind of token, and of the strings Spark's readers of each type take or refuse.
TOKENS = [
    "null", "true", "false", "0", "-0", "1", "-17", "2147483647", "2147483648", "-2147483649",
    "9223372036854775807", "9223372036854775808", "1e2", "1.50", "0.1e-2", "3.5e39", "1.7976931348623157E309",
    '""', '"x"', '"1"', '"true"', '"NaN"', '"aGVsbG8="', '"!!"', '"2026-11-22"', '"2026-11-22T05:06:07Z"',
    '"2026-11-22 05:06:07.123456789+02:00"', '"2026-11-22T00:00:00GMT"', '" 2026-11-22T00:00:00Z "',
    '"2026-11-22T00:00"', '"T00:00"', '"99"', '"x\\u00e9\\ud83d\\ude00\\n\\/"', "1700000000",
    '"2024-02-29T23:59:59.999999Z"', '"2026-02-29T00:00:00Z"', '"2026-11-22T05:06:07.5Z"',
    '"1969-12-31T23:59:59.5Z"', '"2026-11-22T24:00:00Z"', '"2026-11-22T05:06:07.1234567Z"',
    '"2026-11-22T05:06:07.Z"', '"2026-11-22T05:06:60Z"', '"2026-11-22t05:06:07Z"', '"2026-1-22T05:06:07Z"',
    '"xé✓ café"',
    "[]", "[1, null, 3]", '[1, "2"]', '[{"x": 1}, {"x": null}, {}]', "{}", '{"x" : "y",  "t": 1}',
    '{"x": {"y": [1, 2.5, "z"]}}', '{"k": 1, "j": null}', '{"k": "1"}',
]  # fmt: skip


def test_the_strict_decoder_reads_each_type_as_from_json_does(spark: SparkSession) -> None:
    """Each kind of JSON token in each field of every type, and the yardstick events: whatever Spark's own
    reader takes, the strict decoder takes with the same value, and whatever it refuses, the decoder
    refuses."""
    cases: dict[str, tuple[T.StructType, list[str]]] = {
        "every type": (
            EVERY_TYPE,
            [
                f'{{"{field.name}": {token}, "s": "other"}}' if field.name != "s" else f'{{"s": {token}}}'
                for field in EVERY_TYPE.fields
                for token in TOKENS
            ],
        )
    }
    for kind in ("playback", "impression"):
        event_schema = load_event_schema(kind)
        events = [event_schema.encode(generated.event, "json").decode() for _, generated in
                  zip(range(200), EventModel(seed=3).events(kind), strict=False)]  # fmt: skip
        first = json.loads(events[0])
        event_type = record_to_struct(event_schema.avro)
        for field in event_type.fields:
            others = json.dumps({name: value for name, value in first.items() if name != field.name})
            events += [f'{others[:-1]}, "{field.name}": {token}}}' for token in TOKENS]
        cases[kind] = (event_type, events)
    compared = 0
    for name, (event_type, texts) in cases.items():
        decoder = StrictJson(
            event_type, [f.name for f in event_type.fields if isinstance(f.dataType, T.TimestampType)]
        )
        rows = (
            spark.createDataFrame([(text.encode(),) for text in texts], "value binary")
            .select(
                "value",
                decoder.column(spark, F.col("value")).alias("strict"),
                lenient_json(event_type, F.col("value").cast("string")).alias("lenient"),
            )
            .collect()
        )
        for row in rows:
            lenient = row.lenient.asDict(recursive=True)
            value = f"{name}: {bytes(row.value)!r}"
            if lenient.pop(CORRUPT_RECORD) is not None:
                assert row.strict.status == -1, f"{value}: from_json refuses it, the decoder took it"
            else:
                # A timestamp field sent as a number outside 2000 to 2200 is decoded and flagged (status > 0).
                assert row.strict.status >= 0, f"{value}: status {row.strict.status}"
                assert row.strict.event.asDict(recursive=True) == lenient, value
            compared += 1
    assert compared == sum(len(texts) for _, texts in cases.values()) > 1000


def test_a_row_is_made_in_its_table_s_column_order_a_column_it_lacks_null(spark: SparkSession) -> None:
    frame = spark.createDataFrame([(1, "x", 7)], "a int, b string, c int")
    row = F.struct("a", F.struct(F.col("b"), F.col("c")).alias("n"))
    have = frame.select(row.alias("r")).schema["r"].dataType
    nested = [T.StructField("c", T.IntegerType()), T.StructField("b", T.StringType()),
              T.StructField("gone", T.LongType())]  # fmt: skip
    want = T.StructType([T.StructField("n", T.StructType(nested)), T.StructField("a", T.IntegerType())])
    made = frame.select(in_table_order(row, have, want).alias("r"))
    assert made.schema["r"].dataType.simpleString() == "struct<n:struct<c:int,b:string,gone:bigint>,a:int>"
    assert made.first()["r"].asDict(recursive=True) == {"n": {"c": 7, "b": "x", "gone": None}, "a": 1}
    # The table requires a column the row lacks, or lacks one the row holds: the row as it is.
    required = T.StructType([*want.fields, T.StructField("must", T.IntegerType(), nullable=False)])
    assert frame.select(in_table_order(row, have, required).alias("r")).schema["r"].dataType == have
    narrower = T.StructType([want.fields[0]])
    assert frame.select(in_table_order(row, have, narrower).alias("r")).schema["r"].dataType == have


def test_a_nested_timestamp_out_of_range_is_dead_lettered_with_its_path(spark: SparkSession) -> None:
    """A timestamp inside a nested record is range-checked as a top-level one is: milliseconds sent as a
    JSON number for it land tens of thousands of years away, and go to the dead-letter table by name."""
    playback = load_event_schema("playback").avro
    watched = {"type": "record", "name": "Watched", "fields": [
        {"name": "until", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ]}  # fmt: skip
    avro = dict(playback, fields=[*playback["fields"], {"name": "watched", "type": ["null", watched],
                                                        "default": None}])  # fmt: skip
    schema = EventSchema(name="playback", avro=avro, source="a test's schema")
    layout = ArchiveLayout(schema, table="playback")
    event = next(EventModel(seed=1).events("playback")).event
    at = datetime(2026, 11, 30, 12, tzinfo=UTC)
    out_of_range = "field 'watched.until' is out of range: before 2000 or after 2200"
    as_text = json.loads(schema.encode({**event, "watched": {"until": at}}, "json"))
    json_cases = {
        json.dumps(as_text).encode(): None,
        json.dumps({**as_text, "watched": {"until": int(at.timestamp() * 1000)}}).encode(): out_of_range,
        json.dumps({**as_text, "watched": None}).encode(): None,
    }
    far = datetime(9000, 1, 1, tzinfo=UTC)
    avro_cases = {
        schema.encode({**event, "watched": {"until": at}}, "avro"): None,
        schema.encode({**event, "watched": {"until": far}}, "avro"): out_of_range,
    }
    runs: list[tuple[Encoding, dict[bytes, str | None]]] = [("json", json_cases), ("avro", avro_cases)]
    for encoding, cases in runs:
        records = spark.createDataFrame([(v,) for v in cases], "value binary")
        rows = parse_and_explain(records, layout, encoding).select("value", ERROR).collect()
        assert {bytes(r.value): r[ERROR] for r in rows} == cases, encoding
