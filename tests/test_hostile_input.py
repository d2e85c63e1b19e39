"""Hostile records: each is dead-lettered with its reason, the router never fails, its memory stays bounded.

One router run per encoding reads every kind of hostile value between valid records, in a process of its
own with a small heap, while its peak resident memory is sampled.
"""

from __future__ import annotations

import functools
import itertools
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bergstream.loadgen.events import EventModel
from bergstream.schemas import load_event_schema
from bergstream.schemas.event_schema import Encoding, EventSchema
from bergstream.schemas.json_decode import MAX_JSON_DEPTH
from tests.routers import ROOT, router_command, write_config
from tests.services import Services

pytestmark = pytest.mark.integration

MAX_VALUE_BYTES = 8 * 1024 * 1024  # the router's default
TEN_MB = 10 * 1024 * 1024
# Kafka's default limit is about 1 MB: the topic and the producer take 16 MiB here.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
HEAP = "512m"
# Measured: 0.8 GB for the JVM with a heap of 512 MB, 0.1 GB for the driver.
JVM_RSS_LIMIT = 1536 * 1024 * 1024
DRIVER_RSS_LIMIT = 512 * 1024 * 1024
CLOCK_START = datetime(2026, 1, 1, tzinfo=UTC)
# Another schema's record that does not decode whole fails at some field: the reason depends on its bytes.
NOT_AN_IMPRESSION = "not an impression"
NOT_AN_IMPRESSION_REASONS = (
    "not a valid Avro impression record",
    "not a valid Avro impression record: bytes are left over after the record",
    "field 'page' is not valid UTF-8",
    "field 'event_ts' is out of range: before 2000 or after 2200",
)
SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
UNEVEN_HEADERS: list[tuple[str, str | bytes | None]] = [
    ("trace", b"\xff\xfe\x00 not UTF-8"),
    ("empty", b""),
    ("none", None),
]


Hostile = tuple[str, bytes, str | None]  # kind, value, reason


@dataclass(frozen=True)
class Record:
    kind: str
    value: bytes | None
    reason: str | None  # None: a valid event, archived
    key: bytes | None = b"1"
    headers: list[tuple[str, str | bytes | None]] = field(default_factory=list)


def _events(topic: str) -> Any:
    ticks = itertools.count()
    return EventModel(seed=7, clock=lambda: CLOCK_START + timedelta(milliseconds=7 * next(ticks))).events(
        topic
    )


def _zigzag(number: int) -> bytes:
    """An Avro long of any size, as a producer that does not check would write it."""
    encoded, rest = bytearray(), number << 1 if number >= 0 else (-number << 1) - 1
    while rest > 0x7F:
        encoded.append(rest & 0x7F | 0x80)
        rest >>= 7
    encoded.append(rest)
    return bytes(encoded)


