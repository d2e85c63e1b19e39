"""Planning and reading real Iceberg tables (a SQLite catalog, Parquet files), without Spark.

Tables are written with pyiceberg in the archive's shape: event fields, a `__metadata__` struct with the
ingestion time and the cluster, partitioned by the hour of ingestion.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import HourTransform
from pyiceberg.types import (
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from bergstream.backfill import read_batches
from bergstream.backfill.errors import BackfillConfigError, PlanError
from bergstream.backfill.read.handover import Handover, refuse_rows_past
from bergstream.backfill.read.order import BoundedOrder, Unordered, Window
from bergstream.backfill.read.planner import (
    check_split_offsets,
    plan,
    reader_position,
    split_bounds,
    table_ref,
    to_micros,
)
from bergstream.backfill.read.split import HOUR
from bergstream.catalog import CatalogConfig

START = datetime(2026, 11, 22, tzinfo=UTC)
METADATA = StructType(
    NestedField(10, "kafka_ingestion_ts", TimestamptzType(), required=False),
    NestedField(11, "cluster", StringType(), required=False),
    NestedField(12, "partition", IntegerType(), required=False),
    NestedField(13, "offset", LongType(), required=False),
)
SCHEMA = Schema(
    NestedField(1, "account_id", LongType(), required=False),
    NestedField(2, "event_type", StringType(), required=False),
    NestedField(3, "__metadata__", METADATA, required=False),
)
SPEC = PartitionSpec(PartitionField(source_id=10, field_id=1000, transform=HourTransform(), name="hour"))
ARROW = pa.schema(
    [
        pa.field("account_id", pa.int64()),
        pa.field("event_type", pa.string()),
        pa.field(
            "__metadata__",
            pa.struct(
                [
                    pa.field("kafka_ingestion_ts", pa.timestamp("us", tz="UTC")),
                    pa.field("cluster", pa.string()),
                    pa.field("partition", pa.int32()),
                    pa.field("offset", pa.int64()),
                ]
            ),
        ),
    ]
)


@pytest.fixture
def catalog(tmp_path: Path) -> CatalogConfig:
    config = CatalogConfig.sqlite(tmp_path / "catalog.db", tmp_path / "warehouse")
    config.load().create_namespace("archive")
    return config


class Archive:
    """Appends rows as a router would: each append one batch of records, at offsets counting up."""

    def __init__(self, catalog: CatalogConfig, name: str, properties: dict[str, str] | None = None) -> None:
        self.table = catalog.load().create_table(
            f"archive.{name}", SCHEMA, partition_spec=SPEC, properties=properties or {}
        )
        self.offset = 0
        self.times: list[datetime] = []

    def append(self, times: list[datetime], cluster: str = "us-east-1") -> None:
        rows = []
        for ts in times:
            metadata = {"kafka_ingestion_ts": ts, "cluster": cluster, "partition": 0, "offset": self.offset}
            rows.append({"account_id": self.offset % 7, "event_type": "START", "__metadata__": metadata})
            self.offset += 1
        self.table.append(pa.Table.from_pylist(rows, schema=ARROW))
        self.times += times


def spread(first: datetime, count: int, span: timedelta, seed: int = 0) -> list[datetime]:
    rng = random.Random(seed)
    return sorted(first + span * rng.random() for _ in range(count))


def offsets(batches: list[pa.RecordBatch]) -> list[int]:
    return [m["offset"] for b in batches for m in b.column("__metadata__").to_pylist()]


def ingestion_times(batches: list[pa.RecordBatch]) -> list[datetime]:
    return [m["kafka_ingestion_ts"] for b in batches for m in b.column("__metadata__").to_pylist()]


def test_splits_are_bounded_by_their_files_extremes(catalog: CatalogConfig) -> None:
    """pyiceberg's writer keeps no manifest bounds for fields inside structs: the footer gives them (the
    router's Java writer keeps them, tested end to end in test_backfill_spark)."""
    archive = Archive(catalog, "plays")
    archive.append(spread(START, 300, timedelta(hours=3), seed=1))
    archive.append(spread(START + timedelta(minutes=50), 100, timedelta(minutes=20), seed=2))
    window = Window(to_micros(START), to_micros(START + timedelta(hours=3)))
    made = plan(catalog, ["plays"], window, BoundedOrder(timedelta(minutes=15)))
    (scan,) = made.tables
    assert scan.snapshot_id == archive.table.metadata.current_snapshot_id
    assert sum(split.records for split in scan.splits) == 400
    assert {split.bounds_from for split in scan.splits} == {"footer"}
    extremes = {}
    for data_file in archive.table.inspect.files().to_pylist():
        times = [
            to_micros(m["kafka_ingestion_ts"])
            for m in pa.parquet.read_table(data_file["file_path"].removeprefix("file://"))
            .column("__metadata__")
            .to_pylist()
        ]
        extremes[data_file["file_path"]] = (min(times), max(times))
    assert {split.path: (split.lower, split.upper) for split in scan.splits} == extremes
    for split in scan.splits:
        assert split.lower // HOUR == split.upper // HOUR, "one hour partition per file"
    # The bounds are the files' own extremes, so the hour holding the second append has two splits.
    assert len(made.epochs) == 12
    assert max(len(e.splits) for e in made.epochs) == 2


