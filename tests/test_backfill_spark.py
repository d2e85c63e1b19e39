"""Backfill end to end on real Kafka, Spark and Iceberg: archive with the router, then backfill and replay.

Both topics are produced over two past hours of ingestion time (some events late, some malformed) and
archived by the router; the backfill source, the applications and the replay then read that archive.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bergstream.backfill.read.planner import to_micros
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.runtime.run import run_app
from bergstream.runtime.settings import AppSettings
from bergstream.runtime.sources import Sources
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration
HOURS = 2
B = timedelta(minutes=15)


@dataclass(frozen=True)
class Archived:
    start: datetime
    end: datetime
    topics: dict[str, str]  # kind -> topic name
    tables: dict[str, str]  # kind -> table name


@pytest.fixture(scope="module")
def archived(stack: Services, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Archived:
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=HOURS + 2)
    directory = tmp_path_factory.mktemp("archive")
    topics, tables = {}, {}
    for kind, count, encoding in (("impression", 6000, "avro"), ("playback", 3000, "json")):
        topic = f"bf_{kind}"
        produce(
            ProduceRequest(topic=topic, schema=kind, count=count, encoding=encoding, partitions=3, seed=5,
                           late_fraction=0.05, bad_fraction=0.02, ingestion_start=start,
                           ingestion_span=timedelta(hours=HOURS)),
            stack.bootstrap_servers, show_progress=False,
        )  # fmt: skip
        config = RouterConfig.flat(
            topic=topic, schema=kind, encoding=encoding, table=topic, cluster="us-east-1",
            kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
            checkpoint_location=str(directory / topic), catalog=stack.catalog,
        )  # fmt: skip
        archive_available_now(spark, config)
        topics[kind], tables[kind] = topic, topic
    return Archived(start, start + timedelta(hours=HOURS), topics, tables)


def app_settings(
    stack: Services, archived: Archived, checkpoint: Path, app: str, mode: str, output: str, **backfill: Any
) -> AppSettings:
    kinds = {
        "sessionizer": ["playback"],
        "attribution": ["impression", "playback"],
        "probe": ["impression", "playback"],
    }
    encodings = {"impression": "avro", "playback": "json"}
    return AppSettings.model_validate(
        {
            "app": app,
            "entry": "bergstream.apps.{0}:{0}".format(app if app != "probe" else "sessionizer"),
            "mode": mode,
            "sources": {
                kind: {"topic": archived.topics[kind], "table": archived.tables[kind], "schema": kind,
                       "encoding": encodings[kind], "cluster": "us-east-1"}
                for kind in kinds[app]
            },
            "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
            "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
            "checkpoint_location": str(checkpoint),
            "output_table": output,
            "backfill": {"start": archived.start, "end": archived.end, "max_misalignment": B, **backfill},
            "spark": {"master": "local[2]"},
        }
    )  # fmt: skip


def archive_rows(
    stack: Services, table: str, start: datetime, end: datetime
) -> dict[tuple[int, int], datetime]:
    catalog = stack.catalog.load()
    rows = catalog.load_table(f"{stack.catalog.namespace}.{table}").scan(selected_fields=("__metadata__",))
    found = {}
    for metadata in rows.to_arrow().column("__metadata__").to_pylist():
        if start <= metadata["kafka_ingestion_ts"] < end:
            found[(metadata["partition"], metadata["offset"])] = metadata["kafka_ingestion_ts"]
    return found


def collect_batches(
    spark: SparkSession, sources: Sources, checkpoint: Path, stop_after: int | None = None
) -> list[tuple[int, str, int, int, datetime]]:
    """(batch, source, partition, offset, ingestion time) of every row both sources emit, batch by batch."""
    from pyspark.sql import functions as F

    seen: list[tuple[int, str, int, int, datetime]] = []
    # With stop_after, the batch stop_after - 1 holds the query until it is being stopped: a warm backfill
    # runs its batches faster than they could be watched from here.
    reached, stopping = threading.Event(), threading.Event()

    def keep(frame: Any, batch_id: int) -> None:
        for row in frame.collect():
            seen.append((batch_id, row.source, row.partition, row.offset, row.ts))
        if stop_after is not None and batch_id >= stop_after - 1:
            reached.set()
            stopping.wait(60)

    streams = [
        sources.stream(name).select(
            F.lit(name).alias("source"),
            F.col("__metadata__.partition").alias("partition"),
            F.col("__metadata__.offset").alias("offset"),
            F.col("__metadata__.kafka_ingestion_ts").alias("ts"),
        )
        for name in sources.names
    ]  # fmt: skip
    union = streams[0].unionByName(streams[1])
    writer = union.writeStream.foreachBatch(keep).option("checkpointLocation", str(checkpoint / "query"))
    if stop_after is None:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
    else:
        query = writer.trigger(processingTime="0 seconds").start()
        while not reached.wait(1):
            assert query.isActive, f"the backfill ended before batch {stop_after - 1}: {query.exception()}"
        threading.Timer(0.5, stopping.set).start()  # let the held batch go once the stop has begun
        query.stop()
    assert query.exception() is None
    return seen


def test_two_sources_emit_each_row_of_the_window_once_epoch_by_epoch_aligned(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path
) -> None:
    start, end = archived.start + timedelta(minutes=10), archived.end - timedelta(minutes=7)
    settings = app_settings(
        stack, archived, tmp_path, "probe", "backfill", "apps.unused", start=start, end=end
    )
    sources = Sources(spark, settings)
    seen = collect_batches(spark, sources, tmp_path)
    epochs = sources.plan().epochs
    assert len(epochs) == 8  # 05:10, :15, :30, :45, 06:00, :15, :30, :45-06:53
    for batch, rows in itertools.groupby(sorted(seen), key=lambda r: r[0]):
        epoch = epochs[batch]
        batch_rows = list(rows)
        assert {r[1] for r in batch_rows} == {"impression", "playback"}, "both sources read every epoch"
        assert all(epoch.lower <= to_micros(r[4]) < epoch.upper for r in batch_rows), (
            f"batch {batch} is epoch {batch}"
        )
    newest = None
    for _, _, _, _, ts in sorted(seen, key=lambda r: r[0]):
        if newest is not None:
            assert newest - ts <= B
        newest = ts if newest is None else max(newest, ts)
    for kind in ("impression", "playback"):
        expected = archive_rows(stack, archived.tables[kind], start, end)
        emitted = [(r[2], r[3]) for r in seen if r[1] == kind]
        assert len(emitted) == len(set(emitted)) == len(expected) > 0
        assert set(emitted) == set(expected)
    # Bounds of router-made files come from the manifests.
    assert {split.bounds_from for split in sources.plan().splits} == {"manifest"}


def test_splits_whose_row_groups_lie_outside_the_epoch_are_never_read_and_the_rest_are_packed(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path
) -> None:
    import json

    from bergstream.backfill.read.batches import window_of
    from bergstream.backfill.read.order import BoundedOrder
    from bergstream.backfill.read.planner import plan

    source = stack.catalog.table_identifier(archived.tables["impression"])
    copy = stack.catalog.table_identifier("bf_impression_row_groups")
    spark.sql(f"DROP TABLE IF EXISTS {copy}")
    spark.sql(
        f"CREATE TABLE {copy} USING iceberg TBLPROPERTIES ('write.parquet.row-group-size-bytes' = '32768') "
        f"AS SELECT * FROM {source} ORDER BY __metadata__.kafka_ingestion_ts"
    )
    made = plan(stack.catalog, [copy], window_of(archived.start, archived.end), BoundedOrder(B))
    assert max(len(split.row_groups) for split in made.splits) > 4, "files of many row groups"
    pruned = made.source_plan(made.tables[0].table.identifier, "impression")
    unpruned = {key: value for key, value in pruned.items() if key != "row_groups"}

    def read(source_plan: dict[str, Any], name: str) -> tuple[list[tuple[int, int]], list[dict[str, Any]]]:
        plan_file = tmp_path / f"{name}.json"
        plan_file.write_text(json.dumps(source_plan))
        rows: list[tuple[int, int]] = []
        query = (
            spark.readStream.format("bergstream-backfill").option("plan", str(plan_file)).load()
            .select("__metadata__.partition", "__metadata__.offset").writeStream
            .foreachBatch(lambda frame, batch: rows.extend(tuple(row) for row in frame.collect()))
            .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination()
        # The source's metrics of each epoch: the tasks that read it and the bytes of their row groups.
        return rows, [json.loads(progress.json)["sources"][0]["metrics"] for progress in query.recentProgress]

    rows, epochs = read(pruned, "pruned")
    all_rows, all_epochs = read(unpruned, "unpruned")
    expected = archive_rows(stack, archived.tables["impression"], archived.start, archived.end)
    assert len(rows) == len(set(rows)) == len(expected) and set(rows) == set(all_rows) == set(expected)
    assert len(epochs) == len(all_epochs) == len(made.epochs)
    planned = sum(int(epoch["planned_bytes"]) for epoch in epochs)
    assert 0 < planned < sum(int(epoch["planned_bytes"]) for epoch in all_epochs)
    # An epoch's row groups, many per file, are packed into about one task per core.
    cores = spark.sparkContext.defaultParallelism
    assert all(epoch["reader"] == "spark-parquet" and 0 < int(epoch["tasks"]) <= cores for epoch in epochs)
    # Each file's neighbouring row groups are read as one slice: fewer slices than the row groups read.
    assert sum(int(epoch["slices"]) for epoch in epochs) < sum(int(epoch["splits"]) for epoch in epochs)


def test_row_groups_are_read_by_the_split_iceberg_gives_them_whatever_the_split_offsets_say(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path
) -> None:
    """A file whose manifest's split offsets are not its row groups' starts (a writer that counts a start
    otherwise): the source reads each group in the split Iceberg's reader gives it, and a file whose
    groups no split would read is refused, naming it."""
    import json

    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import parquet_file_to_data_file, schema_to_pyarrow
    from pyiceberg.manifest import DATA_FILE_TYPE

    from bergstream.backfill.errors import PlanError
    from bergstream.backfill.read.batches import window_of
    from bergstream.backfill.read.order import BoundedOrder
    from bergstream.backfill.read.planner import plan

    iceberg = stack.catalog.load()
    source = iceberg.load_table(f"{stack.catalog.namespace}.{archived.tables['impression']}")
    rows = source.scan().to_arrow()
    ts = pc.struct_field(rows.column("__metadata__"), "kafka_ingestion_ts")
    rows = rows.take(pc.array_sort_indices(ts)).cast(
        schema_to_pyarrow(source.schema(), include_field_ids=False)
    )
    path = str(tmp_path / "four-groups.parquet")
    pq.write_table(rows, path, row_group_size=len(rows) // 4 + 1)
    footer = pq.ParquetFile(path).metadata
    first = footer.row_group(0)
    start = first.column(0).dictionary_page_offset if first.column(0).has_dictionary_page else 4
    middle = start + sum(first.column(c).total_compressed_size for c in range(first.num_columns)) // 2
    expected = archive_rows(stack, archived.tables["impression"], archived.start, archived.end)

    def read_with(name: str, split_offsets: list[int]) -> list[tuple[int, int]]:
        identifier = f"{stack.catalog.namespace}.{name}"
        if iceberg.table_exists(identifier):
            iceberg.drop_table(identifier)
        # The file has no field ids, as a file added from outside Iceberg: its columns are mapped by name.
        mapping = {"schema.name-mapping.default": source.schema().name_mapping.model_dump_json()}
        table = iceberg.create_table(identifier, schema=source.schema(), properties=mapping)
        data_file = parquet_file_to_data_file(table.io, table.metadata, path)
        fields = [field.name for field in DATA_FILE_TYPE[table.format_version].fields]
        data_file[fields.index("split_offsets")] = split_offsets
        with table.transaction() as transaction, transaction.update_snapshot().fast_append() as append:
            append.append_data_file(data_file)
        made = plan(stack.catalog, [identifier], window_of(archived.start, archived.end), BoundedOrder(B))
        plan_file = tmp_path / f"{name}.json"
        plan_file.write_text(json.dumps(made.source_plan(made.tables[0].table.identifier, "impression")))
        read: list[tuple[int, int]] = []
        query = (
            spark.readStream.format("bergstream-backfill").option("plan", str(plan_file)).load()
            .select("__metadata__.partition", "__metadata__.offset").writeStream
            .foreachBatch(lambda frame, batch: read.extend(tuple(row) for row in frame.collect()))
            .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination()
        return read

    # Iceberg cuts the file at the second offset, past the first group's start and up to its midpoint: its
    # reader gives the first group to the second split, which holds the starts of the other groups.
    offsets = [4, *(footer.row_group(g).column(0).data_page_offset for g in range(1, 4))]
    read = read_with("bf_split_offsets_moved", [4, middle, *offsets[2:]])
    assert len(read) == len(set(read)) == len(expected) and set(read) == set(expected)
    # A first offset past the first group's midpoint: no split would read that group.
    with pytest.raises(PlanError, match=r"four-groups\.parquet: row group 0 lies at byte"):
        read_with("bf_split_offsets_past", [middle + 1, *offsets[2:]])


def test_strict_order_reads_each_source_in_exact_ingestion_order(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path
) -> None:
    start, end = archived.start + timedelta(minutes=30), archived.start + timedelta(minutes=60)
    settings = app_settings(stack, archived, tmp_path, "probe", "backfill", "apps.unused", strict=True,
                            start=start, end=end)  # fmt: skip
    sources = Sources(spark, settings)
    seen = collect_batches(spark, sources, tmp_path)  # collect() keeps each partition's order
    assert len(sources.plan().epochs) == 6, "strict epochs are 5 minutes wide"
    for kind in ("impression", "playback"):
        times = [r[4] for r in seen if r[1] == kind]
        assert times == sorted(times)
        expected = archive_rows(stack, archived.tables[kind], start, end)
        assert len(times) == len(expected)


def test_strict_order_sorts_an_epoch_read_from_a_single_file_of_unordered_rows(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path
) -> None:
    import json

    import pyarrow.compute as pc

    from bergstream.backfill.read.batches import window_of
    from bergstream.backfill.read.order import StrictOrder
    from bergstream.backfill.read.planner import plan

    iceberg = stack.catalog.load()
    source = iceberg.load_table(f"{stack.catalog.namespace}.{archived.tables['playback']}")
    rows = source.scan().to_arrow()
    name = f"{stack.catalog.namespace}.bf_unordered_file"
    if iceberg.table_exists(name):
        iceberg.drop_table(name)
    # One file, its rows newest first: every epoch reads a single split, in the file's order.
    ts = pc.struct_field(rows.column("__metadata__"), "kafka_ingestion_ts")
    iceberg.create_table(name, schema=source.schema()).append(
        rows.take(pc.array_sort_indices(ts, order="descending"))
    )
    start, end = archived.start, archived.start + timedelta(minutes=20)
    made = plan(stack.catalog, [name], window_of(start, end), StrictOrder(timedelta(minutes=5)))
    assert len(made.epochs) == 4 and all(len(epoch.splits) == 1 for epoch in made.epochs)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(made.source_plan(made.tables[0].table.identifier, "playback")))
    seen: list[tuple[int, datetime]] = []
    query = (
        spark.readStream.format("bergstream-backfill").option("plan", str(plan_file)).load()
        .select("__metadata__.kafka_ingestion_ts").writeStream
        .foreachBatch(lambda frame, batch: seen.extend((batch, row[0]) for row in frame.collect()))
        .option("checkpointLocation", str(tmp_path / "query")).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    times = [t for _, t in seen]
    assert len(times) == len(archive_rows(stack, archived.tables["playback"], start, end)) > 10
    assert times == sorted(times), "an epoch of one split came in the file's order"


def test_a_table_empty_when_planned_yields_no_rows_even_when_rows_arrive_later(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    source = stack.catalog.table_identifier(archived.tables["playback"])
    empty = stack.catalog.table_identifier("bf_empty_when_planned")
    iceberg = stack.catalog.load()
    schema = iceberg.load_table(f"{stack.catalog.namespace}.{archived.tables['playback']}").schema()
    iceberg.create_table(f"{stack.catalog.namespace}.bf_empty_when_planned", schema=schema)
    # Impressions make the epochs; playbacks come from the empty table.
    settings = app_settings(stack, archived, tmp_path, "probe", "backfill", "apps.unused")
    playback = settings.sources["playback"].model_copy(update={"table": "bf_empty_when_planned"})
    settings = settings.model_copy(update={"sources": {**settings.sources, "playback": playback}})
    sources = Sources(spark, settings)
    assert sources.plan().scan_of(empty).snapshot_id is None and sources.plan().epochs
    spark.sql(f"INSERT INTO {empty} SELECT * FROM {source}")
    read: list[int] = []
    query = (
        sources.stream("playback").select(F.col("__metadata__.offset"))
        .writeStream.foreachBatch(lambda frame, _: read.append(frame.count()))
        .option("checkpointLocation", str(tmp_path / "query")).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    assert spark.table(empty).count() > 0, "rows arrived after the plan"
    assert sum(read) == 0, "the backfill read the table as it is now, not as it was planned"


@pytest.mark.parametrize("scheme", ["file", "viewfs"])
def test_a_checkpoint_on_another_hadoop_file_system_keeps_the_plan_beside_it(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path, scheme: str
) -> None:
    """The plan, the rows read and the checkpoint's logs go through Hadoop's FileSystem: a checkpoint
    Spark reaches only through Hadoop (here a viewfs mount of a local folder) works as a local one."""
    target = tmp_path / "mounted"
    if scheme == "viewfs":
        mount = f"fs.viewfs.mounttable.{tmp_path.name}.link./checkpoints"
        spark.sparkContext._jsc.hadoopConfiguration().set(mount, target.as_uri())  # type: ignore[union-attr]
        location = f"viewfs://{tmp_path.name}/checkpoints/sessionizer"
    else:
        location = f"{target.as_uri()}/sessionizer"
    settings = app_settings(stack, archived, tmp_path, "sessionizer", "backfill", f"on_{scheme}",
                            end=archived.start + timedelta(minutes=30))  # fmt: skip
    settings = settings.model_copy(update={"checkpoint_location": location})
    report = run_app(spark, settings, show_progress=False)
    assert report.complete, report.problems
    assert report.rows_read["playback"] == report.rows_in_archive["playback"] > 0
    kept = target / "sessionizer" / "bergstream-backfill"
    assert {"plan.json", "playback.json", "rows.json"} <= {p.name for p in kept.iterdir()}
    assert (target / "sessionizer" / "commits").is_dir()


def test_backfill_and_live_sources_have_the_same_columns(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path
) -> None:
    for kind in ("impression", "playback"):
        live = Sources(spark, app_settings(stack, archived, tmp_path / "live", "attribution", "live", "x"))
        backfill = Sources(
            spark, app_settings(stack, archived, tmp_path / "bf", "attribution", "backfill", "x")
        )
        live_schema, backfill_schema = live.stream(kind).schema, backfill.stream(kind).schema
        assert [(f.name, f.dataType.simpleString()) for f in live_schema] == [
            (f.name, f.dataType.simpleString()) for f in backfill_schema
        ]


def test_a_stopped_backfill_resumes_from_its_checkpoint_every_row_once(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path
) -> None:
    settings = app_settings(stack, archived, tmp_path, "probe", "backfill", "apps.unused")
    first = collect_batches(spark, Sources(spark, settings), tmp_path, stop_after=3)
    assert 3 <= len({r[0] for r in first}) < 8
    rest = collect_batches(spark, Sources(spark, settings), tmp_path)
    # A batch whose rows reached the sink before the stop, but whose commit did not, runs again after the
    # restart under the same id (foreachBatch's contract: a sink is idempotent by batch id). It must hold
    # the same rows.
    replayed = {r[0] for r in first} & {r[0] for r in rest}
    assert len(replayed) <= 1
    for batch in replayed:
        assert sorted(r for r in first if r[0] == batch) == sorted(r for r in rest if r[0] == batch)
    emitted = [(r[1], r[2], r[3]) for r in first + [r for r in rest if r[0] not in replayed]]
    assert len(emitted) == len(set(emitted))
    for kind in ("impression", "playback"):
        expected = archive_rows(stack, archived.tables[kind], archived.start, archived.end)
        assert {(p, o) for source, p, o in emitted if source == kind} == set(expected)


def test_a_checkpoint_is_refused_to_another_backfill(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path
) -> None:
    import json

    from bergstream.backfill.errors import CheckpointMismatch

    settings = app_settings(stack, archived, tmp_path, "probe", "backfill", "apps.unused")
    collect_batches(spark, Sources(spark, settings), tmp_path, stop_after=2)
    later = app_settings(stack, archived, tmp_path, "probe", "backfill", "apps.unused",
                         start=archived.start + timedelta(minutes=30))  # fmt: skip
    with pytest.raises(CheckpointMismatch, match="give this backfill a checkpoint of its own"):
        Sources(spark, later).plan()
    # The same regions in another order are the same backfill, as the checkpoint's name says.
    regions = ["us-east-1", "eu-west-1"]
    first = app_settings(
        stack, archived, tmp_path / "regions", "probe", "backfill", "apps.unused", regions=regions
    )
    Sources(spark, first).plan()
    again = app_settings(stack, archived, tmp_path / "regions", "probe", "backfill", "apps.unused",
                         regions=regions[::-1])  # fmt: skip
    assert Sources(spark, again).plan().regions == Sources(spark, first).plan().regions
    # A strict checkpoint whose request does not say its epochs' width (they were an hour wide then).
    strict = app_settings(
        stack, archived, tmp_path / "strict", "probe", "backfill", "apps.unused", strict=True
    )
    Sources(spark, strict).plan()
    plan_file = tmp_path / "strict" / "bergstream-backfill" / "plan.json"
    planned = json.loads(plan_file.read_text())
    del planned["request"]["epoch_us"]
    plan_file.write_text(json.dumps(planned))
    (plan_file.parent / f".{plan_file.name}.crc").unlink(missing_ok=True)
    with pytest.raises(CheckpointMismatch, match="give this backfill a checkpoint of its own"):
        Sources(spark, strict).plan()
    # A plan file changed under the checkpoint: the source itself refuses the checkpointed offsets.
    for name in ("impression", "playback"):
        path = tmp_path / "bergstream-backfill" / f"{name}.json"
        changed = json.loads(path.read_text())
        changed["epochs"] = changed["epochs"][1:]
        changed["window"][0] = changed["epochs"][0][0]
        path.write_text(json.dumps(changed))
        # Changed where no checksum says so (Hadoop's local file system keeps one beside each file).
        (path.parent / f".{path.name}.crc").unlink(missing_ok=True)
    frames = [
        spark.readStream.format("bergstream-backfill")
        .option("plan", str(tmp_path / "bergstream-backfill" / f"{name}.json"))
        .load()
        .select("__metadata__")
        for name in ("impression", "playback")
    ]
    query = (
        frames[0].unionByName(frames[1]).writeStream.foreachBatch(lambda frame, batch: None)
        .option("checkpointLocation", str(tmp_path / "query")).trigger(availableNow=True).start()
    )  # fmt: skip
    with pytest.raises(Exception, match="belongs to another backfill"):
        query.awaitTermination()


def output_rows(spark: SparkSession, table: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(row) for row in spark.table(f"bergstream.apps.{table}").collect())


@pytest.mark.parametrize("app", ["sessionizer", "attribution"])
def test_an_application_gives_the_same_output_live_and_as_a_backfill(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path, app: str
) -> None:
    """No record is late for the application in either run (its watermark delay of an hour covers the
    load's lateness and B), so both runs write the same rows."""
    live = app_settings(stack, archived, tmp_path / "live", app, "live", f"{app}_live")
    report = run_app(spark, live, available_now=True, show_progress=False)
    backfill = app_settings(stack, archived, tmp_path / "backfill", app, "backfill", f"{app}_backfill")
    backfilled = run_app(spark, backfill, show_progress=False)
    assert backfilled.position.epoch == len(Sources(spark, backfill).plan().epochs)
    assert sum(backfilled.position.rows.values()) == sum(backfilled.rows_in_archive.values())
    assert report.position.kafka_end_offsets, "a live run reports where it is in Kafka"
    rows = output_rows(spark, f"{app}_live")
    assert len(rows) > 10
    assert output_rows(spark, f"{app}_backfill") == rows


def consume_all(bootstrap: str, topic: str, count: int) -> list[Any]:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    partitions = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics[topic]
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{topic}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions.partitions])
    messages = []
    while len(messages) < count:
        message = consumer.poll(10)
        assert message is not None, f"only {len(messages)} of {count} records came back from {topic}"
        assert message.error() is None
        messages.append(message)
    consumer.close()
    return messages


