"""A backfill holds the snapshots it reads from expiry until it completes: a stopped one keeps its tag,
maintenance keeps the snapshot and names the backfill, the resumed run completes and releases it, and the
next maintenance expires the snapshot."""

from __future__ import annotations

import os
import signal
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from click.testing import CliRunner

from bergstream.cli import cli
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.query import progress_events
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.router.maintain import maintain
from bergstream.router.maintenance_settings import MaintenanceSettings
from bergstream.runtime.pins import pin, tag_of
from bergstream.runtime.run import run_app
from tests.services import Services
from tests.test_backfill_spark import Archived, app_settings, output_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def archive(stack: Services, spark: SparkSession, config: RouterConfig, start: datetime, count: int) -> None:
    produce(
        ProduceRequest(topic=config.settings.topic, schema="playback", count=count, encoding="json",
                       partitions=1, seed=count, ingestion_start=start, ingestion_span=timedelta(hours=2)),
        stack.bootstrap_servers, show_progress=False,
    )  # fmt: skip
    archive_available_now(spark, config)


def stopped_at_its_first_batch(spark: SparkSession, settings: Any) -> Any:
    """run_app stopped as Ctrl-C stops it, once its first micro-batch is committed."""
    sent = threading.Event()

    def stop_at_the_first(progress: Any) -> None:
        if not sent.is_set():
            sent.set()
            os.kill(os.getpid(), signal.SIGTERM)

    with progress_events(spark, stop_at_the_first):
        return run_app(spark, settings, show_progress=False)


def test_a_stopped_backfill_holds_its_snapshot_until_it_completes(
    stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=4)
    config = RouterConfig.flat(
        topic=topic_name, schema="playback", encoding="json", table=topic_name, cluster="us-east-1",
        kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        checkpoint_location=str(tmp_path / "router"), catalog=stack.catalog,
        maintenance=MaintenanceSettings(snapshot_retention_hours=1, retain_last_snapshots=1),
    )  # fmt: skip
    archive(stack, spark, config, start, 600)
    archived = Archived(start, start + timedelta(hours=2), {"playback": topic_name}, {"playback": topic_name})

    def settings(name: str) -> Any:
        output = f"{topic_name}_{name}"
        return app_settings(stack, archived, tmp_path / name, "sessionizer", "backfill", output,
                            max_misalignment=timedelta(minutes=10))  # fmt: skip

    iceberg = stack.catalog.load()

    def table() -> Any:
        return iceberg.load_table(f"{stack.catalog.namespace}.{topic_name}")

    pinned = table().metadata.current_snapshot_id
    whole = run_app(spark, settings("whole"), show_progress=False)
    assert whole.complete, whole.problems
    assert tag_of(str(tmp_path / "whole")) not in table().metadata.refs, "a complete backfill holds nothing"

    stopped = stopped_at_its_first_batch(spark, settings("resumed"))
    assert stopped.complete is False, "stopped before the end of its window"
    tag = tag_of(str(tmp_path / "resumed"))
    assert table().metadata.refs[tag].snapshot_id == pinned
    # The router appends on: the pinned snapshot is no longer the current one, and all are past retention.
    archive(stack, spark, config, start, 100)
    later = datetime.now(UTC) + timedelta(hours=2)
    (result, _) = maintain(spark, config, later)
    assert table().snapshot_by_id(pinned) is not None, "expiry took the snapshot a backfill reads"
    (held,) = result.held
    assert (held.tag, held.snapshot_id, held.checkpoint) == (tag, pinned, str(tmp_path / "resumed"))
    assert "bergstream backfill release --checkpoint" in held.describe(result.table, later)

    resumed = run_app(spark, settings("resumed"), show_progress=False)
    assert resumed.complete, resumed.problems
    assert resumed.rows_read == whole.rows_read == resumed.rows_in_archive
    assert output_rows(spark, f"{topic_name}_resumed") == output_rows(spark, f"{topic_name}_whole")
    assert tag not in table().metadata.refs
    assert not [key for key in table().properties if key.startswith("bergstream.backfill.")]
    (result, _) = maintain(spark, config, later)
    assert result.held == ()
    assert table().snapshot_by_id(pinned) is None, "released, the snapshot expires"

    # A backfill given up: the command maintenance names releases what it holds.
    given_up = str(tmp_path / "given-up")
    pin(stack.catalog, {stack.catalog.table_identifier(topic_name): table().metadata.current_snapshot_id},
        given_up, "sessionizer")  # fmt: skip
    assert tag_of(given_up) in table().metadata.refs
    config_file = tmp_path / "catalog.yaml"
    config_file.write_text(
        yaml.safe_dump({"catalog": stack.catalog.model_dump(mode="json", exclude_none=True)})
    )
    released = CliRunner().invoke(
        cli, ["backfill", "release", "--checkpoint", given_up, "--config", str(config_file)]
    )
    assert released.exit_code == 0 and f"released {tag_of(given_up)}" in released.output, released.output
    assert tag_of(given_up) not in table().metadata.refs
