"""The one query over several topics on a Spark standalone cluster with a PostgreSQL JDBC catalog: other
configuration, same code."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from pyiceberg import types as it

from bergstream.catalog import CatalogConfig
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local.processes import free_ports
from bergstream.router.config import table_for_topic
from tests.postgres import USER, postgres_server
from tests.routers import (
    ROOT,
    archived_offsets,
    pattern_command,
    produced_offsets,
    start_command,
    write_defaults,
)
from tests.services import Services
from tests.spark_cluster import spark_cluster
from tests.test_router import wait_for_line

pytestmark = pytest.mark.integration


def test_archive_on_a_standalone_cluster_into_a_postgres_catalog(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    """The one query over two topics, its executors on the cluster's worker, its tables in PostgreSQL."""
    prefix = topic_name[:40]
    topics = [f"{prefix}.a", f"{prefix}.b"]
    reports = {}
    for topic, count in zip(topics, (2000, 700), strict=True):
        request = ProduceRequest(
            topic=topic, schema="impression", count=count, bad_fraction=0.02, encoding="avro", seed=count
        )
        reports[topic] = produce(request, stack.bootstrap_servers, show_progress=False)
    topics_dir = tmp_path / "topics"
    topics_dir.mkdir()
    with postgres_server() as postgres, spark_cluster(tmp_path / "spark") as cluster:
        catalog = CatalogConfig(uri=postgres.jdbc_uri, warehouse=(tmp_path / "warehouse").as_uri(), user=USER)
        defaults = write_defaults(
            stack, tmp_path, schema="impression", encoding="avro",
            catalog=catalog.model_dump(mode="json", exclude_none=True),
            spark={"master": cluster.master_url, "conf": {
                "spark.executor.memory": "1g", "spark.cores.max": "1", "spark.ui.enabled": "false"}},
        )  # fmt: skip
        done = subprocess.run(
            pattern_command(rf"{prefix}\..*", defaults, topics_dir, "--available-now", "--json"),
            capture_output=True, text=True, check=False, timeout=600, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        totals = {topic["topic"]: topic for topic in json.loads(done.stdout)["topics"]}
        (application,) = cluster.state()["completedapps"]
        assert application["name"].startswith("bergstream-router-"), application["name"]

        for topic, report in reports.items():
            bad = sum(report.malformed.values())
            read = report.sent
            result = totals[topic]
            assert (result["read"], result["archived"], result["dead_lettered"]) == (read, read - bad, bad)
            table = catalog.load().load_table(f"archive.{table_for_topic(topic)}")
            assert isinstance(table.schema().find_type("__metadata__.kafka_ingestion_ts"), it.TimestamptzType)
            assert table.scan().to_arrow().num_rows == result["archived"]


def active_stages(ui_port: int) -> int:
    """Stages the driver's application runs now, from its REST API; 0 while it is not serving yet.

    A stage is listed as active the moment it is submitted, whereas its count of running tasks is only
    refreshed every 100 ms, too slowly to see the short tasks of a small batch."""
    base = f"http://127.0.0.1:{ui_port}/api/v1/applications"
    try:
        with urllib.request.urlopen(base, timeout=2) as answer:
            (application,) = json.load(answer)
        with urllib.request.urlopen(f"{base}/{application['id']}/stages?status=active", timeout=2) as answer:
            return len(json.load(answer))
    except (OSError, ValueError):
        return 0


def test_an_executor_killed_mid_batch_loses_and_repeats_nothing(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    """The one query over two topics on the cluster, its only executor killed while a batch's tasks run."""
    prefix = topic_name[:40]
    topics = [f"{prefix}.a", f"{prefix}.b"]
    expected: dict[str, set[tuple[int, int]]] = {}
    for n, topic in enumerate(topics):
        request = ProduceRequest(
            topic=topic, schema="playback", count=5000, bad_fraction=0.02, partitions=2, seed=n
        )
        expected[topic] = produced_offsets(
            produce(request, stack.bootstrap_servers, show_progress=False).offsets
        )
    (ui_port,) = free_ports(1)
    log = tmp_path / "router.log"
    topics_dir = tmp_path / "topics"
    topics_dir.mkdir()
    with spark_cluster(tmp_path / "spark") as cluster:
        defaults = write_defaults(
            # Ten batches: after the first, enough are left to run tasks when the executor is killed.
            stack, tmp_path, schema="playback", encoding="json", trigger_interval="1 second",
            max_offsets_per_trigger=1000,
            spark={"master": cluster.master_url, "conf": {
                "spark.ui.port": str(ui_port), "spark.executor.memory": "1g", "spark.cores.max": "1",
                "spark.sql.shuffle.partitions": "2"}},
        )  # fmt: skip
        router = start_command(pattern_command(rf"{prefix}\..*", defaults, topics_dir), log)
        try:
            wait_for_line(log, " batch 0: read ", count=1, timeout=180)
            deadline = time.monotonic() + 120
            while not (active_stages(ui_port) and cluster.executor_pids()):
                assert time.monotonic() < deadline, "no batch ran tasks on the executor"
                time.sleep(0.05)
            (executor,) = cluster.executor_pids()
            os.kill(executor, signal.SIGKILL)  # in the middle of a batch's tasks
            deadline = time.monotonic() + 240
            while sum(int(n) for n in re.findall(r" batch \d+: read (\d+),", log.read_text())) < 10_000:
                assert time.monotonic() < deadline, "the records after the executor's loss were not archived"
                time.sleep(0.5)
            deadline = time.monotonic() + 60
            while cluster.executor_pids() in ([], [executor]):
                assert time.monotonic() < deadline, "the worker started no new executor"
                time.sleep(0.5)
        finally:
            router.send_signal(signal.SIGTERM)
            router.wait(120)
    output = log.read_text()
    assert router.returncode == 0, output[-3000:]
    assert "Lost executor" in output or "ExecutorLostFailure" in output, "the kill did not hit a running task"
    for topic in topics:
        seen = archived_offsets(stack, table_for_topic(topic))
        assert len(seen) == len(set(seen)), f"{topic}: {len(seen) - len(set(seen))} offsets archived twice"
        assert set(seen) == expected[topic], f"{topic}: {len(expected[topic] - set(seen))} offsets lost"