def test_replay_republishes_the_window_in_backfill_order(
    stack: Services, archived: Archived, tmp_path: Path
) -> None:
    from bergstream.backfill.read.batches import window_of
    from bergstream.backfill.read.order import BoundedOrder
    from bergstream.backfill.replay import replay
    from bergstream.schemas.event_schema import load_event_schema

    table = archived.tables["playback"]
    report = replay(
        stack.catalog, table, window_of(archived.start, archived.end), BoundedOrder(B), "bf_replayed",
        {"bootstrap.servers": stack.bootstrap_servers}, include_dead_letters=True,
    )  # fmt: skip
    assert report.epochs_done == report.epochs == 8
    assert report.dead_letters > 0
    iceberg = stack.catalog.load()
    archive = {
        (r["__metadata__"]["partition"], r["__metadata__"]["offset"]): r
        for name in (table, f"{table}__dlq")
        for r in iceberg.load_table(f"archive.{name}").scan().to_arrow().to_pylist()
    }
    messages = consume_all(stack.bootstrap_servers, "bf_replayed", report.records + report.dead_letters)
    schema = load_event_schema("playback")
    seen = []
    newest: dict[int, int] = {}
    for message in messages:
        headers = dict(message.headers())
        assert headers["bergstream.source.topic"] == table.encode()
        key = (int(headers["bergstream.source.partition"]), int(headers["bergstream.source.offset"]))
        seen.append(key)
        row = archive[key]
        metadata = row["__metadata__"]
        assert message.key() == metadata["key"]
        assert message.timestamp()[1] == to_micros(metadata["kafka_ingestion_ts"]) // 1000
        assert headers["producer"] == b"bergstream-loadgen" and headers["encoding"] == b"json"
        if "bergstream.dead-letter.reason" in headers:
            assert message.value() == row["raw_value"]
            assert headers["bergstream.dead-letter.reason"] == row["error"].encode()
        else:
            event = schema.decode(message.value(), "json")
            assert {name: event[name] for name in ("playback_id", "account_id", "event_type", "device")} == {
                name: row[name] for name in ("playback_id", "account_id", "event_type", "device")
            }
            assert datetime.fromisoformat(event["event_ts"]) == row["event_ts"]
        # Each partition of the replayed topic is a subsequence of the backfill order: within B too.
        ts, partition = message.timestamp()[1], message.partition()
        assert newest.get(partition, ts) - ts <= B // timedelta(milliseconds=1)
        newest[partition] = max(newest.get(partition, ts), ts)
    assert len(seen) == len(set(seen)) == len(archive)


