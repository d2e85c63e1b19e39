"""Turning Kafka record values into typed events, or into the reason they cannot be."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from schemas.archive import ArchiveLayout
from schemas.registry import Encoding

EVENT = "event"
ERROR = "error"


def _decoded(value: Column, layout: ArchiveLayout, encoding: Encoding) -> Column:
    if encoding == "json":
        return F.from_json(value.cast("string"), layout.event_type, {"mode": "PERMISSIVE"})
    return from_avro(value, layout.event.avro_json, {"mode": "PERMISSIVE"})


def parse(records: DataFrame, layout: ArchiveLayout, encoding: Encoding) -> DataFrame:
    """Add `event` (the typed event, or null) and `error` (null when the event is valid) to Kafka records."""
    event = F.col(EVENT)
    required = [f.name for f in layout.event_type.fields if not f.nullable]
    checks = [
        (F.col("value").isNull(), F.lit("null value")),
        (event.isNull(), F.lit(f"not a valid {encoding} {layout.event.name} event")),
        *[
            (event[name].isNull(), F.lit(f"required field '{name}' is missing or has the wrong type"))
            for name in required
        ],
    ]
    error = F.when(checks[0][0], checks[0][1])
    for condition, message in checks[1:]:
        error = error.when(condition, message)
    return records.withColumn(EVENT, _decoded(F.col("value"), layout, encoding)).withColumn(ERROR, error)
