"""The archive in an S3 object store (versitygw) behind Iceberg's REST catalog server, as `bergstream local up
--object-store s3 --catalog rest` runs them: the router writes it, maintenance compacts it, the backfill
source, read_batches and the replay read it back, and every file is in the bucket, none in a folder.

The servers start once for the module; the tests share the session's Kafka broker and SparkSession, in
which each catalog here is registered under a name of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyarrow.fs import FileSelector, FileType

from backfill.batches import read_batches, window_of
from backfill.order import BoundedOrder
from backfill.replay import replay
from backfill.settings import AppSettings
from backfill.sources import Sources
from bergstream.catalog import CatalogConfig
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local import object_store as store_server
from bergstream.local import rest_catalog
from bergstream.local.processes import free_port
from router.app import archive_available_now
from router.config import RouterConfig
from router.maintain import maintain
from tests.routers import ROOT, produced_offsets
from tests.services import Services
from tests.test_backfill_spark import consume_all

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration
B = timedelta(minutes=15)


@pytest.fixture(scope="module")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[store_server.ObjectStoreConfig]:
    config = store_server.ObjectStoreConfig(tmp_path_factory.mktemp("object-store"), port=free_port())
    store_server.start(config)
    yield config
    store_server.stop(config)


def register(spark: SparkSession, catalog: CatalogConfig) -> CatalogConfig:
    """Make `catalog` known to the session by its name, beside the session's own catalog."""
    for key, value in catalog.spark_conf().items():
        spark.conf.set(key, value)
    return catalog


