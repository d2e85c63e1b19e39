"""`bergstream router run --topic A --topic B` and `--all`: many topics in one driver and one query (one per
set of query-level settings), each archived exactly once into its own tables, with its own group and
metrics; a topic whose settings do not load is dead-lettered whole while the others go on."""

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
from bergstream.router.driver.named import RestartSettings, check_shared_driver, group_queries
from bergstream.router.driver.query import pool_name
from tests.routers import (
    ROOT,
    archived_offsets,
    committed_offsets,
    eventually,
    produced_offsets,
    write_config,
)
from tests.services import Services


def driver_command(*flags: str) -> list[str]:
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


def dead_letter_count(stack: Services, table: str) -> int:
    try:
        return len(
            stack.catalog.load().load_table(f"{stack.catalog.namespace}.{table}__dlq").scan().to_arrow()
        )
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
        return RouterConfig.flat(
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
        (["--topic", "a", "--name", "n"], "--name is for --pattern; --group names the query"),
        (["--topic", "a", "--defaults", "d.yaml", "--config", "a.yaml"], "give --config (one topic's whole"),
        (["--pattern", "a.*", "--table", "x"], "--table is not for one query of many topics"),
        (["--pattern", "a.*", "--group", "g"], "--group is not for one query of many topics"),
        (["--all", "--one-query"], "--one-query is gone: --all runs every topic in one query now"),
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
        driver_command("--all", "--topics-dir", str(tmp_path)), capture_output=True, text=True, cwd=ROOT,
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
        driver_command("--topic", a, "--topic", b, "--topics-dir", str(tmp_path), "--available-now"),
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert refused.returncode == 1
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith(f"bergstream: error: {bad}: trigger_interval: Value error, 'often'"), error


def settings_of(tmp_path: Path, topic: str, **extra: Any) -> RouterConfig:
    return RouterConfig.flat(
        {
            "topic": topic, "schema": "playback", "encoding": "json", "table": topic,
            "kafka": {"kafka.bootstrap.servers": "127.0.0.1:1"},
            "checkpoint_location": str(tmp_path / "checkpoints" / topic),
            "catalog": CatalogConfig.sqlite(tmp_path / "c.db", tmp_path / "w"), **extra,
        }
    )  # fmt: skip


def test_named_topics_share_a_query_per_set_of_query_settings(tmp_path: Path) -> None:
    a, b = settings_of(tmp_path, "a"), settings_of(tmp_path, "b")
    slow = settings_of(tmp_path, "slow", trigger_interval="2 minutes")
    (one,) = group_queries(["a", "b"], [a, b], "g", None)
    assert (one.name, one.topics, one.checkpoint_location) == (
        "g",
        ("a", "b"),
        str(tmp_path / "checkpoints/g"),
    )
    assert one.source_options(every_topic_exists=True) == ("subscribe", "a,b")
    assert one.source_options(every_topic_exists=False) == ("subscribePattern", "a|b")
    # A topic alone keeps its own query and checkpoint: `router run --topic a` as it always ran.
    (alone,) = group_queries(["a"], [a], None, None)
    assert (alone.name, alone.checkpoint_location) == ("a", a.query.checkpoint_location)
    # Another trigger, another query; a topic whose settings did not load joins the first, dead-lettered.
    first, second = group_queries(["a", "slow", "b", "broken"], [a, slow, b], "all", 9000)
    assert first.topics == ("a", "b", "broken") and second.topics == ("slow",)
    assert first.name.startswith("all-30seconds-1000000-")
    assert second.name.startswith("all-2minutes-") and first.name != second.name
    assert {first.metrics_port, second.metrics_port} == {9000}
    assert second.checkpoint_location == str(tmp_path / "checkpoints" / second.name)
    # The names stay from one start to the next: they name the checkpoints.
    assert [q.name for q in group_queries(["a", "slow", "b"], [a, slow, b], "all", None)] == [
        first.name, second.name,
    ]  # fmt: skip
    # A defaults file's checkpoint is the query's.
    (given,) = group_queries(["a", "b"], [a, b], "all", None, str(tmp_path / "mine"))
    assert given.checkpoint_location == str(tmp_path / "mine")


def test_a_topic_in_a_query_of_several_runs_with_the_query_s_settings_and_its_own(tmp_path: Path) -> None:
    a = settings_of(tmp_path, "a", lag_refresh_seconds=5)
    b = settings_of(
        tmp_path, "b", lag_refresh_seconds=2, commit_retry={"give_up_after_seconds": 5}, target_lag="30s"
    )
    assert (b.query.lag_refresh_seconds, b.query.commit_retry.give_up_after_seconds) == (2, 5)
    (one,) = group_queries(["a", "b"], [a, b], "g", None)
    inside = b.in_query(one)
    # The query's settings are the query's (the first topic's, where its topics' files differ)...
    assert (
        inside.query.model_dump()
        == a.query.model_copy(update={"checkpoint_location": one.checkpoint_location}).model_dump()
    )
    assert (inside.query.lag_refresh_seconds, inside.query.commit_retry) == (5, a.query.commit_retry)
    # ...the topic's are its own, and a dead-lettered topic's target lag is the first topic's.
    own = inside.settings
    assert (own.table, own.target_lag, own.commit_policy.target_lag) == ("b", "30s", 30)
    assert one.commit_policy.target_lag is None


@pytest.mark.integration
def test_all_runs_its_topics_in_a_query_per_trigger_dead_letters_a_bad_file_archives_a_late_topic_and_stops(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    good, slow, bad_file, missing = (f"{topic_name}_{n}" for n in ("a", "s", "b", "c"))
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
    settings(slow, trigger_interval="2 seconds")
    settings(bad_file, trigger_interval="often")
    produced: dict[str, set[tuple[int, int]]] = {}

    def send(topic: str, seed: int) -> None:
        request = ProduceRequest(topic=topic, schema="playback", count=1000, partitions=2, seed=seed)
        report = produce(request, stack.bootstrap_servers, show_progress=False)
        produced[topic] = produced.get(topic, set()) | produced_offsets(report.offsets)

    for seed, topic in enumerate((good, slow, bad_file)):
        send(topic, seed)
    log = tmp_path / "driver.log"
    with log.open("ab") as out:
        driver = subprocess.Popen(
            driver_command("--all", "--topics-dir", str(topics_dir), "--metrics-port", str(metrics_port)),
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
    try:

        def archived_all(*topics: str) -> bool:
            return all(archived_count(stack, topic) == len(produced.get(topic, ())) for topic in topics)

        eventually(lambda: archived_all(good, slow), "the good topics archived", timeout=150)
        # The bad file's records are not dropped and stop nothing: dead-lettered whole, with the reason.
        eventually(lambda: dead_letter_count(stack, bad_file) == 1000, "the bad file's records kept")
        text = log.read_text()
        assert f"{bad_file}.yaml: trigger_interval" in text and "dead-lettered whole" in text
        # Written by the one job of each batch, as every topic is: Spark's writer would stamp its
        # application in the commit's summary.
        dead_letters = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{bad_file}__dlq")
        summaries = [snapshot.summary for snapshot in dead_letters.snapshots()]
        assert summaries and all(
            summary is not None and "spark.app.id" not in summary.additional_properties
            for summary in summaries
        ), summaries
        up = metric_values(metrics_port, "bergstream_router_topic_up")
        assert up == {good: 1, slow: 1, bad_file: 0, missing: 0}
        failures = metric_values(metrics_port, "bergstream_router_topic_failures_total")
        assert failures == {bad_file: 1}

        # A topic created after the driver started is archived once it exists.
        send(missing, 3)
        send(good, 4)
        eventually(lambda: archived_all(good, slow, missing), "the late topic archived", timeout=150)
        eventually(
            lambda: metric_values(metrics_port, "bergstream_router_topic_up")
            == {good: 1, slow: 1, bad_file: 0, missing: 1},
            "the late topic up",
        )  # fmt: skip
        archived = {topic: offsets for topic, offsets in produced.items() if topic != bad_file}
        wanted = {topic: len(offsets) for topic, offsets in archived.items()}
        eventually(
            lambda: {t: v for t, v in metric_values(
                metrics_port, "bergstream_router_records_archived_total").items() if v} == wanted,
            "every topic's archived records counted",
        )  # fmt: skip
        for topic, offsets in produced.items():
            ends = {p: max(o for q, o in offsets if q == p) + 1 for p in (0, 1)}
            eventually(lambda t=topic, e=ends: committed_offsets(stack, t, [0, 1]) == e, f"{topic}'s group")

        # Two queries (one per trigger), each with its jobs, foreachBatch's writes among them, in its pool.
        queries = sorted(
            path.name for path in (tmp_path / "checkpoints").iterdir() if path.name.startswith("all-")
        )
        assert len(queries) == 2, queries
        api = f"http://127.0.0.1:{ui_port}/api/v1/applications"
        with urllib.request.urlopen(api, timeout=60) as answer:  # the REST API starts on first use
            (application,) = json.load(answer)
        with urllib.request.urlopen(f"{api}/{application['id']}/stages", timeout=60) as answer:
            stages = [stage for stage in json.load(answer) if stage["status"] != "SKIPPED"]
        assert {stage["schedulingPool"] for stage in stages} == {pool_name(query) for query in queries}
    finally:
        driver.send_signal(signal.SIGTERM)  # as Kubernetes stops a pod: the driver's process, not its JVM
        try:
            driver.wait(120)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
    text = log.read_text()
    # Stopped cleanly; the topic dead-lettered whole is reported as failed, with why.
    assert driver.returncode == 1, without_java_frames(text)
    assert text.rstrip().endswith(f"bergstream: error: 1 of 4 topics failed: {bad_file}"), text[-2000:]
    for topic, offsets in archived.items():
        seen = archived_offsets(stack, topic)
        assert len(seen) == len(set(seen)) and set(seen) == offsets, topic
        assert f"{topic}: " in text