def _json_records(schema: EventSchema) -> list[Record]:
    events = _events(schema.name)
    event = next(events).event
    valid = schema.encode(event, "json")

    def with_member(member: bytes) -> bytes:
        return valid[:-1] + b"," + member + b"}"

    def replacing(name: str, raw: bytes) -> bytes:
        return schema.encode({**event, name: "\x00"}, "json").replace(b'"\\u0000"', raw)

    deep, deep_objects = b"[" * 10_000 + b"]" * 10_000, b'{"a":' * 10_000 + b"1" + b"}" * 10_000
    micros = int(CLOCK_START.timestamp()) * 10**6
    # A timestamp sent in nanoseconds that Spark's unchecked multiplication by a million wraps into 2026.
    wrapped = (micros // 64) * pow(15625, -1, 1 << 58) % (1 << 58) + (20 << 58)
    impression = load_event_schema("impression").encode(next(_events("impression")).event, "json")
    oversize = schema.encode({**event, "country": "X" * TEN_MB}, "json")
    too_deep, not_numbers = (
        f"JSON nested deeper than {MAX_JSON_DEPTH} levels",
        "NaN and Infinity are not JSON numbers",
    )
    control, left_over = (
        "a control character is not escaped in the JSON text",
        "bytes are left over after the JSON object",
    )
    hostile: list[Hostile] = [
        ("10 MB value", oversize, f"value of {len(oversize)} bytes is over the limit of {MAX_VALUE_BYTES}"),
        ("nested 10,000 deep", with_member(b'"x":' + deep), too_deep),
        ("objects nested 10,000 deep", with_member(b'"x":' + deep_objects), too_deep),
        ("NaN", replacing("position_sec", b"NaN"), not_numbers),
        ("Infinity, unknown field", with_member(b'"rate":-Infinity'), not_numbers),
        ("duplicate key", with_member(b'"account_id":1'), "key 'account_id' comes twice in the JSON object"),
        ("duplicate nested key", valid.replace(b'"device":{', b'"device":{"os":"x",'),
         "a nested JSON object has the same key twice"),
        ("number beyond 64 bits", replacing("account_id", str(1 << 64).encode()),
         "field 'account_id' is not of type bigint"),
        ("number beyond 32 bits", replacing("profile_id", str(1 << 32).encode()),
         "field 'profile_id' is not of type int"),
        ("timestamp that wraps around", replacing("event_ts", str(wrapped).encode()),
         "field 'event_ts' is out of range: send ISO-8601 text, not a number of milliseconds"),
        ("control character", replacing("country", b'"U\x01S"'), control),
        ("NUL", replacing("country", b'"US\x00"'), control),
        ("half a surrogate pair", replacing("country", b'"\\ud83dUS"'),
         "a JSON string holds half of a UTF-16 surrogate pair, which is not text"),
        ("two objects", valid + b"\n" + valid, left_over),
        ("an object, a bracket, an object", valid + b"]" + valid, left_over),
        ("single quotes", valid.replace(b'"country"', b"'country'"), "malformed JSON"),
        ("another topic's event", impression, "required field 'playback_id' is missing or null"),
    ]  # fmt: skip
    tricky_valid = [
        ("escaped control character and emoji", schema.encode({**event, "country": "\x01😀]"}, "json")),
        ("largest long", schema.encode({**event, "account_id": (1 << 63) - 1}, "json")),
        ("epoch seconds", replacing("event_ts", str(int(CLOCK_START.timestamp())).encode())),
        ("blank after the object", valid + b"\r\n"),
    ]
    return _around_valid(schema, "json", events, hostile, tricky_valid)


def _avro_records(schema: EventSchema) -> list[Record]:
    events = _events(schema.name)
    event = next(events).event
    valid = schema.encode(event, "avro")
    id_length, account = _zigzag(len(event["impression_id"])), _zigzag(event["account_id"])
    assert valid.startswith(id_length)
    after_account = len(id_length) + len(event["impression_id"]) + len(account)
    millis = _zigzag(int(event["event_ts"].timestamp() * 1000))
    assert valid.count(millis) == 1
    oversize = schema.encode({**event, "page": "P" * TEN_MB}, "avro")
    huge_account = valid[: after_account - len(account)] + _zigzag(1 << 70) + valid[after_account:]
    latin1 = schema.encode({**event, "country": "ZZ"}, "avro").replace(b"\x04ZZ", b"\x04Z\xe9")
    invalid = f"not a valid Avro {schema.name} record"
    hostile: list[Hostile] = [
        ("10 MB value", oversize, f"value of {len(oversize)} bytes is over the limit of {MAX_VALUE_BYTES}"),
        ("length of 2 GB", _zigzag((1 << 31) - 1) + valid[len(id_length) :], invalid),
        ("length of 16 MB", _zigzag(16_000_000) + valid[len(id_length) :], invalid),
        ("negative length", _zigzag(-5) + valid[len(id_length) :], invalid),
        ("long beyond 64 bits", huge_account, invalid),
        ("milliseconds past the year 146 million", valid.replace(millis, _zigzag(1 << 62)), invalid),
        ("text not UTF-8", latin1, "field 'country' is not valid UTF-8"),
    ]  # fmt: skip
    hostile += _other_topic(schema)
    tricky_valid = [
        ("control characters and emoji", schema.encode({**event, "country": "\x00\x01😀"}, "avro")),
        ("largest long", schema.encode({**event, "account_id": (1 << 63) - 1}, "avro")),
    ]
    return _around_valid(schema, "avro", events, hostile, tricky_valid)


def _other_topic(schema: EventSchema) -> list[Hostile]:
    """Playback events on the impression topic: a few decode into a whole impression, timestamp and all."""
    playback = load_event_schema("playback")
    values = [playback.encode(g.event, "avro") for g in itertools.islice(_events("playback"), 20_000)]
    decoding = [value for value in values if _decodes_whole(schema, value)]
    assert decoding, "no playback event decodes into an impression"
    out_of_range = "field 'event_ts' is out of range: before 2000 or after 2200"
    return [
        *[("playback event decoding whole", value, out_of_range) for value in decoding[:5]],
        *[("playback event", value, NOT_AN_IMPRESSION) for value in values[:20] if value not in decoding],
    ]


def _decodes_whole(schema: EventSchema, value: bytes) -> bool:
    try:
        decoded = schema.decode(value, "avro")
    except Exception:  # fastavro reports bad input as EOFError, UnicodeDecodeError, ...
        return False
    ints = [f["name"] for f in schema.fields if f["type"] == "int"]
    fits = all(-(1 << 31) <= decoded[name] < 1 << 31 for name in ints)  # fastavro reads any long as int
    return fits and schema.encode(decoded, "avro") == value


def _around_valid(
    schema: EventSchema,
    encoding: Encoding,
    events: Any,
    hostile: list[Hostile],
    tricky_valid: list[tuple[str, bytes]],
) -> list[Record]:
    """Each hostile value between two valid ones; keys empty, null, not UTF-8; header values not UTF-8."""
    keys = itertools.cycle([b"", None, b"\xff\x00key", b"42"])
    records: list[Record] = []
    for kind, value, reason in hostile:
        records.append(
            Record("valid", schema.encode(next(events).event, encoding), None, next(keys), UNEVEN_HEADERS)
        )
        records.append(Record(kind, value, reason, next(keys), UNEVEN_HEADERS))
    records += [Record(kind, value, None, next(keys), UNEVEN_HEADERS) for kind, value in tricky_valid]
    records.append(Record("valid", schema.encode(next(events).event, encoding), None, None, []))
    return records


def produce_records(stack: Services, topic: str, records: list[Record]) -> dict[tuple[int, int], Record]:
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    config = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1, config=config)])[
        topic
    ].result(30)
    producer = Producer(
        {"bootstrap.servers": stack.bootstrap_servers, "message.max.bytes": MAX_MESSAGE_BYTES}
    )
    sent: dict[tuple[int, int], Record] = {}

    def delivered(record: Record, error: KafkaError | None, message: Message) -> None:
        partition, offset = message.partition(), message.offset()
        assert error is None and partition is not None and offset is not None, f"{record.kind}: {error}"
        sent[(partition, offset)] = record

    for index, record in enumerate(records):
        producer.produce(
            topic, value=record.value, key=record.key, headers=record.headers, partition=index // 2 % 2,
            on_delivery=functools.partial(delivered, record),
        )  # fmt: skip
        producer.poll(0)
    assert producer.flush(60) == 0
    assert len(sent) == len(records)
    return sent


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    peak_rss: dict[str, int]  # by command name: java, python3.11, ...


