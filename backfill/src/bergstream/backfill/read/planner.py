"""Planning a backfill with pyiceberg alone: the files of a window, their ingestion-time bounds, the epochs.

A table is planned at one snapshot, which the backfill then reads throughout, so that a restart reads the
same rows even while the router appends and maintenance compacts. Files are found by Iceberg's own
pruning (the hour partitions and column statistics) for the window and the regions; each becomes a split
whose bounds come from the manifest's column statistics, else the Parquet footer, else its hour partition.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from bergstream.backfill.errors import PlanError
from bergstream.backfill.read.order import Epoch, OrderingPolicy, Window
from bergstream.backfill.read.split import HOUR, BoundsSource, Micros, RowGroup, Split
from bergstream.catalog import CatalogConfig
from bergstream.schemas.archive import INGESTION_TS_COLUMN, METADATA, REDRIVE_ID
from bergstream.timeparse import format_duration, format_instant

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

log = logging.getLogger(__name__)
CLUSTER_COLUMN = f"{METADATA}.cluster"
PLAN_FORMAT = 1
# An epoch reads a slice of each file: Iceberg cuts files at row-group boundaries into tasks of about this
# size, so that the row groups of one epoch are read in parallel. Measured on 5,000,000 impressions with
# 14 row groups per hour file, B = 15m: 72.5 s with Iceberg's default of 128 MB, 42.5 s with 2 MB. An
# unordered read keeps the default: small tasks cost it (16.0 s against 10.4 s).
EPOCH_SPLIT_BYTES = 2 * 1024 * 1024


def to_micros(value: datetime) -> Micros:
    return (value.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def from_micros(value: Micros) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=value)


@dataclass(frozen=True)
class TableRef:
    """A table as `catalog.namespace.table`, whichever of `T`, `namespace.T` or that the user wrote."""

    catalog: str
    namespace: str
    name: str

    @property
    def identifier(self) -> str:
        return f"{self.catalog}.{self.namespace}.{self.name}"

    @property
    def pyiceberg_identifier(self) -> str:
        return f"{self.namespace}.{self.name}"


def table_ref(name: str, catalog: CatalogConfig) -> TableRef:
    """`T`, `archive.T` or `catalog.archive.T`, as the router names its tables, resolved in `catalog`."""
    parts = name.split(".")
    if len(parts) == 1:
        return TableRef(catalog.name, catalog.namespace, parts[0])
    if len(parts) == 2:
        return TableRef(catalog.name, parts[0], parts[1])
    if len(parts) == 3:
        if parts[0] != catalog.name:
            raise PlanError(
                f"table {name!r} names catalog {parts[0]!r}, but the configured catalog is {catalog.name!r}"
            )
        return TableRef(*parts)
    raise PlanError(f"table {name!r}: write T, namespace.T or catalog.namespace.T")


@dataclass(frozen=True)
class TableScan:
    """One table of a backfill, planned at one snapshot."""

    table: TableRef
    snapshot_id: int | None  # None: the table has no snapshot yet, so nothing to read
    splits: tuple[Split, ...]

    @property
    def records(self) -> int:
        return sum(split.records for split in self.splits)


@dataclass(frozen=True)
class BackfillPlan:
    window: Window
    policy: OrderingPolicy
    regions: tuple[str, ...] | None
    tables: tuple[TableScan, ...]
    epochs: tuple[Epoch, ...] = field(repr=False)

    @property
    def splits(self) -> list[Split]:
        return [split for scan in self.tables for split in scan.splits]

    def scan_of(self, table: str) -> TableScan:
        for scan in self.tables:
            if table in (scan.table.identifier, scan.table.name, scan.table.pyiceberg_identifier):
                return scan
        raise KeyError(table)

    def source_plan(self, table: str, source: str) -> dict[str, Any]:
        """What the JVM backfill source of one table reads: the table, its snapshot, the shared epochs."""
        scan = self.scan_of(table)
        return {
            "format": PLAN_FORMAT,
            "source": source,
            "table": scan.table.identifier,
            "snapshot_id": scan.snapshot_id,
            "regions": list(self.regions) if self.regions is not None else None,
            "window": [self.window.start, self.window.end],
            "epochs": [[epoch.lower, epoch.upper] for epoch in self.epochs],
            "read_options": {} if self.policy.bound is None else {"split-size": str(EPOCH_SPLIT_BYTES)},
            "single_reader": self.policy.single_reader,
            "files": {split.path: [split.lower, split.upper] for split in scan.splits},
            "row_groups": {
                split.path: [list(group) for group in split.row_groups]
                for split in scan.splits
                if split.row_groups
            },
        }

    def to_json(self) -> dict[str, Any]:
        bound = self.policy.bound
        return {
            "format": PLAN_FORMAT,
            "window": {"start": format_instant(from_micros(self.window.start)),
                       "end": format_instant(from_micros(self.window.end))},
            "ordering": self.policy.name,
            "max_misalignment": format_duration(bound) if bound is not None else None,
            "regions": list(self.regions) if self.regions is not None else None,
            "tables": [
                {"table": scan.table.identifier, "snapshot_id": scan.snapshot_id, "splits": len(scan.splits),
                 "records": scan.records, "bytes": sum(split.size_bytes for split in scan.splits)}
                for scan in self.tables
            ],
            "epochs": [
                {"index": epoch.index, "lower": format_instant(from_micros(epoch.lower)),
                 "upper": format_instant(from_micros(epoch.upper)), "splits": len(epoch.splits),
                 "estimated_rows": round(epoch.estimated_rows),
                 "estimated_bytes": round(epoch.estimated_bytes)}
                for epoch in self.epochs
            ],
            "splits": [
                {"table": split.table, "path": split.path, "lower": format_instant(from_micros(split.lower)),
                 "upper": format_instant(from_micros(split.upper)), "records": split.records,
                 "bytes": split.size_bytes, "bounds_from": split.bounds_from}
                for split in self.splits
            ],
        }  # fmt: skip

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def plan(
    catalog: CatalogConfig,
    tables: Sequence[str],
    window: Window,
    policy: OrderingPolicy,
    regions: Sequence[str] | None = None,
    snapshots: dict[str, int | None] | None = None,
) -> BackfillPlan:
    """Plan `tables` over `window`; `snapshots` pins tables (by identifier) to the snapshots of an
    earlier plan, as a restarted backfill must read what it started to read."""
    if not tables:
        raise PlanError("a backfill needs at least one table")
    iceberg = catalog.load()
    wanted_regions = tuple(regions) if regions else None
    scans: list[TableScan] = []
    for name in tables:
        ref = table_ref(name, catalog)
        if any(scan.table == ref for scan in scans):
            raise PlanError(f"table {ref.identifier} is named twice")
        table = _load(iceberg, ref)
        pinned = (snapshots or {}).get(ref.identifier, _CURRENT)
        scans.append(plan_table(table, ref, window, wanted_regions, pinned))
    all_splits = [split for scan in scans for split in scan.splits]
    try:
        epochs = policy.epochs(window, all_splits)
    except ValueError as error:
        raise PlanError(str(error)) from error
    return BackfillPlan(window, policy, wanted_regions, tuple(scans), tuple(epochs))


_CURRENT = -1  # plan_table's "no pinned snapshot": read the current one


def _load(iceberg: Any, ref: TableRef) -> Table:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table: Table = iceberg.load_table(ref.pyiceberg_identifier)
        return table
    except NoSuchTableError as error:
        raise PlanError(
            f"table {ref.identifier} does not exist in the catalog; the router names its tables after "
            "their topics (archive.<topic>)"
        ) from error


def rows_read(table: Table, lower: Micros, upper: Micros, regions: Sequence[str] | None) -> BooleanExpression:
    """The rows of `table` that a backfill reads: ingested in [lower, upper), from `regions`; of a
    dead-letter table, those that no redrive has put into the archive, where they are read instead."""
    from pyiceberg.expressions import And, GreaterThanOrEqual, In, IsNull, LessThan

    row_filter = And(GreaterThanOrEqual(INGESTION_TS_COLUMN, lower), LessThan(INGESTION_TS_COLUMN, upper))
    if regions is not None:
        row_filter = And(row_filter, In(CLUSTER_COLUMN, set(regions)))
    if REDRIVE_ID in table.schema().column_names:
        row_filter = And(row_filter, IsNull(REDRIVE_ID))
    return row_filter


def plan_table(
    table: Table,
    ref: TableRef,
    window: Window,
    regions: tuple[str, ...] | None,
    snapshot_id: int | None = _CURRENT,
) -> TableScan:
    schema = table.schema()
    try:
        ts_field = schema.find_field(INGESTION_TS_COLUMN)
    except ValueError as error:
        raise PlanError(
            f"table {ref.identifier} has no column {INGESTION_TS_COLUMN}: not an archive table"
        ) from error
    if snapshot_id == _CURRENT:
        snapshot_id = table.metadata.current_snapshot_id
    if snapshot_id is None:
        return TableScan(ref, None, ())
    if table.snapshot_by_id(snapshot_id) is None:
        raise PlanError(
            f"table {ref.identifier} no longer has snapshot {snapshot_id}, which this backfill started "
            "reading: maintenance expired it. Start the backfill again with a new checkpoint"
        )
    scan = table.scan(row_filter=rows_read(table, window.start, window.end, regions), snapshot_id=snapshot_id)
    tasks = list(scan.plan_files())
    deletes = sum(len(task.delete_files) for task in tasks)
    if deletes:
        raise PlanError(
            f"table {ref.identifier} has {deletes} delete files in the window: the router only appends, "
            "and backfill reads append-only archives. Rewrite the table's data files to apply the deletes"
        )
    hour_positions = _hour_partition_positions(table, ts_field.field_id)
    splits = []
    for task in tasks:
        data_file = task.file
        # Of a file with several row groups, each group's bounds (one footer read, also the fallback's).
        groups: tuple[RowGroup, ...] = ()
        if len(data_file.split_offsets or ()) > 1:
            groups = tuple(_row_groups(table.io, data_file, INGESTION_TS_COLUMN) or ())

        def footer(path: str, groups: tuple[RowGroup, ...] = groups) -> tuple[Micros, Micros] | None:
            return _span(groups) or _footer_bounds(table.io, path, INGESTION_TS_COLUMN)

        lower, upper, source = split_bounds(
            data_file, ts_field.field_id, hour_positions.get(data_file.spec_id), footer
        )
        if source != "manifest":
            log.info("%s: bounds of %s from its %s", ref.identifier, data_file.file_path, source)
        splits.append(
            Split(ref.identifier, data_file.file_path, lower, upper, data_file.record_count,
                  data_file.file_size_in_bytes, source, groups)
        )  # fmt: skip
    return TableScan(ref, snapshot_id, tuple(sorted(splits, key=lambda s: (s.lower, s.upper, s.path))))


def split_bounds(
    data_file: DataFile,
    field_id: int,
    hour_position: int | None,
    footer: Callable[[str], tuple[Micros, Micros] | None],
) -> tuple[Micros, Micros, BoundsSource]:
    """A file's inclusive ingestion-time bounds: manifest statistics, else footer, else hour partition."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import TimestamptzType

    lower_bytes = (data_file.lower_bounds or {}).get(field_id)
    upper_bytes = (data_file.upper_bounds or {}).get(field_id)
    if lower_bytes is not None and upper_bytes is not None:
        lower = from_bytes(TimestamptzType(), lower_bytes)
        upper = from_bytes(TimestamptzType(), upper_bytes)
        return int(lower), int(upper), "manifest"
    from_footer = footer(data_file.file_path)
    if from_footer is not None:
        return from_footer[0], from_footer[1], "footer"
    if hour_position is not None:
        hour = data_file.partition[hour_position]
        if hour is not None:
            return hour * HOUR, (hour + 1) * HOUR - 1, "partition"
    raise PlanError(
        f"{data_file.file_path}: no bounds on {INGESTION_TS_COLUMN} in the manifest or the Parquet footer, "
        "and no hour partition: it cannot be placed in ingestion order"
    )


