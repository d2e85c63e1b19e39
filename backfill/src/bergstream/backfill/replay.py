"""`bergstream backfill replay`: a window of the archive republished into a Kafka topic, in backfill order.

For consumers not written in Spark. Each record keeps its original key and headers; its value is encoded
as the original topic encodes it (JSON or Avro, from the table's `bergstream.encoding` and
`bergstream.schema` properties; for a topic with a schema registry, in the wire format with the value's
original schema id, the writer's schema fetched from the registry by that id); its timestamp is its
original ingestion time; and headers name where it
came from (`bergstream.source.topic`, `.partition`, `.offset`). With dead letters, the raw bytes go out as
they came in, with the reason in `bergstream.dead-letter.reason`.

Records are sent epoch by epoch by an idempotent producer, which is flushed at the end of every epoch: a
replay that fails says the last epoch delivered whole, and where to start again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bergstream.backfill.errors import BackfillConfigError, BackfillError
from bergstream.backfill.read.order import Epoch, OrderingPolicy, Window
from bergstream.backfill.read.planner import from_micros, plan, table_ref, to_micros
from bergstream.backfill.read.reader import TABLE_KEY, TableReader, epoch_batches
from bergstream.catalog import CatalogConfig
from bergstream.kafka_topics import DeliveryFailed, RecordProducer, ensure_topic, topic_partitions
from bergstream.schemas import wire
from bergstream.schemas.archive import (
    DEAD_LETTER_SUFFIX,
    ENCODING_PROPERTY,
    METADATA,
    SCHEMA_ID,
    SCHEMA_PROPERTY,
    SCHEMA_REGISTRY_PROPERTY,
    TOPIC_PROPERTY,
)
from bergstream.schemas.event_schema import ENCODINGS, Encoding, EventSchema, load_event_schema
from bergstream.schemas.schema_registry import SchemaRegistrySettings, schema_by_id
from bergstream.timeparse import format_instant

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("bergstream.backfill.replay")
SOURCE_TOPIC = "bergstream.source.topic"
SOURCE_PARTITION = "bergstream.source.partition"
SOURCE_OFFSET = "bergstream.source.offset"
DEAD_LETTER_REASON = "bergstream.dead-letter.reason"


@dataclass
class ReplayReport:
    topic: str
    records: int = 0
    dead_letters: int = 0
    epochs_done: int = 0
    epochs: int = 0
    watermark: str | None = None  # every record ingested before it has been delivered
    seconds: float = 0.0
    per_partition: dict[int, int] = field(default_factory=dict)

    def summary(self) -> str:
        rate = (self.records + self.dead_letters) / self.seconds if self.seconds else 0.0
        return (
            f"replayed {self.records:,} records and {self.dead_letters:,} dead letters into {self.topic} "
            f"in {self.seconds:.1f}s ({rate:,.0f} records/s), {self.epochs_done} epochs, "
            f"to watermark {self.watermark}"
        )


@dataclass(frozen=True)
class _Encoder:
    schema: EventSchema
    encoding: Encoding

    def __call__(self, row: dict[str, Any]) -> bytes:
        event = {f["name"]: row.get(f["name"]) for f in self.schema.fields}
        return self.schema.encode(event, self.encoding)


@dataclass
class _WireEncoder:
    """A registry topic's values: each row encoded with the schema of its original id, behind the header."""

    settings: SchemaRegistrySettings
    name: str
    encoding: Encoding
    identifier: str
    _writers: dict[int, EventSchema] = field(default_factory=dict)

    def _writer(self, schema_id: int) -> EventSchema:
        if schema_id not in self._writers:
            found = schema_by_id(self.settings, schema_id)
            if found is None:
                raise BackfillError(
                    f"table {self.identifier}: schema id {schema_id} is not in the schema registry at "
                    f"{self.settings.url} (a registry other than the one the router read?)"
                )
            self._writers[schema_id] = EventSchema(self.name, found.avro(self.name), f"schema id {schema_id}")
        return self._writers[schema_id]

    def __call__(self, row: dict[str, Any]) -> bytes:
        schema_id = (row.get(METADATA) or {}).get(SCHEMA_ID)
        if schema_id is None:
            raise BackfillError(
                f"table {self.identifier}: a row has no {METADATA}.{SCHEMA_ID}, so the schema its value was "
                "written with is not known"
            )
        writer = self._writer(int(schema_id))
        event = {f["name"]: row.get(f["name"]) for f in writer.fields}
        return wire.frame(int(schema_id), writer.encode(event, self.encoding))


def table_encoder(
    properties: dict[str, str],
    identifier: str,
    schema: str | None,
    encoding: str | None,
    schema_registry: SchemaRegistrySettings | None = None,
) -> _Encoder | _WireEncoder:
    """How the table's topic encodes values: the flags, else the properties the router set on the table."""
    encoding = encoding or properties.get(ENCODING_PROPERTY)
    schema = schema or properties.get(SCHEMA_PROPERTY)
    if encoding is None or schema is None:
        raise BackfillConfigError(
            f"table {identifier} does not say how its topic encodes values (properties {ENCODING_PROPERTY} "
            f"and {SCHEMA_PROPERTY}, set by routers since they record them): give --encoding and --schema"
        )
    if encoding not in ENCODINGS:
        raise BackfillConfigError(
            f"table {identifier}: encoding {encoding!r} is not one of {', '.join(ENCODINGS)}"
        )
    registry_url = properties.get(SCHEMA_REGISTRY_PROPERTY)
    if schema_registry is None and registry_url is not None:
        schema_registry = SchemaRegistrySettings(url=registry_url)
    if schema_registry is not None:
        return _WireEncoder(schema_registry, schema, encoding, identifier)
    return _Encoder(load_event_schema(schema), encoding)


