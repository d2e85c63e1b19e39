"""`bergstream router run --topic A --topic B` and `--all`: many topics in one driver, each archived exactly
once with its own checkpoint, tables, group and metrics; a failing topic is retried while the others go on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from bergstream.catalog import CatalogConfig
from bergstream.cli import cli
from bergstream.errors import ConfigError
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local.processes import free_ports
from bergstream.router.accounting import RouterTotals
from bergstream.router.config import RouterConfig
from bergstream.router.fleet import RestartSettings, check_shared_driver, pool_name
from tests.routers import (
    ROOT,
    archived_offsets,
    committed_offsets,
    eventually,
    produced_offsets,
    write_config,
)
from tests.services import Services


def fleet_command(*flags: str) -> list[str]:
    return [sys.executable, "-m", "bergstream", "router", "run", *flags]


def metric_values(port: int, name: str) -> dict[str, float]:
    """{topic: value} of one metric from the driver's endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        sample.labels["topic"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def without_java_frames(text: str) -> str:
    lines = [line for line in text.splitlines() if not line.lstrip().startswith(("at ", "..."))]
    return "\n".join(lines)[-4000:]


def archived_count(stack: Services, table: str) -> int:
    try:
        return len(archived_offsets(stack, table))
    except Exception:  # the table is not made yet
        return -1


def test_restart_backoff_doubles_up_to_its_cap() -> None:
    settings = RestartSettings(initial_backoff_seconds=2, max_backoff_seconds=30)
    assert [settings.delay(n) for n in range(1, 7)] == [2, 4, 8, 16, 30, 30]
    assert settings.delay(10_000) == 30


def test_a_topics_totals_add_up_over_its_restarts() -> None:
    into = RouterTotals(batches=2, read=10, archived=9, dead_lettered=1, per_partition={0: 10})
    into.add(RouterTotals(batches=1, replayed_batches=1, read=5, archived=5, files=2, bytes=300,
                          expired=4, per_partition={0: 2, 1: 3}))  # fmt: skip
    assert into == RouterTotals(batches=3, replayed_batches=1, read=15, archived=14, dead_lettered=1,
                                files=2, bytes=300, expired=4, per_partition={0: 12, 1: 3})  # fmt: skip


def test_topics_of_one_driver_must_share_its_catalog_and_spark_settings(tmp_path: Path) -> None:
    def config(topic: str, master: str) -> RouterConfig:
        return RouterConfig.model_validate(
            {
                "topic": topic, "schema": "playback", "encoding": "json", "table": topic,
                "kafka": {"kafka.bootstrap.servers": "127.0.0.1:1"}, "checkpoint_location": str(tmp_path),
                "catalog": CatalogConfig.sqlite(tmp_path / "c.db", tmp_path / "w"),
                "spark": {"master": master},
            }
        )  # fmt: skip

    check_shared_driver(config("b", "local[2]"), config("a", "local[2]"))
    with pytest.raises(ConfigError, match="topic b: its spark settings differ from those of topic a"):
        check_shared_driver(config("b", "local[4]"), config("a", "local[2]"))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--all", "--topic", "a"], "give one of --topic, --all (every topic of --topics-dir) and --pattern"),
        (["--pattern", "a.*", "--topic", "a"], "give one of --topic, --all"),
        ([], "name the topic to archive with --topic (repeatable), or give --all or --pattern"),
        (["--topic", "a", "--defaults", "d.yaml"], "--defaults is for --pattern"),
        (["--pattern", "a.*", "--table", "x"], "--table is not for one query of many topics"),
        (["--all", "--one-query", "--group", "g"], "--group is not for one query of many topics"),
        (["--topic", "a", "--one-query"], "--one-query is for --all"),
        (["--pattern", "a.*", "--one-query"], "--one-query is for --all"),
        (["--topic", "a", "--topic", "b", "--config", "a.yaml"], "--config is for one topic"),
        (["--all", "--table", "x"], "--table is for one topic"),
    ],
)
def test_the_command_refuses_contradicting_flags_naming_what_to_fix(
    arguments: list[str], message: str
) -> None:
    done = CliRunner().invoke(cli, ["router", "run", *arguments])
    assert done.exit_code == 2
    assert message in done.output


