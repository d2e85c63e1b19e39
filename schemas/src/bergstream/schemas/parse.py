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

A JSON value is decoded in one strict pass (json_decode.py), an Avro value by Avro's reader (avro_decode.py);
both decoders are expressions of Spark's own, called from the generated code of the projection, that build
Spark's internal rows themselves. The checks after the decoding are the same for both (checks.py).

A topic with a schema registry carries values in the wire format (schemas/wire.py): a header, then the
payload. The parser checks the header, knows the ids of the subject's versions (`wire.WireSchemas`, fetched by
the router before each batch), and decodes an Avro payload with its writer's schema resolved to the table's
schema, one branch per id; a JSON payload is parsed as above. A value with an id the router could not
resolve goes to the dead-letter table with a reason that names the id; in an application's live source, an
id its query does not know fails the batch instead (`wire.UnknownSchemaId`), to be fetched before it starts
again.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from bergstream.schemas import wire
from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.avro_decode import avro_columns
from bergstream.schemas.checks import DECODED, ERROR, EVENT, header_checks, timestamp_fields
from bergstream.schemas.event_schema import Encoding
from bergstream.schemas.json_decode import UNDECODABLE_JSON, StrictJson, json_error, json_reason
from bergstream.schemas.wire import WireSchemas

__all__ = ["ERROR", "EVENT", "UNDECODABLE_JSON", "Parser", "explain"]


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
            self._strict_json = StrictJson(layout.event_type, timestamp_fields(layout))
            error = json_error(layout, value, header_checks(wire_schemas, plain_json=True), self._strict_json)
            self._event = F.col(DECODED)[EVENT].alias(EVENT)
        else:
            self.decoded, error = avro_columns(layout, value, wire_schemas)
            self._event = F.col(DECODED)[EVENT].alias(EVENT)
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
            columns = {DECODED: self._strict_json.column(records.sparkSession, self._value).alias(DECODED)}
        decoded = records.select("*", *columns.values(), *extra)
        if self._event is not None:
            decoded = decoded.select("*", self._event)
        return decoded.select("*", self.error.alias(ERROR)).drop(*[name for name in columns if name != EVENT])


def explain(layout: ArchiveLayout, encoding: Encoding, wire_schemas: WireSchemas | None = None) -> Column:
    """The final error text of a parsed row: `error` with UNDECODABLE_JSON replaced by its reason."""
    if encoding != "json":
        return F.col(ERROR)
    value = F.col("value") if wire_schemas is None else wire.payload(F.col("value"))
    return F.when(F.col(ERROR) == UNDECODABLE_JSON, json_reason(layout, value)).otherwise(F.col(ERROR))
