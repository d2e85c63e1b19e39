"""The backfill source's reader of the archive's files against Iceberg's own scan of the same snapshot, on a
table archived by the router and then evolved (a column renamed, one added at the top and one inside a
struct, an int widened to a long): every column of every row of the window, equal. Spark's Parquet reader
reads them; an archive in an object store that Hadoop's FileSystem does not reach is read by Iceberg's
(tests/test_object_store.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.runtime.settings import AppSettings
from bergstream.runtime.sources import Sources
from bergstream.schemas.archive import INGESTION_TS_COLUMN
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.integration
TOPIC = "reader_playback"


@pytest.fixture(scope="module")
def evolved(stack: Services, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> datetime:
    """The archive of an hour of playbacks, then an hour more written under the evolved schema; its start."""
    from pyspark.sql import functions as F

    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=4)
    produce(
        ProduceRequest(topic=TOPIC, schema="playback", count=2000, partitions=2, seed=11, late_fraction=0.05,
                       ingestion_start=start, ingestion_span=timedelta(hours=1)),
        stack.bootstrap_servers, show_progress=False,
    )  # fmt: skip
    config = RouterConfig.flat(
        topic=TOPIC, schema="playback", encoding="json", table=TOPIC, cluster="us-east-1",
        kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        checkpoint_location=str(tmp_path_factory.mktemp("reader") / "router"), catalog=stack.catalog,
    )  # fmt: skip
    archive_available_now(spark, config)
    table = stack.catalog.table_identifier(TOPIC)
    for statement in (
        f"ALTER TABLE {table} RENAME COLUMN country TO country_code",
        f"ALTER TABLE {table} ALTER COLUMN profile_id TYPE bigint",
        f"ALTER TABLE {table} ADD COLUMN note string",
        f"ALTER TABLE {table} ADD COLUMN device.model string",
    ):
        spark.sql(statement)
    later = (
        spark.table(table)
        .withColumn("__metadata__", F.col("__metadata__").withField(
            "kafka_ingestion_ts", F.col(INGESTION_TS_COLUMN) + F.expr("INTERVAL 1 HOUR")))
        .withColumn("note", F.concat(F.lit("evolved "), F.col("playback_id")))
        .withColumn("device", F.col("device").withField("model", F.lit("tv-9")))
    )  # fmt: skip
    later.writeTo(table).append()
    return start


def settings(stack: Services, start: datetime, checkpoint: Path, bound: str) -> AppSettings:
    strict = bound == "strict"
    return AppSettings.model_validate(
        {
            "app": "reader",
            "entry": "bergstream.apps.sessionizer:sessionizer",
            "mode": "backfill",
            "sources": {
                "playback": {"topic": TOPIC, "table": TOPIC, "schema": "playback", "encoding": "json"}
            },
            "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers},
            "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
            "checkpoint_location": str(checkpoint),
            "output_table": "reader_out",
            "backfill": {
                "start": start,
                "end": start + timedelta(hours=2),
                "max_misalignment": "5m" if strict else bound,
                "strict": strict,
            },
        }
    )


def read_by_source(spark: SparkSession, app: AppSettings, name: str) -> tuple[DataFrame, dict[str, Any]]:
    """Every row the backfill source emits for the window, and the source's metrics of its last batch."""
    stream = Sources(spark, app).stream("playback")
    query = (
        stream.writeStream.format("memory").queryName(name)
        .option("checkpointLocation", str(Path(app.checkpoint_location) / "query"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    assert query.exception() is None, query.exception()
    progress = query.lastProgress
    assert progress is not None
    metrics = progress.sources[0].metrics
    return spark.table(name), metrics


def assert_same_rows(by_source: DataFrame, by_iceberg: DataFrame) -> None:
    assert by_source.schema == by_iceberg.schema
    assert by_source.count() == by_iceberg.count() > 0
    assert by_source.exceptAll(by_iceberg).count() == 0
    assert by_iceberg.exceptAll(by_source).count() == 0


@pytest.mark.parametrize("bound", ["15m", "strict"])
def test_the_source_reads_an_evolved_archive_as_iceberg_does(
    stack: Services, spark: SparkSession, evolved: datetime, tmp_path: Path, bound: str
) -> None:
    table = stack.catalog.table_identifier(TOPIC)
    window = (f"{INGESTION_TS_COLUMN} >= TIMESTAMP '{evolved.isoformat()}' AND {INGESTION_TS_COLUMN} < "
              f"TIMESTAMP '{(evolved + timedelta(hours=2)).isoformat()}'")  # fmt: skip
    by_source, metrics = read_by_source(spark, settings(stack, evolved, tmp_path, bound), f"reader_{bound}")
    assert metrics["reader"] == "spark-parquet"
    by_iceberg = spark.read.option("vectorization-enabled", "false").table(table).where(window)
    assert_same_rows(by_source, by_iceberg)
    notes = by_source.where("note IS NOT NULL")
    # The second hour carries the columns added since; the first reads them as null, and the renamed
    # column by its field id.
    assert notes.count() == by_source.count() / 2
    assert notes.where("device.model = 'tv-9' AND country_code IS NOT NULL").count() == notes.count()
