"""The Confluent wire format: a value written by a schema registry serializer is one magic byte 0, the
schema's id as a 4-byte big-endian integer, then the payload (Avro binary, or JSON text).

The same framing in plain Python (producing, replaying) and as Spark columns (the router's parse), and what
a parser knows of a subject's schema ids (`WireSchemas`).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

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