def run_measured(command: list[str], timeout: float = 300) -> Finished:
    """Run `command`, sampling the peak resident memory (VmHWM) of it and of every process it starts."""
    peaks: dict[int, tuple[str, int]] = {}
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as run:
        deadline = time.monotonic() + timeout
        while run.poll() is None:
            assert time.monotonic() < deadline, "the router did not finish"
            for pid in _process_tree(run.pid):
                sample = _peak_rss(pid)
                if sample is not None:
                    peaks[pid] = sample
            time.sleep(0.2)
        stdout, stderr = run.communicate()
    by_name: dict[str, int] = {}
    for name, peak in peaks.values():
        by_name[name] = max(by_name.get(name, 0), peak)
    return Finished(run.returncode, stdout, stderr, by_name)


def _process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending += children.get(pid, [])
    return tree


def _peak_rss(pid: int) -> tuple[str, int] | None:
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return name, int(line.split()[1]) * 1024
    return None


@pytest.mark.parametrize(("kind", "encoding"), [("playback", "json"), ("impression", "avro")])
def test_hostile_values_are_dead_lettered_with_reasons_in_bounded_memory(
    stack: Services, topic_name: str, tmp_path: Path, kind: str, encoding: Encoding
) -> None:
    schema = load_event_schema(kind)
    records = _json_records(schema) if encoding == "json" else _avro_records(schema)
    sent = produce_records(stack, topic_name, records)
    config = write_config(
        stack, tmp_path, topic_name, schema=kind, encoding=encoding, max_offsets_per_trigger=25,
        spark={"master": "local[2]", "conf": {**SPARK_CONF, "spark.driver.memory": HEAP}},
    )  # fmt: skip

    done = run_measured(router_command(topic_name, config, "--available-now"))

    assert done.returncode == 0, done.stderr[-3000:]
    dead = [r for r in records if r.reason is not None]
    assert (
        f"read {len(records):,}, archived {len(records) - len(dead):,}, dead-lettered {len(dead):,}"
        in done.stdout
    )
    assert done.peak_rss["java"] < JVM_RSS_LIMIT, done.peak_rss
    assert max(peak for name, peak in done.peak_rss.items() if name.startswith("python")) < DRIVER_RSS_LIMIT

    catalog = stack.catalog.load()
    archived = catalog.load_table(f"{stack.catalog.namespace}.{topic_name}").scan().to_arrow().to_pylist()
    dead_letters = (
        catalog.load_table(f"{stack.catalog.namespace}.{topic_name}__dlq").scan().to_arrow().to_pylist()
    )
    seen = [(r["__metadata__"]["partition"], r["__metadata__"]["offset"]) for r in archived + dead_letters]
    assert len(seen) == len(set(seen)) == len(sent), "every (partition, offset) exactly once"
    assert set(seen) == set(sent)

    for row in dead_letters:
        metadata = row["__metadata__"]
        record = sent[(metadata["partition"], metadata["offset"])]
        assert record.reason is not None, f"a {record.kind} record was dead-lettered: {row['error']}"
        if record.reason == NOT_AN_IMPRESSION:
            assert row["error"] in NOT_AN_IMPRESSION_REASONS, row["error"]
        else:
            assert row["error"] == record.reason, record.kind
        assert (row["raw_key"], row["raw_value"]) == (record.key, record.value), record.kind
        assert metadata["key"] == record.key
        assert [(h["key"], h["value"]) for h in metadata["headers"]] == record.headers
    for row in archived:
        metadata = row["__metadata__"]
        record = sent[(metadata["partition"], metadata["offset"])]
        assert record.reason is None, f"a {record.kind} record was archived"
        assert metadata["key"] == record.key
        assert [(h["key"], h["value"]) for h in metadata["headers"]] == record.headers
        assert record.value is not None
        event = _decoded(schema, encoding, record.value)
        assert {name: row[name] for name in event} == event, record.kind


def _decoded(schema: EventSchema, encoding: Encoding, value: bytes) -> dict[str, Any]:
    """The event as the archive holds it: timestamps as instants."""
    event = schema.decode(value, encoding)
    for field_schema in schema.fields:
        if isinstance(field_schema["type"], dict) and field_schema["type"].get("logicalType", "").startswith(
            "timestamp"
        ):
            stamp = event[field_schema["name"]]
            if isinstance(stamp, str):
                stamp = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            elif isinstance(stamp, int):
                stamp = datetime.fromtimestamp(stamp, UTC)
            event[field_schema["name"]] = stamp
    return event