def test_without_manifest_statistics_the_footer_gives_the_bounds(catalog: CatalogConfig) -> None:
    archive = Archive(
        catalog, "plays", {"write.metadata.metrics.column.__metadata__.kafka_ingestion_ts": "none"}
    )
    times = spread(START + timedelta(minutes=5), 50, timedelta(minutes=10))
    archive.append(times)
    made = plan(catalog, ["plays"], Window(to_micros(START), to_micros(START + HOUR_DELTA)), Unordered())
    (split,) = made.splits
    assert split.bounds_from == "footer"
    assert (split.lower, split.upper) == (to_micros(min(times)), to_micros(max(times)))


HOUR_DELTA = timedelta(hours=1)


def test_without_any_statistics_the_hour_partition_bounds_the_file() -> None:
    data_file = SimpleNamespace(
        lower_bounds={}, upper_bounds={}, partition=[493_141], file_path="s3://archive/plays/x.parquet"
    )
    assert split_bounds(data_file, 10, 0, lambda path: None) == (  # type: ignore[arg-type]
        493_141 * HOUR,
        493_142 * HOUR - 1,
        "partition",
    )
    with pytest.raises(PlanError, match=r"x\.parquet: no bounds"):
        split_bounds(data_file, 10, None, lambda path: None)  # type: ignore[arg-type]


def test_read_batches_emits_the_window_once_within_the_bound(catalog: CatalogConfig) -> None:
    archive = Archive(catalog, "plays")
    for seed in range(4):  # overlapping files: every batch spans the whole three hours
        archive.append(spread(START, 200, timedelta(hours=3), seed=seed))
    start, end = START + timedelta(minutes=7), START + timedelta(hours=2, minutes=41)
    batches = list(read_batches("plays", start, end, "15m", catalog=catalog))
    times = ingestion_times(batches)
    expected = sorted(t for t in archive.times if start <= t < end)
    assert sorted(times) == expected
    assert len(set(offsets(batches))) == len(times)
    newest = times[0]
    for ts in times:
        assert newest - ts <= timedelta(minutes=15)
        newest = max(newest, ts)
    assert times != sorted(times), "inside an epoch rows come in any order"
    metadata = batches[0].schema.metadata
    assert metadata[b"bergstream.table"] == b"bergstream.archive.plays"
    assert metadata[b"bergstream.epoch"] == b"0"

    strict = ingestion_times(list(read_batches("plays", start, end, strict=True, catalog=catalog)))
    assert strict == expected


def test_several_tables_are_read_on_one_grid_of_epochs(catalog: CatalogConfig) -> None:
    impressions, plays = Archive(catalog, "impressions"), Archive(catalog, "plays")
    impressions.append(spread(START, 1000, timedelta(hours=2), seed=3))
    plays.append(spread(START + timedelta(minutes=30), 30, timedelta(minutes=60), seed=4))
    end = START + timedelta(hours=2)
    seen: dict[bytes, list[int]] = {}
    for batch in read_batches(["impressions", "plays"], START, end, "10m", catalog=catalog):
        seen.setdefault(batch.schema.metadata[b"bergstream.table"], []).append(
            int(batch.schema.metadata[b"bergstream.epoch"])
        )
    assert set(seen) == {b"bergstream.archive.impressions", b"bergstream.archive.plays"}
    assert seen[b"bergstream.archive.plays"][0] == 3, "plays start in the epoch of 00:30, the grid's 4th"
    epochs = [e for table in seen.values() for e in table]
    assert sorted(set(epochs)) == list(range(12))


def test_regions_select_rows_of_their_clusters_only(catalog: CatalogConfig) -> None:
    archive = Archive(catalog, "plays")
    archive.append(spread(START, 100, HOUR_DELTA, seed=5), cluster="us-east-1")
    archive.append(spread(START, 60, HOUR_DELTA, seed=6), cluster="eu-west-1")
    batches = list(read_batches("plays", START, START + HOUR_DELTA, "15m", ["eu-west-1"], catalog=catalog))
    clusters = {m["cluster"] for b in batches for m in b.column("__metadata__").to_pylist()}
    assert clusters == {"eu-west-1"}
    assert sum(b.num_rows for b in batches) == 60