def test_replay_encodes_avro_values_as_the_topic_does(stack: Services, archived: Archived) -> None:
    from bergstream.backfill.read.batches import window_of
    from bergstream.backfill.read.order import BoundedOrder
    from bergstream.backfill.replay import replay
    from bergstream.schemas.event_schema import load_event_schema

    table = archived.tables["impression"]
    start = archived.start + timedelta(minutes=20)
    window = window_of(start, start + timedelta(minutes=30))
    report = replay(
        stack.catalog, table, window, BoundedOrder(B), "bf_replayed_avro",
        {"bootstrap.servers": stack.bootstrap_servers}, include_dead_letters=True,
    )  # fmt: skip
    iceberg = stack.catalog.load()
    archive = {
        (r["__metadata__"]["partition"], r["__metadata__"]["offset"]): r
        for name in (table, f"{table}__dlq")
        for r in iceberg.load_table(f"archive.{name}").scan().to_arrow().to_pylist()
        if start <= r["__metadata__"]["kafka_ingestion_ts"] < start + timedelta(minutes=30)
    }
    messages = consume_all(stack.bootstrap_servers, "bf_replayed_avro", report.records + report.dead_letters)
    assert report.records > 0 and len(messages) == len(archive)
    schema = load_event_schema("impression")
    names = [field["name"] for field in schema.fields]
    for message in messages:
        headers = dict(message.headers())
        row = archive[(int(headers["bergstream.source.partition"]), int(headers["bergstream.source.offset"]))]
        assert headers["encoding"] == b"avro"
        if "bergstream.dead-letter.reason" in headers:
            assert message.value() == row["raw_value"]
        else:
            assert schema.decode(message.value(), "avro") == {name: row[name] for name in names}