@pytest.fixture(scope="module")
def rest_on_s3(
    object_store: store_server.ObjectStoreConfig,
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[CatalogConfig]:
    properties = object_store.catalog_properties()
    server = rest_catalog.RestCatalogConfig(
        tmp_path_factory.mktemp("rest-catalog"),
        object_store.warehouse,
        port=free_port(),
        properties=properties,
    )
    rest_catalog.start(server)
    yield register(
        spark,
        CatalogConfig(
            name="s3rest",
            type="rest",
            uri=server.uri,
            warehouse=object_store.warehouse,
            properties=properties,
        ),
    )
    rest_catalog.stop(server)


def table_offsets(catalog: CatalogConfig, table: str) -> list[tuple[int, int]]:
    """(partition, offset) of every row of the table, read with pyiceberg."""
    scan = catalog.load().load_table(f"{catalog.namespace}.{table}").scan(selected_fields=("__metadata__",))
    return [(m["partition"], m["offset"]) for m in scan.to_arrow().column("__metadata__").to_pylist()]


def offsets(catalog: CatalogConfig, table: str) -> list[tuple[int, int]]:
    """(partition, offset) of every row of the table and of its dead-letter table."""
    return table_offsets(catalog, table) + table_offsets(catalog, f"{table}__dlq")


def data_files(catalog: CatalogConfig, table: str) -> list[dict[str, Any]]:
    files: list[dict[str, Any]] = (
        catalog.load().load_table(f"{catalog.namespace}.{table}").inspect.files().to_pylist()
    )
    return files


def bucket_objects(catalog: CatalogConfig, bucket: str) -> set[str]:
    """s3:// URIs of every object under the bucket's warehouse, listed through the S3 API."""
    listed = catalog.filesystem().get_file_info(FileSelector(f"{bucket}/warehouse", recursive=True))
    return {f"s3://{info.path}" for info in listed if info.type == FileType.File}


def _table_file(path: Path) -> bool:
    """A data, manifest or metadata file of an Iceberg table."""
    return path.suffix in (".parquet", ".avro") or path.name.endswith(".metadata.json")


def router_config(catalog: CatalogConfig, stack: Services, topic: str, checkpoint: Path) -> RouterConfig:
    return RouterConfig(
        topic=topic, schema="playback", encoding="json", table=topic, cluster="us-east-1",
        kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        checkpoint_location=str(checkpoint), catalog=catalog, max_offsets_per_trigger=1000,
    )  # fmt: skip


def backfill_offsets(
    spark: SparkSession, catalog: CatalogConfig, topic: str, start: datetime, end: datetime, checkpoint: Path
) -> list[tuple[int, int]]:
    """(partition, offset) of every row the backfill source emits for the window."""
    settings = AppSettings.model_validate(
        {
            "app": "s3-probe", "entry": "apps.sessionizer:sessionizer", "mode": "backfill",
            "sources": {"playback": {"topic": topic, "table": topic, "schema": "playback"}},
            "catalog": catalog.model_dump(mode="json", exclude_none=True),
            "checkpoint_location": str(checkpoint), "output_table": "unused",
            "backfill": {"start": start, "end": end, "max_misalignment": B},
        }
    )  # fmt: skip
    seen: list[tuple[int, int]] = []

    def keep(frame: Any, batch_id: int) -> None:
        seen.extend((row.partition, row.offset) for row in frame.collect())

    stream = (
        Sources(spark, settings)
        .stream("playback")
        .selectExpr("__metadata__.partition", "__metadata__.offset")
    )
    query = (
        stream.writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(checkpoint / "query"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    return seen


def test_router_maintenance_backfill_and_replay_on_s3_through_the_rest_catalog(
    stack: Services,
    spark: SparkSession,
    object_store: store_server.ObjectStoreConfig,
    rest_on_s3: CatalogConfig,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    catalog, topic = rest_on_s3, "s3_playback"
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=4)
    end = start + timedelta(hours=2)
    request = ProduceRequest(
        topic=topic, schema="playback", count=3000, partitions=2, seed=11, late_fraction=0.05,
        bad_fraction=0.02, ingestion_start=start, ingestion_span=end - start,
    )  # fmt: skip
    produced = produced_offsets(produce(request, stack.bootstrap_servers, show_progress=False).offsets)
    config = router_config(catalog, stack, topic, tmp_path / "router")

    totals = archive_available_now(spark, config)
    assert totals.read == 3000 and totals.dead_lettered > 0
    seen = offsets(catalog, topic)
    assert len(seen) == len(set(seen)) and set(seen) == produced

    hours_before = Counter(next(iter(f["partition"].values())) for f in data_files(catalog, topic))
    assert len(hours_before) == 2 and min(hours_before.values()) > 1, hours_before
    compacted, _ = maintain(spark, config)
    assert compacted.rewritten_files == sum(hours_before.values()) and compacted.added_files == 2, compacted
    seen = offsets(catalog, topic)
    assert len(seen) == len(set(seen)) and set(seen) == produced, "compaction lost or doubled a row"

    # Every table file is an object of the bucket, listed through the S3 API, and none is in a folder.
    objects = bucket_objects(catalog, object_store.bucket)
    for table in (topic, f"{topic}__dlq"):
        paths = {f["file_path"] for f in data_files(catalog, table)}
        assert paths and paths <= objects, f"{table}: {sorted(paths - objects)[:3]} not in the bucket"
        metadata = catalog.load().load_table(f"{catalog.namespace}.{table}").metadata_location
        assert metadata.startswith(f"s3://{object_store.bucket}/warehouse/") and metadata in objects
    folders = [ROOT / "spark-warehouse", tmp_path_factory.getbasetemp()]
    local = [
        path
        for folder in folders
        for path in folder.rglob("*")
        if topic in str(path) and not path.is_relative_to(object_store.root) and _table_file(path)
    ]
    assert local == [], f"table files outside the object store: {local[:3]}"

    archived = set(table_offsets(catalog, topic))
    emitted = backfill_offsets(spark, catalog, topic, start, end, tmp_path / "backfill")
    assert len(emitted) == len(set(emitted)) and set(emitted) == archived

    read = [
        (m["partition"], m["offset"])
        for batch in read_batches(topic, start, end, B, catalog=catalog)
        for m in batch.column("__metadata__").to_pylist()
    ]
    assert len(read) == len(set(read)) and set(read) == archived

    report = replay(
        catalog, topic, window_of(start, end), BoundedOrder(B), f"{topic}_replayed",
        {"bootstrap.servers": stack.bootstrap_servers}, include_dead_letters=True,
    )  # fmt: skip
    messages = consume_all(stack.bootstrap_servers, f"{topic}_replayed", report.records + report.dead_letters)
    replayed = [
        (int(headers["bergstream.source.partition"]), int(headers["bergstream.source.offset"]))
        for headers in (dict(message.headers()) for message in messages)
    ]
    assert len(replayed) == len(set(replayed)) and set(replayed) == produced