def _hour_partition_positions(table: Table, field_id: int) -> dict[int, int]:
    """Per partition spec, the position of the hour partition on the ingestion time, where there is one."""
    from pyiceberg.transforms import HourTransform

    positions = {}
    for spec_id, spec in table.specs().items():
        for position, partition_field in enumerate(spec.fields):
            if partition_field.source_id == field_id and isinstance(partition_field.transform, HourTransform):
                positions[spec_id] = position
    return positions


def _footer_bounds(io: FileIO, path: str, column: str) -> tuple[Micros, Micros] | None:
    """The column's minimum and maximum over the file's row groups, from the Parquet footer."""
    return _span(_row_groups(io, path, column))


def _span(groups: Sequence[RowGroup] | None) -> tuple[Micros, Micros] | None:
    """The bounds of a file's rows from those of its row groups."""
    if not groups:
        return None
    return min(lower for _, lower, _ in groups), max(upper for _, _, upper in groups)


def _row_groups(io: FileIO, file: str | DataFile, column: str) -> list[RowGroup] | None:
    """Each row group's position (where Iceberg's reader places it) and the column's bounds in it, from the
    Parquet footer; None when a group has no statistics on the column. Of a data file, the positions are
    checked against the manifest's split offsets."""
    import pyarrow.parquet as pq

    path = file if isinstance(file, str) else file.file_path
    with io.new_input(path).open() as stream:
        metadata = pq.ParquetFile(stream).metadata
    index = next((i for i in range(metadata.num_columns) if metadata.schema.column(i).path == column), None)
    if index is None or metadata.num_row_groups == 0:
        return None
    unit = json.loads(metadata.schema.column(index).logical_type.to_json()).get("timeUnit")
    scale = {"milliseconds": 1000, "microseconds": 1, "nanoseconds": 0.001}.get(unit or "")
    if scale is None:
        return None
    groups = []
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        statistics = row_group.column(index).statistics
        if statistics is None or not statistics.has_min_max:
            return None
        first = row_group.column(0)
        position = reader_position(
            first.data_page_offset,
            first.dictionary_page_offset if first.has_dictionary_page else None,
            sum(row_group.column(c).total_compressed_size for c in range(row_group.num_columns)),
        )
        groups.append((position, int(statistics.min_raw * scale), int(statistics.max_raw * scale)))
    if not isinstance(file, str):
        check_split_offsets(path, [group[0] for group in groups], file.split_offsets, file.file_size_in_bytes)
    return groups


