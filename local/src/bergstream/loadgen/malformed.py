"""Records a real producer gets wrong, to exercise the router's dead-letter path.

Each kind is invalid for the topic's schema: the value is null, does not decode, or decodes to something
that is not an event (not an object, a required field missing or of the wrong type).
"""

from __future__ import annotations

import functools
import itertools
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bergstream.loadgen.events import TOPICS, EventModel
from bergstream.schemas.event_schema import Encoding, EventSchema, load_event_schema

# Random bytes or another schema's event decode now and then; give up after this many that do.
_ATTEMPTS = 100
_NOT_NUMBERS = ("abc", "n/a", "unknown")


@dataclass(frozen=True)
class MalformedRecord:
    value: bytes | None  # None is a null Kafka value (a tombstone)
    kind: str


def _null_value(event: dict[str, Any], schema: EventSchema, rng: random.Random) -> None:
    return None


def _invalid_json(event: dict[str, Any], schema: EventSchema, rng: random.Random) -> bytes:
    valid = schema.encode(event, "json")
    # Any proper prefix of an object lacks its closing brace.
    return valid[: rng.randrange(1, len(valid))]


def _wrong_type(event: dict[str, Any], schema: EventSchema, rng: random.Random) -> bytes:
    name = rng.choice([f["name"] for f in schema.fields if f["type"] in ("int", "long")])
    return schema.encode({**event, name: rng.choice(_NOT_NUMBERS)}, "json")


def _missing_field(event: dict[str, Any], schema: EventSchema, rng: random.Random) -> bytes:
    name = rng.choice([f["name"] for f in schema.fields if not _nullable(f["type"])])
    return schema.encode({key: value for key, value in event.items() if key != name}, "json")


def _bad_encoding(event: dict[str, Any], schema: EventSchema, rng: random.Random) -> bytes:
    name = rng.choice([f["name"] for f in schema.fields if f["type"] == "string"])
    placeholder = f"\x00{name}"  # json.dumps escapes NUL, so the placeholder cannot clash with real text
    # Text encoded as Latin-1 instead of UTF-8: "é" becomes the byte 0xE9, which is not UTF-8 here.
    latin1 = json.dumps(event[name])[:-1].encode() + "é".encode("latin-1") + b'"'
    return schema.encode({**event, name: placeholder}, "json").replace(
        json.dumps(placeholder).encode(), latin1
    )


def _not_an_object(event: dict[str, Any], schema: EventSchema, rng: random.Random) -> bytes:
    valid = schema.encode(event, "json")
    batch = b"[" + valid + b"]"
    encoded_twice = json.dumps(valid.decode()).encode()
    number = str(rng.randrange(10**9)).encode()
    return rng.choice((batch, encoded_twice, number))


def _truncated(event: dict[str, Any], schema: EventSchema, rng: random.Random) -> bytes:
    valid = schema.encode(event, "avro")
    return _undecodable(
        schema, "truncated", (valid[: rng.randrange(1, len(valid))] for _ in itertools.repeat(None))
    )


def _garbage(event: dict[str, Any], schema: EventSchema, rng: random.Random) -> bytes:
    return _undecodable(
        schema, "garbage", (rng.randbytes(rng.randint(1, 64)) for _ in itertools.repeat(None))
    )


def _other_schema(event: dict[str, Any], schema: EventSchema, rng: random.Random) -> bytes:
    # A producer wired to the wrong topic: events of another kind.
    topic = rng.choice([name for name in TOPICS if name != schema.name])
    other = _schema(topic)
    events = EventModel(seed=rng.getrandbits(64)).events(topic)
    return _undecodable(schema, f"{topic} event", (other.encode(g.event, "avro") for g in events))


_Malformer = Callable[[dict[str, Any], EventSchema, random.Random], bytes | None]
_MALFORMERS: dict[Encoding, dict[str, _Malformer]] = {
    "json": {
        "invalid_json": _invalid_json,
        "wrong_type": _wrong_type,
        "missing_field": _missing_field,
        "null_value": _null_value,
        "bad_encoding": _bad_encoding,
        "not_an_object": _not_an_object,
    },
    "avro": {
        "truncated": _truncated,
        "garbage": _garbage,
        "null_value": _null_value,
        "other_schema": _other_schema,
    },
}
MALFORMATIONS: dict[Encoding, tuple[str, ...]] = {
    encoding: tuple(malformers) for encoding, malformers in _MALFORMERS.items()
}


def malform(
    event: dict[str, Any], schema: EventSchema, encoding: Encoding, rng: random.Random
) -> MalformedRecord:
    """Spoil `event` of `schema` in one of the ways of MALFORMATIONS[encoding], chosen with `rng`."""
    kind = rng.choice(MALFORMATIONS[encoding])
    return MalformedRecord(_MALFORMERS[encoding][kind](event, schema, rng), kind)


def _undecodable(schema: EventSchema, what: str, candidates: Iterator[bytes]) -> bytes:
    """The first candidate that really is not an Avro `schema` record."""
    for value in itertools.islice(candidates, _ATTEMPTS):
        try:
            schema.decode(value, "avro")
        except Exception:  # fastavro reports bad input as EOFError, IndexError, UnicodeDecodeError, ...
            return value
    raise ValueError(f"no {what} out of {_ATTEMPTS} failed to decode as {schema.name}")


@functools.cache
def _schema(name: str) -> EventSchema:
    # Loaded once: each EventSchema parses its Avro schema on first use.
    return load_event_schema(name)


def _nullable(avro_type: Any) -> bool:
    return isinstance(avro_type, list) and "null" in avro_type
