"""The Confluent wire format: a value written by a schema registry serializer is one magic byte 0, the
schema's id as a 4-byte big-endian integer, then the payload (Avro binary, or JSON text).

The same framing in plain Python (producing, replaying) and as Spark columns (the router's parse).
"""

from __future__ import annotations

import struct

from pyspark.sql import Column
from pyspark.sql import functions as F

MAGIC = 0
HEADER_BYTES = 5
# Confluent's schema ids are signed 32-bit integers, counted from 1.
MAX_SCHEMA_ID = 2**31 - 1
_HEADER = struct.Struct(">bI")


class WireFormatError(ValueError):
    """A value that is not in the wire format."""


def frame(schema_id: int, payload: bytes) -> bytes:
    """The value a registry serializer writes for `payload` under schema `schema_id`."""
    if not 1 <= schema_id <= MAX_SCHEMA_ID:
        raise WireFormatError(f"schema id {schema_id} is not a registry's id (1 to {MAX_SCHEMA_ID})")
    return _HEADER.pack(MAGIC, schema_id) + payload


def unframe(value: bytes) -> tuple[int, bytes]:
    """(schema id, payload) of a wire-format value."""
    if len(value) < HEADER_BYTES:
        raise WireFormatError(f"a value of {len(value)} bytes is shorter than the {HEADER_BYTES}-byte header")
    magic, schema_id = _HEADER.unpack_from(value)
    if magic != MAGIC:
        raise WireFormatError(f"the value starts with byte {magic & 0xFF}, not the magic byte {MAGIC}")
    return schema_id, value[HEADER_BYTES:]


def has_header(value: Column) -> Column:
    """Whether a binary column starts like a wire-format value: magic byte 0 and room for an id."""
    return (F.length(value) >= HEADER_BYTES) & (F.substring(value, 1, 1) == F.lit(bytes([MAGIC])))


def schema_id(value: Column) -> Column:
    """The schema id of a wire-format value, as an int; null without a header or for an id out of range."""
    as_long = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("bigint")
    return F.when(has_header(value) & as_long.between(1, MAX_SCHEMA_ID), as_long.cast("int"))


def payload(value: Column) -> Column:
    """What follows the header."""
    return F.when(F.length(value) >= HEADER_BYTES, F.substring(value, HEADER_BYTES + 1, 2**31 - 1))
