"""Turning a plan's epochs into Arrow record batches, outside Spark.

Each table's splits are read with pyiceberg's Arrow scan, which resolves columns by field id (files written
before a schema change read the new columns as null) and keeps only the rows of the epoch, the window and
the regions; the row groups whose statistics miss the epoch are not read at all. Splits of one epoch are
read in parallel. Every batch says in its schema's metadata which table, epoch and watermark it belongs to.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from bergstream.backfill.read.order import Epoch, Window
from bergstream.backfill.read.planner import BackfillPlan, TableScan, from_micros, rows_read
from bergstream.timeparse import format_instant

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import FileScanTask, Table

TABLE_KEY = b"bergstream.table"
EPOCH_KEY = b"bergstream.epoch"
WATERMARK_KEY = b"bergstream.watermark"


class TableReader:
    """Reads one table's splits of an epoch at the plan's snapshot."""

    def __init__(
        self,
        table: Table,
        scan: TableScan,
        window: Window,
        regions: Sequence[str] | None,
        columns: Sequence[str] | None = None,
    ) -> None:
        self.table = table
        self.scan = scan
        self.window = window
        self.regions = tuple(regions) if regions is not None else None
        self.columns = tuple(columns) if columns is not None else None
        self._tasks: dict[str, FileScanTask] | None = None

    def _tasks_by_path(self) -> dict[str, FileScanTask]:
        """The snapshot's file tasks of the window, planned once for all epochs."""
        if self._tasks is None:
            scan = self.table.scan(row_filter=self._filter(self.window.start, self.window.end),
                                   snapshot_id=self.scan.snapshot_id)  # fmt: skip
            self._tasks = {task.file.file_path: task for task in scan.plan_files()}
        return self._tasks

    def _filter(self, lower: int, upper: int) -> BooleanExpression:
        return rows_read(self.table, lower, upper, self.regions)

    def read(self, epoch: Epoch) -> Iterator[pa.RecordBatch]:
        """The table's rows of `epoch` (already inside the window), split by split, in any order."""
        from pyiceberg.io.pyarrow import ArrowScan

        identifier = self.scan.table.identifier
        paths = [split.path for split in epoch.splits if split.table == identifier]
        if not paths:
            return
        tasks = self._tasks_by_path()
        schema = self.table.schema()
        if self.columns is not None:
            schema = schema.select(*self.columns)
        arrow_scan = ArrowScan(
            self.table.metadata, self.table.io, schema, self._filter(epoch.lower, epoch.upper)
        )
        # A list: the scan walks its tasks more than once.
        yield from arrow_scan.to_record_batches([tasks[path] for path in paths])


def tagged(batch: pa.RecordBatch, table: str, epoch: Epoch) -> pa.RecordBatch:
    metadata = dict(batch.schema.metadata or {})
    metadata[TABLE_KEY] = table.encode()
    metadata[EPOCH_KEY] = str(epoch.index).encode()
    metadata[WATERMARK_KEY] = format_instant(from_micros(epoch.upper)).encode()
    return batch.replace_schema_metadata(metadata)


def epoch_batches(
    plan: BackfillPlan, readers: Sequence[TableReader], epoch: Epoch
) -> Iterator[pa.RecordBatch]:
    """The rows of one epoch from every table; in exact ingestion-time order when the policy asks."""
    if not plan.policy.single_reader:
        for reader in readers:
            for batch in reader.read(epoch):
                if batch.num_rows:
                    yield tagged(batch, reader.scan.table.identifier, epoch)
        return
    yield from _merged(readers, epoch)


def _merged(readers: Sequence[TableReader], epoch: Epoch) -> Iterator[pa.RecordBatch]:
    """An epoch's rows of all tables in ingestion-time order, as runs of one table each."""
    import numpy as np
    import pyarrow as pa

    sorted_tables: list[tuple[str, pa.Table, np.ndarray]] = []
    for reader in readers:
        batches = [batch for batch in reader.read(epoch) if batch.num_rows]
        if not batches:
            continue
        # Files of other writers read as large_string where the router's read as string: one type each.
        rows = pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="permissive")
        order = np.argsort(_ingestion_times(rows), kind="stable")
        rows = rows.take(order)
        sorted_tables.append((reader.scan.table.identifier, rows, _ingestion_times(rows)))
    if not sorted_tables:
        return
    # Merge by ingestion time; each table's rows are sorted, so a run of one table is a slice of it.
    times = np.concatenate([times for _, _, times in sorted_tables])
    owners = np.concatenate([np.full(len(times), i) for i, (_, _, times) in enumerate(sorted_tables)])
    owners = owners[np.argsort(times, kind="stable")]
    run_starts = np.flatnonzero(np.diff(owners, prepend=-1))
    run_ends = np.append(run_starts[1:], len(owners))
    taken = [0] * len(sorted_tables)
    for begin, end in zip(run_starts, run_ends, strict=True):
        index = int(owners[begin])
        identifier, rows, _ = sorted_tables[index]
        for batch in rows.slice(taken[index], int(end - begin)).to_batches():
            yield tagged(batch, identifier, epoch)
        taken[index] += int(end - begin)


def _ingestion_times(rows: pa.Table):  # type: ignore[no-untyped-def]
    import pyarrow as pa

    metadata = rows.column("__metadata__").combine_chunks()
    return metadata.field("kafka_ingestion_ts").cast(pa.int64()).to_numpy(zero_copy_only=False)
