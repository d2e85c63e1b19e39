"""Records parsed as the router parses them, every error final: for the tests' looks at a few records (the
router explains its dead-lettered rows only)."""

from __future__ import annotations

from pyspark.sql import DataFrame

from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.event_schema import Encoding
from bergstream.schemas.parse import ERROR, Parser, explain
from bergstream.schemas.wire import WireSchemas


def parse_and_explain(
    records: DataFrame,
    layout: ArchiveLayout,
    encoding: Encoding,
    max_value_bytes: int | None = None,
    wire_schemas: WireSchemas | None = None,
) -> DataFrame:
    """Parsed records with every error final."""
    parsed = Parser(layout, encoding, max_value_bytes, wire_schemas).parse(records)
    return parsed.withColumn(ERROR, explain(layout, encoding, wire_schemas))