def test_a_replay_that_fails_says_where_it_stopped(stack: Services, archived: Archived) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from bergstream.backfill.errors import BackfillError
    from bergstream.backfill.read.batches import window_of
    from bergstream.backfill.read.order import BoundedOrder
    from bergstream.backfill.replay import replay

    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    small = NewTopic(
        "bf_too_small", num_partitions=1, replication_factor=1, config={"max.message.bytes": "200"}
    )
    admin.create_topics([small])["bf_too_small"].result(timeout=30)
    with pytest.raises(
        BackfillError, match=r"stopped in epoch 0 .*aborted.* No epoch was delivered whole; the same command"
    ):
        replay(
            stack.catalog, archived.tables["playback"], window_of(archived.start, archived.end),
            BoundedOrder(B), "bf_too_small", {"bootstrap.servers": stack.bootstrap_servers},
        )  # fmt: skip


def test_a_backfill_stopped_then_killed_resumes_with_the_same_output_and_reports_every_run(
    stack: Services, spark: SparkSession, archived: Archived, tmp_path: Path
) -> None:
    """`bergstream backfill run` stopped with SIGTERM (it exits 1: its report says the window is not
    covered), then killed (driver and JVM) after two more micro-batches, then run again with the same
    command: it writes what an uninterrupted backfill writes, each batch's output once, and its report
    counts the rows of all three runs against the archive's."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    uninterrupted = app_settings(
        stack, archived, tmp_path / "whole", "sessionizer", "backfill", "killed_whole"
    )
    run_app(spark, uninterrupted, show_progress=False)
    settings = app_settings(stack, archived, tmp_path / "app", "sessionizer", "backfill", "killed_resumed")
    config = tmp_path / "sessionizer.yaml"
    config.write_text(yaml.safe_dump(settings.model_dump(mode="json", by_alias=True, exclude={"backfill"})))
    checkpoint = tmp_path / "checkpoint"
    command = [
        sys.executable, "-m", "bergstream", "backfill", "run", "--app", "sessionizer",
        "--config", str(config), "--start", archived.start.isoformat(), "--end", archived.end.isoformat(),
        "--max-misalignment", "15m", "--checkpoint", str(checkpoint), "--json",
    ]  # fmt: skip
    root = Path(__file__).parent.parent
    stopped = subprocess.Popen(
        command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 240
    while len(list((checkpoint / "commits").glob("[0-9]*"))) < 1:
        assert stopped.poll() is None, stopped.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the backfill committed no micro-batch in 240s"
        time.sleep(0.2)
    stopped.send_signal(signal.SIGTERM)
    out, err = stopped.communicate(timeout=120)
    assert stopped.returncode == 1, err[-2000:]
    partial = json.loads(out)
    assert partial["complete"] is False and "covered to" in partial["problems"][0], partial
    assert "incomplete" in err.strip().splitlines()[-1]
    before_kill = len(list((checkpoint / "commits").glob("[0-9]*")))
    with (tmp_path / "killed.log").open("wb") as log:
        process = subprocess.Popen(
            command, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 240
    while len(list((checkpoint / "commits").glob("[0-9]*"))) < before_kill + 2:
        assert process.poll() is None, (tmp_path / "killed.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "the backfill committed no two micro-batches in 240s"
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    committed = len(list((checkpoint / "commits").glob("[0-9]*")))
    assert committed < 9, "killed before the end of the window"
    resumed = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300, check=False)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    report = json.loads(resumed.stdout)
    assert report["complete"] is True and report["problems"] == []
    assert report["watermark"] == archived.end.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert report["rows"] == report["rows_in_archive"] and report["rows"]["playback"] > 0
    (handover,) = report["handovers"].values()
    assert handover["topic"] == archived.topics["playback"] and len(handover["offsets"]) == 3
    assert output_rows(spark, "killed_resumed") == output_rows(spark, "killed_whole")
    assert len(output_rows(spark, "killed_whole")) > 10