def test_all_refuses_a_folder_without_settings(tmp_path: Path) -> None:
    done = subprocess.run(
        fleet_command("--all", "--topics-dir", str(tmp_path)), capture_output=True, text=True, cwd=ROOT,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"bergstream: error: --all: {tmp_path} holds no topic settings (<topic>.yaml)" in done.stderr


@pytest.mark.integration
def test_topics_named_one_by_one_are_refused_at_start_when_one_is_bad(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    a, b = f"{topic_name}_a", f"{topic_name}_b"
    write_config(stack, tmp_path, a)
    bad = write_config(stack, tmp_path, b, trigger_interval="often")
    refused = subprocess.run(
        fleet_command("--topic", a, "--topic", b, "--topics-dir", str(tmp_path), "--available-now"),
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert refused.returncode == 1
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith(f"bergstream: error: {bad}: trigger_interval: Value error, 'often'"), error


@pytest.mark.integration
def test_all_runs_the_good_topics_retries_a_bad_file_and_a_missing_topic_until_fixed_and_stops_on_sigterm(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    good, bad_file, missing = (f"{topic_name}_{n}" for n in ("a", "b", "c"))
    topics_dir = tmp_path / "topics"
    topics_dir.mkdir()
    metrics_port, ui_port = free_ports(2)
    spark: dict[str, Any] = {
        "master": "local[2]",
        "conf": {"spark.ui.port": str(ui_port), "spark.sql.shuffle.partitions": "2"},
    }

    def settings(topic: str, **extra: Any) -> Path:
        path = write_config(stack, tmp_path, topic, spark=spark, lag_refresh_seconds=1, **extra)
        return path.rename(topics_dir / path.name)

    for topic in (good, missing):
        settings(topic)
    settings(bad_file, trigger_interval="often")
    produced: dict[str, set[tuple[int, int]]] = {}

    def send(topic: str, seed: int) -> None:
        request = ProduceRequest(topic=topic, schema="playback", count=1000, partitions=2, seed=seed)
        report = produce(request, stack.bootstrap_servers, show_progress=False)
        produced[topic] = produced.get(topic, set()) | produced_offsets(report.offsets)

    for topic in (good, bad_file):
        send(topic, 1)
    log = tmp_path / "driver.log"
    with log.open("ab") as out:
        driver = subprocess.Popen(
            fleet_command("--all", "--topics-dir", str(topics_dir), "--metrics-port", str(metrics_port),
                          "--restart-backoff", "1", "--max-restart-backoff", "2"),
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
    try:

        def archived_all(*topics: str) -> bool:
            return all(archived_count(stack, topic) == len(produced.get(topic, ())) for topic in topics)

        eventually(lambda: archived_all(good), "the good topic archived", timeout=150)
        text = log.read_text()
        assert (
            f"{bad_file}.yaml: trigger_interval" in text and f"the router of topic {bad_file} failed" in text
        )
        assert f"the router of topic {missing} failed (start, attempt 1): Kafka has no topic" in text
        eventually(
            lambda: min(metric_values(metrics_port, "bergstream_router_topic_restarts_total").get(t, 0)
                        for t in (bad_file, missing)) >= 2,
            "both failing topics started again twice",
        )  # fmt: skip
        up = metric_values(metrics_port, "bergstream_router_topic_up")
        assert up == {good: 1, bad_file: 0, missing: 0}

        # The good topic goes on while the others fail; then both are fixed and recover, no restart.
        send(good, 2)
        eventually(lambda: archived_all(good), "the second round of the good topic archived")
        settings(bad_file)
        send(missing, 3)
        eventually(lambda: archived_all(good, bad_file, missing), "every topic archived", timeout=150)
        eventually(
            lambda: metric_values(metrics_port, "bergstream_router_topic_up") == dict.fromkeys(produced, 1),
            "every topic up",
        )  # fmt: skip
        # A batch's counts reach the metrics after its commit, which the tables show first.
        wanted = {topic: len(offsets) for topic, offsets in produced.items()}
        eventually(
            lambda: metric_values(metrics_port, "bergstream_router_records_archived_total") == wanted,
            "every topic's archived records counted",
        )
        for topic, offsets in produced.items():
            ends = {p: max(o for q, o in offsets if q == p) + 1 for p in (0, 1)}
            eventually(lambda t=topic, e=ends: committed_offsets(stack, t, [0, 1]) == e, f"{topic}'s group")

        # Each topic's jobs, foreachBatch's appends among them, ran in the topic's own FAIR pool.
        api = f"http://127.0.0.1:{ui_port}/api/v1/applications"
        with urllib.request.urlopen(api, timeout=60) as answer:  # the REST API starts on first use
            (application,) = json.load(answer)
        with urllib.request.urlopen(f"{api}/{application['id']}/stages", timeout=60) as answer:
            stages = [stage for stage in json.load(answer) if stage["status"] != "SKIPPED"]
        assert {stage["schedulingPool"] for stage in stages} == {pool_name(topic) for topic in produced}
    finally:
        driver.send_signal(signal.SIGTERM)  # as Kubernetes stops a pod: the driver's process, not its JVM
        try:
            driver.wait(120)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
    text = log.read_text()
    assert driver.returncode == 0, without_java_frames(text)
    assert "stopping the routers of 3 topics after their current batches" in text
    for topic, offsets in produced.items():
        seen = archived_offsets(stack, topic)
        assert len(seen) == len(set(seen)) and set(seen) == offsets, topic
        assert f"{topic}: " in text
        assert (tmp_path / "checkpoints" / topic / "commits").is_dir()
    assert f"{bad_file}: " in text and "restarts" in text
