"""`bergstream produce`: realistic events into a Kafka topic, at a chosen rate, some late, some malformed."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bergstream.errors import BergstreamError, ConfigError
from bergstream.kafka_topics import DeliveryFailed, RecordProducer, ensure_topic
from bergstream.loadgen.events import TOPICS, EventModel
from bergstream.loadgen.malformed import malform
from bergstream.schemas import wire
from bergstream.schemas.event_schema import ENCODINGS, Encoding, EventSchema, load_event_schema
from bergstream.schemas.json_schema import json_schema_from_avro
from bergstream.schemas.schema_registry import SCHEMA_TYPES, SchemaRegistrySettings, register


@dataclass(frozen=True)
class ProduceRequest:
    topic: str
    count: int
    schema: str | None = None
    rate: float | None = None
    late_fraction: float = 0.0
    bad_fraction: float = 0.0
    encoding: Encoding = "json"
    seed: int = 0
    partitions: int = 4
    # Stamp records as if they had arrived over [ingestion_start, ingestion_start + ingestion_span), spread
    # evenly: the Kafka record timestamp, and the clock of the events' own times. Archives of past days
    # are made this way for backfills.
    ingestion_start: datetime | None = None
    ingestion_span: timedelta | None = None
    # With ingestion_start: each record's Kafka timestamp (CreateTime) up to this much earlier than its
    # ingestion time, at random, never before ingestion_start, so that timestamps go backwards inside a
    # partition as when producers' clocks disagree. The events' own times keep the ingestion clock.
    timestamp_jitter: timedelta | None = None
    # Values in the registry's wire format, under the schema registered for the topic's subject.
    schema_registry: SchemaRegistrySettings | None = None

    def __post_init__(self) -> None:
        if self.event_kind not in TOPICS:
            hint = "" if self.schema else "; name the kind of event with --schema"
            known = ", ".join(TOPICS)
            raise ConfigError(
                f"unknown topic {self.event_kind!r}: the load generator makes {known} events{hint}"
            )
        if self.count < 0:
            raise ConfigError(f"--count {self.count}: give a number of events, 0 or more")
        if self.rate is not None and self.rate <= 0:
            raise ConfigError(
                f"--rate {self.rate}: give events per second above 0, or leave it out for no limit"
            )
        for name, fraction in (
            ("--late-fraction", self.late_fraction),
            ("--bad-fraction", self.bad_fraction),
        ):
            if not 0.0 <= fraction <= 1.0:
                raise ConfigError(f"{name} {fraction}: give a fraction between 0 and 1")
        if self.encoding not in ENCODINGS:
            raise ConfigError(f"--encoding {self.encoding!r}: use one of {', '.join(ENCODINGS)}")
        if self.partitions < 1:
            raise ConfigError(f"--partitions {self.partitions}: a topic needs at least one partition")
        if (self.ingestion_start is None) != (self.ingestion_span is None):
            raise ConfigError("--ingestion-start and --ingestion-span go together: give both or neither")
        if self.ingestion_start is not None and self.ingestion_start.tzinfo is None:
            raise ConfigError("--ingestion-start needs a time zone, for example 2026-11-20T00:00:00Z")
        if self.ingestion_span is not None and self.ingestion_span <= timedelta(0):
            raise ConfigError(f"--ingestion-span {self.ingestion_span}: give a positive duration")
        if self.timestamp_jitter is not None:
            if self.ingestion_start is None:
                raise ConfigError(
                    "--timestamp-jitter moves the timestamps --ingestion-start gives: give both"
                )
            if self.timestamp_jitter <= timedelta(0):
                raise ConfigError(f"--timestamp-jitter {self.timestamp_jitter}: give a positive duration")
        if self.ingestion_start is not None and self.rate is not None:
            raise ConfigError("--rate paces records in real time; it cannot go with --ingestion-start")

    def ingestion_time(self, index: int) -> datetime | None:
        """The ingestion time of record `index` of a historical run; None for records stamped now."""
        if self.ingestion_start is None or self.ingestion_span is None:
            return None
        return self.ingestion_start + self.ingestion_span * (index / max(self.count, 1))

    def record_timestamp(self, ingested: datetime, draw: float) -> datetime:
        """The Kafka timestamp of a record ingested at `ingested`: that time, or with a jitter, `draw` (in
        [0, 1)) of the jitter earlier, but not before `ingestion_start`."""
        if self.timestamp_jitter is None or self.ingestion_start is None:
            return ingested
        return max(self.ingestion_start, ingested - self.timestamp_jitter * draw)

    @property
    def event_kind(self) -> str:
        """Which events to make: the schema's name, by default the topic's."""
        return self.schema or self.topic


@dataclass
class ProduceReport:
    topic: str
    bootstrap_servers: str
    encoding: Encoding
    sent: int = 0
    late: int = 0
    malformed: Counter[str] = field(default_factory=Counter)
    value_bytes: int = 0
    seconds: float = 0.0
    per_partition: Counter[int] = field(default_factory=Counter)
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        bad = sum(self.malformed.values())
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.malformed.items())) or "none"
        partitions = ", ".join(f"p{p}: {n}" for p, n in sorted(self.per_partition.items()))
        return (
            f"sent {self.sent} {self.encoding} records to {self.topic} on {self.bootstrap_servers} "
            f"in {self.seconds:.1f}s ({self.rate:,.0f} records/s, "
            f"{self.value_bytes / 1e6:.1f} MB of values)\n"
            f"  late (out-of-order event time): {self.late}\n"
            f"  malformed: {bad} ({kinds})\n"
            f"  per partition: {partitions}"
        )


def registered_id(request: ProduceRequest, schema: EventSchema) -> int | None:
    """With a schema registry, the id of the event's schema registered under the topic's subject: the
    Avro schema, or for JSON its JSON Schema."""
    settings = request.schema_registry
    if settings is None:
        return None
    text = schema.avro_json if request.encoding == "avro" else json.dumps(json_schema_from_avro(schema.avro))
    return register(settings, settings.subject_of(request.topic), SCHEMA_TYPES[request.encoding], text)


def produce(
    request: ProduceRequest,
    bootstrap_servers: str,
    producer_config: dict[str, Any] | None = None,
    show_progress: bool = True,
) -> ProduceReport:
    """Send the records of `request`; `producer_config` (librdkafka's names) adds to and overrides the
    producer's defaults: the login and TLS of a secured cluster, tuning."""
    client_config = {**(producer_config or {}), "bootstrap.servers": bootstrap_servers}
    ensure_topic(client_config, request.topic, request.partitions)
    schema = load_event_schema(request.event_kind)
    schema_id = registered_id(request, schema)
    now: list[datetime] = [request.ingestion_start or datetime.now(UTC)]
    clock = (lambda: now[0]) if request.ingestion_start is not None else (lambda: datetime.now(UTC))
    model = EventModel(seed=request.seed, late_fraction=request.late_fraction, clock=clock)
    rng = random.Random(request.seed ^ 0x5EED)
    # Its own generator, so that a jitter moves timestamps only.
    jitter = random.Random(request.seed ^ 0x71773)
    report = ProduceReport(
        topic=request.topic, bootstrap_servers=bootstrap_servers, encoding=request.encoding
    )
    producer = RecordProducer(client_config)
    headers = [("producer", b"bergstream-loadgen"), ("encoding", request.encoding.encode())]
    started = time.monotonic()
    events = model.events(request.event_kind)
    try:
        with Progress(
            TextColumn(f"[bold]{request.topic}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>9,.0f} rec/s"),
            TimeElapsedColumn(),
            disable=not show_progress,
            transient=False,
        ) as progress:
            task = progress.add_task("produce", total=request.count, rate=0.0)
            for index in range(request.count):
                ingested = request.ingestion_time(index)
                if ingested is not None:
                    now[0] = ingested
                generated = next(events)
                value: bytes | None
                if request.bad_fraction and rng.random() < request.bad_fraction:
                    bad = malform(generated.event, schema, request.encoding, rng)
                    value = bad.value
                    report.malformed[bad.kind] += 1
                else:
                    value = schema.encode(generated.event, request.encoding)
                    report.late += generated.late
                if schema_id is not None and value is not None:
                    value = wire.frame(schema_id, value)
                timestamp_ms = 0
                if ingested is not None:
                    timestamp_ms = int(request.record_timestamp(ingested, jitter.random()).timestamp() * 1000)
                producer.send(request.topic, generated.key, value, headers, timestamp_ms)
                report.sent += 1
                report.value_bytes += len(value or b"")
                if request.rate is not None:
                    ahead = (index + 1) / request.rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
                if index % 2000 == 0 or index == request.count - 1:
                    producer.poll()
                    elapsed = time.monotonic() - started
                    progress.update(task, completed=index + 1, rate=(index + 1) / elapsed if elapsed else 0.0)
            producer.flush(60)
    except DeliveryFailed as error:
        if not error.undelivered:
            raise BergstreamError(
                f"sending to {request.topic} on {bootstrap_servers} failed: {error.reason}"
            ) from error
        raise BergstreamError(
            f"{error.undelivered} of {request.count} records were not delivered to {request.topic} "
            f"on {bootstrap_servers}: {error.reason}"
        ) from error
    finally:
        report.per_partition.update(producer.delivered)
        report.offsets.update(producer.offsets)
    report.seconds = time.monotonic() - started
    return report