def replay(
    catalog: CatalogConfig,
    table: str,
    window: Window,
    policy: OrderingPolicy,
    to_topic: str,
    producer_config: dict[str, Any],
    regions: list[str] | None = None,
    include_dead_letters: bool = False,
    schema: str | None = None,
    encoding: str | None = None,
    partitions: int | None = None,
    on_epoch: Callable[[ReplayReport], None] | None = None,
    schema_registry: SchemaRegistrySettings | None = None,
) -> ReplayReport:
    """Republish the archive of `table` (and its dead letters) into `to_topic`, epoch by epoch.

    `to_topic` is created when missing, with `partitions`, else as many as the source topic has. A table
    of a registry topic is re-encoded with the registry its router read (its properties say which), or
    `schema_registry`."""
    ref = table_ref(table, catalog)
    tables = [ref.identifier]
    if include_dead_letters:
        tables.append(f"{ref.identifier}{DEAD_LETTER_SUFFIX}")
    backfill_plan = plan(catalog, tables, window, policy, regions)
    iceberg = catalog.load()
    archive = iceberg.load_table(ref.pyiceberg_identifier)
    encoder = table_encoder(dict(archive.properties), ref.identifier, schema, encoding, schema_registry)
    readers = [
        TableReader(iceberg.load_table(table_ref(scan.table.identifier, catalog).pyiceberg_identifier),
                    scan, backfill_plan.window, backfill_plan.regions)
        for scan in backfill_plan.tables
        if scan.snapshot_id is not None
    ]  # fmt: skip
    source_topic = dict(archive.properties).get(TOPIC_PROPERTY, ref.name)
    ensure_topic(
        producer_config, to_topic, partitions or topic_partitions(producer_config, source_topic) or 1
    )
    report = ReplayReport(topic=to_topic, epochs=len(backfill_plan.epochs))
    producer = RecordProducer(producer_config)
    started = time.monotonic()
    dead_letter_table = f"{ref.identifier}{DEAD_LETTER_SUFFIX}"
    for epoch in backfill_plan.epochs:
        try:
            for batch in epoch_batches(backfill_plan, readers, epoch):
                dead = (batch.schema.metadata or {}).get(TABLE_KEY, b"").decode() == dead_letter_table
                for key, value, headers, timestamp in _records(batch, encoder, dead):
                    producer.send(to_topic, key, value, headers, timestamp)
                if dead:
                    report.dead_letters += batch.num_rows
                else:
                    report.records += batch.num_rows
                if producer.failures:
                    break
            producer.flush(120)
        except DeliveryFailed as error:
            report.seconds = time.monotonic() - started
            raise BackfillError(_stopped(report, epoch, error.reason, table)) from error
        finally:
            report.per_partition = dict(producer.delivered)
        report.epochs_done = epoch.index + 1
        report.watermark = format_instant(from_micros(epoch.upper))
        report.seconds = time.monotonic() - started
        if on_epoch is not None:
            on_epoch(report)
    report.seconds = time.monotonic() - started
    return report


def _stopped(report: ReplayReport, epoch: Epoch, reason: str, table: str) -> str:
    where = (
        f"every record ingested before {report.watermark} was delivered ({report.epochs_done} epochs)"
        if report.watermark
        else "no epoch was delivered whole"
    )
    resume = format_instant(from_micros(epoch.lower))
    return (
        f"replay of {table} into {report.topic} stopped in epoch {epoch.index} "
        f"({resume} to {format_instant(from_micros(epoch.upper))}): {reason}. "
        f"{where}; some records of epoch {epoch.index} may have been delivered. "
        f"Run again with --start {resume} to go on"
    )


def _records(
    batch: pa.RecordBatch, encoder: _Encoder | _WireEncoder, dead: bool
) -> Iterator[tuple[bytes | None, bytes | None, list[tuple[str, str | bytes | None]], int]]:
    for row in batch.to_pylist():
        metadata = row[METADATA]
        headers = [
            (h["key"], h["value"] if h["value"] is not None else b"") for h in metadata["headers"] or []
        ]
        headers += [
            (SOURCE_TOPIC, str(metadata["topic"]).encode()),
            (SOURCE_PARTITION, str(metadata["partition"]).encode()),
            (SOURCE_OFFSET, str(metadata["offset"]).encode()),
        ]
        timestamp = to_micros(metadata["kafka_ingestion_ts"]) // 1000
        if dead:
            headers.append((DEAD_LETTER_REASON, str(row["error"]).encode()))
            yield row["raw_key"], row["raw_value"], headers, timestamp
        else:
            yield metadata["key"], encoder(row), headers, timestamp
