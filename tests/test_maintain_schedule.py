"""Bounded table metadata and maintenance inside the router: the tables' properties, `router run
--maintain-every`, its refusals, and a restart after expiry took the router's snapshots."""

from __future__ import annotations

import signal
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local.processes import free_ports
from bergstream.router.config import RouterConfig, load_router_config
from bergstream.router.driver.launch import archive_available_now
from bergstream.router.maintain import NEWEST_APPEND_TAG, maintain
from bergstream.router.table import ensure_tables, maintained_properties
from bergstream.router.write import BATCH_ID, QUERY_ID
from bergstream.runtime.pins import pin
from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.event_schema import load_event_schema
from tests.commands import refused_before_spark
from tests.routers import (
    archive_whole,
    archived_offsets,
    eventually,
    produced_offsets,
    router_command,
    start_router,
    write_config,
)
from tests.services import Services
from tests.test_maintain import files_per_hour, produce_at

pytestmark = pytest.mark.integration


def properties(spark: SparkSession, identifier: str) -> dict[str, str]:
    return {row.key: row.value for row in spark.sql(f"SHOW TBLPROPERTIES {identifier}").collect()}


def test_properties_are_set_on_new_and_existing_tables(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    settings = {"maintenance": {"snapshot_retention_hours": 2, "retain_last_snapshots": 9}}
    config = load_router_config(topic_name, write_config(stack, tmp_path, topic_name, **settings), {}, {})
    wanted = maintained_properties(config)
    assert wanted["history.expire.max-snapshot-age-ms"] == "7200000"
    catalog = stack.catalog
    layout = ArchiveLayout(load_event_schema("playback"), config.settings.table)

    # A new table made by ensure_tables, as the router makes it.
    fresh = ArchiveLayout(load_event_schema("playback"), f"{config.settings.table}_new")
    ensure_tables(spark, catalog, fresh, properties=wanted)
    for table in (fresh.table, fresh.dead_letter_table):
        assert wanted.items() <= properties(spark, catalog.table_identifier(table)).items(), table

    # Tables an earlier router made without them get them when the router starts.
    ensure_tables(spark, catalog, layout)
    for table in (layout.table, layout.dead_letter_table):
        assert "history.expire.max-snapshot-age-ms" not in properties(spark, catalog.table_identifier(table))
    produce(
        ProduceRequest(topic=topic_name, count=20, partitions=1, schema="playback"),
        stack.bootstrap_servers,
        show_progress=False,
    )
    assert archive_available_now(spark, config).archived == 20
    for table in (layout.table, layout.dead_letter_table):
        assert wanted.items() <= properties(spark, catalog.table_identifier(table)).items(), table


@pytest.mark.parametrize(
    ("flag", "in_file", "said"),
    [
        ("0s", None, "give a duration of at least 1s"),
        ("often", None, "write a number and a unit"),
        (None, "-5m", "write a number and a unit"),
    ],
)
def test_bad_maintain_every_is_refused_at_start(
    stack: Services,
    topic_name: str,
    tmp_path: Path,
    flag: str | None,
    in_file: str | None,
    said: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = {} if in_file is None else {"maintenance": {"every": in_file}}
    config = write_config(stack, tmp_path, topic_name, **settings)
    flags = () if flag is None else ("--maintain-every", flag)
    refused = refused_before_spark(monkeypatch, *router_command(topic_name, config, *flags)[3:])
    assert refused.exit_code != 0
    assert "maintenance.every" in refused.message and said in refused.message, refused.message[-2000:]


def metric(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name)]
    return max(values, default=0.0)


def test_maintain_every_runs_inside_the_running_router(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(30)
    closed = datetime.now(UTC) - timedelta(hours=3)
    produce_at(stack.bootstrap_servers, topic_name, 600, closed, seed=1)
    (metrics_port,) = free_ports(1)
    config = write_config(
        stack, tmp_path, topic_name, max_offsets_per_trigger=150, metrics_host="127.0.0.1",
        maintenance={"snapshot_retention_hours": 0.002, "retain_last_snapshots": 3},
    )  # fmt: skip
    stop = threading.Event()

    def keep_producing() -> None:
        seed = 100
        while not stop.is_set():
            produce_at(stack.bootstrap_servers, topic_name, 20, datetime.now(UTC), seed)
            seed += 1
            time.sleep(0.5)

    log = tmp_path / "router.log"
    flags = ("--maintain-every", "5s", "--metrics-port", str(metrics_port))
    router = start_router(topic_name, config, log, *flags)
    producing = threading.Thread(target=keep_producing)
    producing.start()
    closed_hour = int(closed.timestamp()) // 3600
    table_name = f"{stack.catalog.namespace}.{topic_name}"

    def exported() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
            return str(answer.read().decode())

    def maintained() -> bool:
        if not log.exists() or "metrics on" not in log.read_text():
            return False
        expired = metric(exported(), "bergstream_router_maintenance_expired_snapshots_total{")
        return expired > 0 and files_per_hour(stack, topic_name)[closed_hour] == 1

    try:
        eventually(maintained, "the router's maintenance to compact the closed hour and expire snapshots",
                   timeout=240)  # fmt: skip

        def batches_kept() -> set[str]:
            snapshots = stack.catalog.load().load_table(table_name).snapshots()
            return {str(s.summary[BATCH_ID]) for s in snapshots if s.summary and BATCH_ID in s.summary}

        # The first batch's snapshot is the oldest: expiry takes it once it is past the retention.
        eventually(lambda: "0" not in batches_kept(), "the first batch's snapshot to expire", timeout=120)
        table = stack.catalog.load().load_table(table_name)
        assert NEWEST_APPEND_TAG in table.metadata.refs
        metrics = exported()
        assert metric(metrics, 'bergstream_router_maintenance_runs_total{outcome="done"') >= 1
        assert metric(metrics, "bergstream_router_maintenance_last_success_timestamp_seconds") > 0
        # A backfill stopped on a snapshot holds it: once the snapshot is past the retention, the router's
        # maintenance keeps it and says whose.
        held = stack.catalog.load().load_table(table_name).metadata.current_snapshot_id
        assert held is not None
        backfill = str(tmp_path / "backfill-checkpoint")
        pin(stack.catalog, {stack.catalog.table_identifier(topic_name): held}, backfill, "sessionizer")
        eventually(
            lambda: metric(exported(), "bergstream_router_maintenance_backfill_held_snapshots{") == 1,
            "the router's maintenance to report the snapshot a backfill holds", timeout=120,
        )  # fmt: skip
        assert f"is held by the backfill of sessionizer at checkpoint {backfill}" in log.read_text()
        assert stack.catalog.load().load_table(table_name).snapshot_by_id(held) is not None
        stop.set()
        producing.join()
        # The router goes on to archive all that was produced, its snapshots expiring meanwhile.
        produced = sum(high for _, high in admin_watermarks(stack, topic_name).values())
        eventually(lambda: len(archived_offsets(stack, topic_name)) >= produced, "every record archived")
    finally:
        stop.set()
        producing.join()
        router.send_signal(signal.SIGINT)
        router.wait(120)
    # A run may lose a commit race with the router's own appends; the next run must then succeed.
    output = log.read_text()
    if "maintenance failed" in output:
        assert "maintenance done" in output.rsplit("maintenance failed", 1)[1], "a failed run was not retried"
    seen = archived_offsets(stack, topic_name)
    assert len(seen) == len(set(seen)), "an offset archived twice"
    assert len(seen) == produced, "an offset lost"


def admin_watermarks(stack: Services, topic: str) -> dict[int, tuple[int, int]]:
    from tests.test_maintain import admin_watermarks as watermarks

    return watermarks(stack, topic)


def router_snapshots(spark: SparkSession, identifier: str) -> list[str]:
    """Batch ids of the router's snapshots the table still has."""
    rows = spark.sql(
        f"SELECT summary['{BATCH_ID}'] AS batch FROM {identifier}.snapshots "
        f"WHERE summary['{QUERY_ID}'] IS NOT NULL"
    ).collect()
    return sorted(row.batch for row in rows)


def test_restart_after_expiry_neither_doubles_nor_loses(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    """A router stops after committing its last batch to the tables and before checkpointing it, stays down
    past the snapshot retention, and restarts: the batch runs again and must find itself committed."""
    request = ProduceRequest(
        topic=topic_name, count=300, partitions=1, bad_fraction=0.1, seed=3, schema="playback"
    )
    report = produce(request, stack.bootstrap_servers, show_progress=False)
    settings = {
        "max_offsets_per_trigger": 100,
        "maintenance": {"snapshot_retention_hours": 1, "retain_last_snapshots": 1},
    }
    path = write_config(stack, tmp_path, topic_name, **settings)
    config: RouterConfig = load_router_config(topic_name, path, {}, {})
    assert archive_available_now(spark, config).read == 300
    archive = stack.catalog.table_identifier(config.settings.table)
    dead_letters = f"{archive}__dlq"
    assert router_snapshots(spark, archive) == ["0", "1", "2"]
    assert router_snapshots(spark, dead_letters) == ["0", "1", "2"]
    # The crash: batch 2 is in the tables, not in the checkpoint's commit log.
    commits = Path(config.query.checkpoint_location) / "commits"
    for name in ("2", ".2.crc"):
        (commits / name).unlink(missing_ok=True)

    # Hours later, maintenance with a retention shorter than the outage.
    for identifier in (archive, dead_letters):
        spark.sql(f"REFRESH TABLE {identifier}")
    maintain(spark, config, now=datetime.now(UTC) + timedelta(hours=3))
    assert router_snapshots(spark, archive) == ["2"], "expiry left the router's older snapshots"
    assert router_snapshots(spark, dead_letters) == ["2"]

    again = archive_whole(spark, topic_name, path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(1 replayed)" in again.stdout, again.stdout
    seen = archived_offsets(stack, topic_name)
    assert len(seen) == len(set(seen)), "a record archived twice"
    assert set(seen) == produced_offsets(report.offsets), "a record lost"


def test_many_topics_are_maintained_one_at_a_time_each_at_its_own_interval(tmp_path: Path) -> None:
    """RotatingMaintenance (router run --pattern): a topic is due one interval after it is met, the most
    overdue first; a topic without an interval never."""
    from bergstream.catalog import CatalogConfig
    from bergstream.router.metrics import RouterMetrics
    from bergstream.router.schedule import RotatingMaintenance

    def config(topic: str, every: str | None) -> RouterConfig:
        return RouterConfig.flat({
            "topic": topic, "schema": "playback", "encoding": "json", "table": topic,
            "kafka": {"kafka.bootstrap.servers": "127.0.0.1:9092"},
            "checkpoint_location": str(tmp_path / topic),
            "catalog": CatalogConfig.sqlite(tmp_path / "c.db", tmp_path / "w"),
            "maintenance": {} if every is None else {"every": every},
        })  # fmt: skip

    topics = [config("slow", "20s"), config("fast", "10s"), config("never", None)]
    rotating = RotatingMaintenance(None, RouterMetrics("t"), lambda: topics)  # type: ignore[arg-type]
    assert rotating.due(1000.0) == []
    assert rotating.due(1010.0) == ["fast"]
    assert rotating.due(1025.0) == ["fast", "slow"]
    topics.append(config("later", "5s"))  # a topic met later: due one interval after that
    assert rotating.due(1026.0) == ["fast", "slow"]
    assert rotating.due(1031.0) == ["fast", "slow", "later"]
