"""Event schemas, one Avro schema file per topic in `avro/` beside this module, used for both JSON and Avro
encodings.

A JSON-encoded event is an object with the same field names; timestamps are ISO-8601 strings there and
`timestamp-millis` longs in Avro.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from bergstream.errors import ConfigError

AVRO_DIR = Path(__file__).parent / "avro"
Encoding = Literal["json", "avro"]
ENCODINGS: tuple[Encoding, ...] = ("json", "avro")


def available_schemas(directory: Path = AVRO_DIR) -> list[str]:
    return sorted(path.stem for path in directory.glob("*.avsc"))


@dataclass(frozen=True)
class EventSchema:
    name: str
    avro: dict[str, Any] = field(repr=False)
    # The schema file, or where in a schema registry the schema is.
    source: Path | str

    @property
    def avro_json(self) -> str:
        return json.dumps(self.avro)

    @property
    def fields(self) -> list[dict[str, Any]]:
        fields: list[dict[str, Any]] = self.avro["fields"]
        return fields

    @cached_property
    def _parsed(self) -> Any:
        import fastavro

        return fastavro.parse_schema(self.avro)

    def encode(self, record: dict[str, Any], encoding: Encoding) -> bytes:
        """Serialise one event as a producer of the topic would."""
        if encoding == "json":
            return json.dumps(record, default=_json_default, separators=(",", ":")).encode()
        import fastavro

        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, self._parsed, record)
        return buffer.getvalue()

    def decode(self, payload: bytes, encoding: Encoding) -> dict[str, Any]:
        if encoding == "json":
            decoded: dict[str, Any] = json.loads(payload)
            return decoded
        import fastavro

        record = fastavro.schemaless_reader(io.BytesIO(payload), self._parsed, None)
        if not isinstance(record, dict):
            raise ValueError(f"{self.source}: the payload decodes to {type(record).__name__}, not a record")
        return record


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def load_event_schema(name: str, directory: Path = AVRO_DIR) -> EventSchema:
    path = directory / f"{name}.avsc"
    if not path.exists():
        known = ", ".join(available_schemas(directory)) or "none"
        raise ConfigError(f"no event schema named {name!r} in {directory} (known: {known})")
    try:
        avro = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON: {error}") from error
    if avro.get("type") != "record" or not isinstance(avro.get("fields"), list):
        raise ConfigError(f"{path}: an event schema must be an Avro record with fields")
    return EventSchema(name=name, avro=avro, source=path)