def test_a_pinned_snapshot_reads_what_it_read_before_later_appends(catalog: CatalogConfig) -> None:
    archive = Archive(catalog, "plays")
    archive.append(spread(START, 100, HOUR_DELTA, seed=7))
    first = archive.table.metadata.current_snapshot_id
    archive.append(spread(START, 50, HOUR_DELTA, seed=8))
    window = Window(to_micros(START), to_micros(START + HOUR_DELTA))
    pinned = plan(catalog, ["plays"], window, Unordered(), snapshots={"bergstream.archive.plays": first})
    assert pinned.tables[0].records == 100
    assert plan(catalog, ["plays"], window, Unordered()).tables[0].records == 150
    with pytest.raises(PlanError, match=r"no longer has snapshot 12345.*new checkpoint"):
        plan(catalog, ["plays"], window, Unordered(), snapshots={"bergstream.archive.plays": 12345})


def test_columns_added_later_read_as_null_in_older_files(catalog: CatalogConfig) -> None:
    archive = Archive(catalog, "plays")
    archive.append(spread(START, 10, HOUR_DELTA, seed=9))
    with archive.table.update_schema() as update:
        update.add_column("country", StringType())
    rows = [{"account_id": 1, "event_type": "STOP", "country": "BR", "__metadata__": {
        "kafka_ingestion_ts": START + timedelta(minutes=30), "cluster": "us-east-1", "partition": 0,
        "offset": 99}}]  # fmt: skip
    archive.table.append(pa.Table.from_pylist(rows, schema=archive.table.schema().as_arrow()))
    batches = list(read_batches("plays", START, START + HOUR_DELTA, "1h", catalog=catalog))
    countries = [c for b in batches for c in b.column("country").to_pylist()]
    assert sorted(countries, key=str) == ["BR", *[None] * 10]


def test_table_names_resolve_as_the_router_gives_them(catalog: CatalogConfig) -> None:
    for name in ("plays", "archive.plays", "bergstream.archive.plays"):
        assert table_ref(name, catalog).identifier == "bergstream.archive.plays"
    with pytest.raises(PlanError, match="names catalog 'other'"):
        table_ref("other.archive.plays", catalog)
    window = Window(to_micros(START), to_micros(START + HOUR_DELTA))
    with pytest.raises(PlanError, match=r"bergstream\.archive\.missing does not exist"):
        plan(catalog, ["missing"], window, Unordered())


def test_an_empty_table_plans_no_epochs(catalog: CatalogConfig) -> None:
    Archive(catalog, "plays")
    made = plan(catalog, ["plays"], Window(to_micros(START), to_micros(START + HOUR_DELTA)), Unordered())
    assert made.epochs == () and made.tables[0].snapshot_id is None
    assert list(read_batches("plays", START, START + HOUR_DELTA, catalog=catalog)) == []


def test_a_bootstrap_refuses_archived_rows_stamped_past_the_end_of_its_plan(catalog: CatalogConfig) -> None:
    """Kafka timestamps in 2300, which a topic allowing timestamps far in the future takes: below the
    hand-over and past the archive phase's plan, such rows would be read from neither side."""
    archive = Archive(catalog, "plays")
    archive.append(spread(START, 10, HOUR_DELTA))
    archive.append([datetime(2300, 1, 1, tzinfo=UTC)], cluster="eu-west-1")
    identifier = table_ref("plays", catalog).identifier

    def pinned() -> Handover:
        snapshot = archive.table.refresh().metadata.current_snapshot_id
        assert snapshot is not None
        return Handover(identifier, "plays", "us-east-1", snapshot, {0: archive.offset})

    refuse_rows_past(catalog, pinned())  # another cluster's, not read by this bootstrap
    archive.append([datetime(2300, 1, 1, tzinfo=UTC)])
    refused = r"snapshot \d+ holds 1 row\(s\) of cluster us-east-1 below the hand-over stamped by Kafka "
    with pytest.raises(BackfillConfigError, match=refused + "at or after 2200-01-01T00:00:00"):
        refuse_rows_past(catalog, pinned())


def test_a_row_group_is_placed_where_the_parquet_reader_places_it() -> None:
    """parquet-java's range filter gives a group to the split holding its midpoint, counted from the
    dictionary page whenever the footer sets one below the first data page, even at 0: the split offsets'
    rule (a dictionary page at 0 is no start) would place such a group in another split."""
    assert reader_position(1000, None, 400) == 1200
    assert reader_position(1000, 600, 800) == 1000  # a dictionary page first: the chunk starts there
    assert reader_position(1000, 0, 800) == 400  # the reader's own rule, not the split offsets'
    assert reader_position(1000, 1500, 800) == 1400  # a dictionary page after the data page is not first
    check_split_offsets("f.parquet", [400, 1200], [4, 1000], 2000)
    with pytest.raises(PlanError, match=r"f\.parquet: row group 1 lies at byte 2400"):
        check_split_offsets("f.parquet", [400, 2400], [4, 1000], 2000)
    with pytest.raises(PlanError, match="row group 0 lies at byte 400, outside"):
        check_split_offsets("f.parquet", [400, 1200], [600, 1000], 2000)
