"""The archive in an S3 object store (versitygw) behind Iceberg's REST catalog server, as `bergstream local up
--object-store s3 --catalog rest` runs them: the router writes it, maintenance compacts it, the backfill
source, read_batches and the replay read it back, and every file is in the bucket, none in a folder.

The servers start once for the module; the tests share the session's Kafka broker and SparkSession, in
which each catalog here is registered under a name of its own.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pytest
from pyarrow.fs import FileSelector, FileType

from bergstream.backfill.read.batches import read_batches, window_of
from bergstream.backfill.read.order import BoundedOrder
from bergstream.backfill.replay import replay
from bergstream.catalog import CatalogConfig
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local import LocalStack, rest_catalog
from bergstream.local import object_store as store_server
from bergstream.local.processes import alive, free_port, free_ports
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.router.maintain import maintain
from bergstream.runtime.settings import AppSettings
from bergstream.runtime.sources import Sources
from tests.routers import ROOT, produced_offsets
from tests.services import Services
from tests.test_backfill_spark import consume_all
from tests.tools import built_with_go

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration
B = timedelta(minutes=30)


@pytest.fixture(scope="module")
def versitygw() -> Path:
    return built_with_go(store_server.VERSITYGW)


@pytest.fixture(scope="module")
def object_store(
    versitygw: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[store_server.ObjectStoreConfig]:
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
    return RouterConfig.flat(
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
            "app": "s3-probe", "entry": "bergstream.apps.sessionizer:sessionizer", "mode": "backfill",
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
    # Iceberg's S3FileIO reaches the store, Hadoop's FileSystem does not: Iceberg's reader reads the files.
    progress = query.lastProgress
    assert progress is not None and progress.sources[0].metrics["reader"] == "iceberg"
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


def archive_now(
    stack: Services, spark: SparkSession, catalog: CatalogConfig, topic: str, checkpoint: Path
) -> set[tuple[int, int]]:
    """Produce 1000 playback records (some malformed) and archive them; the produced (partition, offset)s."""
    request = ProduceRequest(topic=topic, schema="playback", count=1000, partitions=2, bad_fraction=0.02)
    produced = produced_offsets(produce(request, stack.bootstrap_servers, show_progress=False).offsets)
    archive_available_now(spark, router_config(catalog, stack, topic, checkpoint))
    return produced


def test_a_jdbc_catalog_keeps_its_tables_in_the_object_store(
    stack: Services,
    spark: SparkSession,
    object_store: store_server.ObjectStoreConfig,
    tmp_path: Path,
) -> None:
    """`local up --object-store s3` alone: the SQLite JDBC catalog, the warehouse in the bucket."""
    catalog = register(
        spark,
        CatalogConfig(
            name="s3jdbc", uri=f"jdbc:sqlite:{tmp_path / 'catalog.db'}", warehouse=object_store.warehouse,
            properties=object_store.catalog_properties(),
        ),
    )  # fmt: skip
    topic = "s3_jdbc_playback"
    produced = archive_now(stack, spark, catalog, topic, tmp_path / "router")
    seen = offsets(catalog, topic)
    assert len(seen) == len(set(seen)) and set(seen) == produced
    objects = bucket_objects(catalog, object_store.bucket)
    paths = {f["file_path"] for f in data_files(catalog, topic)}
    assert paths and paths <= objects
    assert [path for path in tmp_path.rglob("*") if _table_file(path)] == []


def test_a_rest_catalog_over_a_warehouse_folder(stack: Services, spark: SparkSession, tmp_path: Path) -> None:
    """`local up --catalog rest` alone: Iceberg's REST server, and table files in a folder."""
    warehouse = tmp_path / "warehouse"
    server = rest_catalog.RestCatalogConfig(tmp_path / "rest", warehouse.as_uri(), port=free_port())
    rest_catalog.start(server)
    try:
        catalog = register(spark, CatalogConfig(name="folderrest", type="rest", uri=server.uri,
                                                warehouse=warehouse.as_uri()))  # fmt: skip
        topic = "rest_folder_playback"
        produced = archive_now(stack, spark, catalog, topic, tmp_path / "router")
        seen = offsets(catalog, topic)
        assert len(seen) == len(set(seen)) and set(seen) == produced
        files = [urlparse(f["file_path"]) for f in data_files(catalog, topic)]
        assert files and all(file.scheme == "file" for file in files)
        assert all(Path(file.path).is_relative_to(warehouse / "archive" / topic) for file in files)
        assert all(Path(file.path).is_file() for file in files)
    finally:
        rest_catalog.stop(server)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bergstream", *args], capture_output=True, text=True, check=False, timeout=300,
        cwd=ROOT,
    )  # fmt: skip


def test_local_up_runs_the_object_store_and_the_rest_catalog(versitygw: Path, tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "stack")]
    kafka, controller, store, rest = free_ports(4)
    flags = ["--kafka-port", str(kafka), "--controller-port", str(controller), "--object-store", "s3",
             "--object-store-port", str(store), "--catalog", "rest", "--rest-port", str(rest)]  # fmt: skip
    up = run("local", "up", *data, *flags)
    try:
        assert up.returncode == 0, up.stderr
        shown = run("local", "status", *data, "--json")
        status = json.loads(shown.stdout)
        assert (status["catalog_type"], status["catalog_uri"]) == ("rest", f"http://127.0.0.1:{rest}")
        assert status["warehouse"] == "s3://bergstream/warehouse"
        assert status["object_store_endpoint"] == f"http://127.0.0.1:{store}"
        credentials = Path(status["object_store_credentials"])
        assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
        secret = json.loads(credentials.read_text())["secret_access_key"]
        assert secret not in up.stdout + shown.stdout
        server_log = (tmp_path / "stack" / "rest-catalog" / "rest-catalog.log").read_text()
        assert "s3.endpoint" in server_log and secret not in server_log

        catalog = LocalStack.at(tmp_path / "stack").config.catalog
        assert catalog.filesystem().get_file_info("bergstream").type == FileType.Directory
        iceberg = catalog.load()
        iceberg.create_namespace("probe")
        assert ("probe",) in iceberg.list_namespaces()

        again = run("local", "up", *data, *flags[:4])
        assert again.returncode == 1 and "already running" in again.stderr
        pids = [status["broker_pid"], status["object_store_pid"], status["rest_catalog_pid"]]
    finally:
        down = run("local", "down", *data)
    assert down.returncode == 0, down.stderr
    assert not any(alive(pid) for pid in pids)
    other = run("local", "up", *data, *flags[:4])
    assert other.returncode == 1
    assert "was made with --object-store s3" in other.stderr, other.stderr


def test_an_unreachable_rest_catalog_is_refused_at_start_naming_its_uri(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    settings = tmp_path / "playback.yaml"
    settings.write_text(
        json.dumps({
            "topic": "playback", "schema": "playback", "encoding": "json",
            "kafka": {"kafka.bootstrap.servers": f"127.0.0.1:{free_port()}"},
            "checkpoint_location": str(tmp_path / "checkpoint"),
            "catalog": {"type": "rest", "uri": uri, "warehouse": "s3://bergstream/warehouse"},
        })
    )  # fmt: skip
    started = time.monotonic()
    done = run("router", "run", "--topic", "playback", "--config", str(settings))
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert f"the REST catalog at {uri} does not answer" in line, done.stderr
    assert time.monotonic() - started < 60, "refused only after Spark started"