def reader_position(data_page_offset: int, dictionary_page_offset: int | None, compressed_size: int) -> int:
    """The byte offset by which Iceberg's Parquet reader (parquet-java's range filter) gives a row group to
    the split whose byte range holds it: the group's midpoint, from its first column chunk's first page (the
    dictionary page when the footer sets one below the first data page, even at 0) and its compressed
    size. Iceberg cuts files at the manifest's split offsets, which count a start otherwise (a dictionary
    page at 0 is no start there): the midpoint, not a start, says which split reads the group."""
    start = data_page_offset
    if dictionary_page_offset is not None and dictionary_page_offset < start:
        start = dictionary_page_offset
    return int(start + compressed_size // 2)


def check_split_offsets(
    path: str, positions: Sequence[int], split_offsets: Sequence[int] | None, file_size: int
) -> None:
    """Refuse a file whose row groups Iceberg's reader would leave out: a group's position outside the
    bytes its split offsets cut into splits (from the first offset to the end of the file) is read by
    no split, and its rows would be lost without a word."""
    if not split_offsets:
        return
    first = split_offsets[0]
    outside = [(index, at) for index, at in enumerate(positions) if not first <= at < file_size]
    if outside:
        index, at = outside[0]
        raise PlanError(
            f"{path}: row group {index} lies at byte {at}, outside the splits its manifest's split offsets "
            f"{list(split_offsets)} make of its {file_size} bytes: Iceberg's reader would read it in no "
            "split. Rewrite the file (rewrite_data_files) so that its split offsets match its row groups"
        )
