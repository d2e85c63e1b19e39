"""A replayed record's key, value, headers and timestamp, from an archive or a dead-letter row."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bergstream.backfill.errors import BackfillConfigError, BackfillError
from bergstream.backfill.read.planner import to_micros
from bergstream.schemas import wire
from bergstream.schemas.archive import (
    ENCODING_PROPERTY,
    METADATA,
    SCHEMA_ID,
    SCHEMA_PROPERTY,
    SCHEMA_REGISTRY_PROPERTY,
)
from bergstream.schemas.event_schema import ENCODINGS, Encoding, EventSchema, load_event_schema
from bergstream.schemas.schema_registry import SchemaRegistrySettings, schema_by_id

if TYPE_CHECKING:
    import pyarrow as pa

SOURCE_TOPIC = "bergstream.source.topic"
SOURCE_PARTITION = "bergstream.source.partition"
SOURCE_OFFSET = "bergstream.source.offset"
DEAD_LETTER_REASON = "bergstream.dead-letter.reason"

Headers = list[tuple[str, bytes | None]]
KafkaRecord = tuple[bytes | None, bytes | None, Headers, int]  # key, value, headers, timestamp (ms)


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


Encoder = _Encoder | _WireEncoder


def table_encoder(
    properties: dict[str, str],
    identifier: str,
    schema: str | None,
    encoding: str | None,
    schema_registry: SchemaRegistrySettings | None = None,
) -> Encoder:
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


def kafka_records(batch: pa.RecordBatch, encoder: Encoder, dead: bool) -> Iterator[KafkaRecord]:
    """The records of `batch`: an archive row with its value encoded as its topic encodes it, a dead letter
    (`dead`) as the raw bytes it came in as. A header without a value keeps having none."""
    for row in batch.to_pylist():
        metadata = row[METADATA]
        headers: Headers = [(h["key"], h["value"]) for h in metadata["headers"] or []]
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
