"""`bergstream.backfill.read_batches`: the archive of a window as Arrow record batches, in lateness-bounded
order.

For consumers outside Spark. The order is the Spark source's: epoch after epoch, every table of the
backfill aligned on the same epochs, so that the guarantee in `bergstream.backfill.read.order` holds for the
sequence of batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from bergstream.backfill.read.order import Window, ordering
from bergstream.backfill.read.planner import BackfillPlan, plan, table_ref, to_micros
from bergstream.backfill.read.reader import TableReader, epoch_batches
from bergstream.catalog import CatalogConfig
from bergstream.site import default_catalog
from bergstream.timeparse import parse_duration, parse_instant

if TYPE_CHECKING:
    import pyarrow as pa


def window_of(start: datetime | str, end: datetime | str) -> Window:
    begin, finish = parse_instant(start, "start"), parse_instant(end, "end")
    if finish <= begin:
        from bergstream.backfill.errors import BackfillConfigError

        raise BackfillConfigError(f"the window ends ({finish}) at or before it starts ({begin})")
    return Window(to_micros(begin), to_micros(finish))


def read_batches(
    tables: str | Sequence[str],
    start: datetime | str,
    end: datetime | str,
    max_misalignment: timedelta | str | None = None,
    regions: Sequence[str] | None = None,
    *,
    catalog: CatalogConfig | None = None,
    columns: Sequence[str] | None = None,
    strict: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The rows of `tables` ingested in [start, end), as Arrow record batches in lateness-bounded order.

    `max_misalignment` is the bound B (a timedelta or text such as "15m"); None reads the window in one
    unordered epoch, and `strict` in exact ingestion-time order. Each batch's schema metadata names its
    table (`bergstream.table`), epoch and watermark. `columns` selects columns, dotted for nested ones.
    """
    names = [tables] if isinstance(tables, str) else list(tables)
    bound = parse_duration(max_misalignment, "max_misalignment") if max_misalignment is not None else None
    catalog = catalog or default_catalog()
    backfill_plan = plan(catalog, names, window_of(start, end), ordering(bound, strict), regions)
    yield from plan_batches(backfill_plan, catalog, columns)


def plan_batches(
    backfill_plan: BackfillPlan, catalog: CatalogConfig, columns: Sequence[str] | None = None
) -> Iterator[pa.RecordBatch]:
    """The batches of a plan made earlier, epoch by epoch."""
    iceberg = catalog.load()
    readers = [
        TableReader(
            iceberg.load_table(table_ref(scan.table.identifier, catalog).pyiceberg_identifier),
            scan, backfill_plan.window, backfill_plan.regions, columns,
        )
        for scan in backfill_plan.tables
        if scan.snapshot_id is not None
    ]  # fmt: skip
    for epoch in backfill_plan.epochs:
        yield from epoch_batches(backfill_plan, readers, epoch)
