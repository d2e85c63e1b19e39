"""`bergstream router run --pattern`: one query for every matching topic, topics created later included."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from bergstream.errors import ConfigError
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local.processes import free_ports
from bergstream.router.config import QuerySettings, table_for_topic
from bergstream.router.driver.settings import (
    load_pattern_settings,
    pattern_name,
    pattern_queries,
    pattern_topic_settings,
)
from bergstream.router.offset_log import _first_start, may_hold_records, moved_back
from bergstream.schemas.archive import PARTITION_SPEC, ArchiveLayout
from bergstream.schemas.batch_range import BatchRange
from bergstream.schemas.event_schema import load_event_schema
from bergstream.schemas.spark_types import ddl_columns
from tests.commands import Ran, run_in_process, run_whole
from tests.routers import (
    ROOT,
    appended_by_spark,
    archived_offsets,
    committed_offsets,
    eventually,
    pattern_command,
    produced_offsets,
    write_defaults,
)
from tests.services import Services


def test_a_topic_name_gives_a_table_name() -> None:
    assert table_for_topic("playback") == "playback"
    assert table_for_topic("orders.v1-eu") == "orders_v1_eu"
    assert table_for_topic("1st") == "_1st"


def test_a_batch_range_says_whether_it_may_hold_records() -> None:
    assert may_hold_records(BatchRange("earliest", {0: 5}))
    assert may_hold_records(BatchRange({0: 3}, {0: 5}))
    assert not may_hold_records(BatchRange({0: 5, 1: 2}, {0: 5, 1: 2}))
    assert may_hold_records(BatchRange({0: 5}, {0: 5, 1: 0}))  # a partition added since


def test_a_batch_range_says_which_partitions_moved_back() -> None:
    assert moved_back(BatchRange({0: 5, 1: 2}, {0: 5, 1: 3})) == []
    assert moved_back(BatchRange("earliest", {0: 5})) == []
    # The topic made again with fewer records: Spark reads nothing, and the range holds none.
    assert moved_back(BatchRange({0: 150, 1: 150}, {0: 5, 1: 150})) == [0]
    assert not may_hold_records(BatchRange({0: 150, 1: 150}, {0: 5, 1: 150}))
    # With fewer partitions: the one gone too.
    assert moved_back(BatchRange({0: 150, 1: 150}, {0: 151})) == [1]
    assert moved_back(BatchRange({0: 5}, {0: 5, 1: 0})) == []  # a partition added since


def test_a_first_batch_starts_where_the_starting_offsets_say() -> None:
    assert _first_start({}) == "earliest"  # a topic the startingOffsets leave out
    assert _first_start({0: -2, 1: -2}) == "earliest"
    assert _first_start({0: -1}) == "latest"
    assert _first_start({0: 7, 1: -2}) == {0: 7, 1: -2}
    assert _first_start("latest") == "latest"


def test_the_query_settings_are_refused_with_what_to_fix(tmp_path: Path) -> None:
    endpoints = {
        "kafka": {"kafka.bootstrap.servers": "127.0.0.1:9092"},
        "catalog": {"uri": f"jdbc:sqlite:{tmp_path}/catalog.db", "warehouse": str(tmp_path / "warehouse")},
        "checkpoint_location": str(tmp_path / "checkpoint"),
    }
    with pytest.raises(ConfigError, match="not a regular expression"):
        load_pattern_settings("orders.(", "orders", None, endpoints, {})
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text(yaml.safe_dump({"topic": "orders", "encoding": "json"}))
    with pytest.raises(ConfigError, match="leave `topic` out"):
        load_pattern_settings("orders.*", "orders", defaults, endpoints, {})
    defaults.write_text(yaml.safe_dump({"trigger_interval": "often"}))
    with pytest.raises(ConfigError, match="trigger_interval"):
        load_pattern_settings("orders.*", "orders", defaults, endpoints, {})
    with pytest.raises(ConfigError, match="no such file"):
        load_pattern_settings("orders.*", "orders", tmp_path / "missing.yaml", endpoints, {})
    config = load_pattern_settings("orders.*", pattern_name("orders.*"), None, endpoints, {})
    assert config.name.startswith("pattern-") and config.regex.fullmatch("orders-eu")


def test_topics_whose_files_set_another_trigger_or_rate_run_in_a_query_per_set_of_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    endpoints = {
        "kafka": {"kafka.bootstrap.servers": "127.0.0.1:9092"},
        "catalog": {"uri": f"jdbc:sqlite:{tmp_path}/catalog.db", "warehouse": str(tmp_path / "warehouse")},
        "checkpoint_location": str(tmp_path / "checkpoint"),
    }
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text(
        yaml.safe_dump(
            {"schema": "playback", "encoding": "json", "trigger_interval": "1 second", "metrics_port": 9999}
        )
    )
    topics_dir = tmp_path / "topics"
    topics_dir.mkdir()
    files = {
        "orders.slow": {"trigger_interval": "10 seconds"},
        "orders.slower": {"trigger_interval": "10 seconds"},
        "orders.capped": {"max_offsets_per_trigger": 500},
        "orders.same": {"trigger_interval": "1 second"},
        "orders.retry": {"commit_retry": {"give_up_after_seconds": 5}, "deploy": {"executor_instances": 9}},
        "orders.broken": {"trigger_interval": "often"},  # dead-lettered whole by the pattern's query
        "payments.slow": {"trigger_interval": "10 seconds"},  # not matched
    }
    for topic, settings in files.items():
        (topics_dir / f"{topic}.yaml").write_text(yaml.safe_dump(settings))
    # The flag's metrics port is the pattern's query's, over the defaults file's (as `router run` gives it).
    config = load_pattern_settings(r"orders\..*", "orders", defaults, endpoints, {"metrics_port": 9000})
    sources = (defaults, topics_dir, lambda topic: endpoints, {})
    queries = pattern_queries(config, topics_dir, pattern_topic_settings(config, *sources))
    *own, pattern = queries
    assert sorted(query.topics or () for query in own) == [
        ("orders.capped",),
        ("orders.slow", "orders.slower"),
    ]
    assert all(query.pattern is None and query.name.startswith("orders-") for query in own)
    slow = next(query for query in own if "orders.slow" in (query.topics or ()))
    assert str(slow.trigger_interval) != str(config.trigger_interval)
    assert Path(slow.checkpoint_location).parent == Path(config.checkpoint_location).parent
    assert slow.checkpoint_location != config.checkpoint_location
    # The pattern's query reads every other matching topic, those created later too, under its own name.
    assert pattern.name == "orders" and pattern.checkpoint_location == config.checkpoint_location
    for topic in ("orders.same", "orders.broken", "orders.new"):
        assert pattern.regex.fullmatch(topic), topic
    for topic in ("orders.slow", "orders.slower", "orders.capped", "payments.slow"):
        assert not pattern.regex.fullmatch(topic), topic
    assert pattern.regex.fullmatch("orders.slow2")  # excluded by whole name only
    # Each topic runs with its own query's settings: its commits and floors are kept beside that query's
    # checkpoint; its own settings are its file's.
    load = pattern_topic_settings(config, *sources, queries)
    assert load("orders.slow").query.model_dump() == QuerySettings(**slow.query_settings()).model_dump()
    assert load("orders.same").query.model_dump() == QuerySettings(**config.query_settings()).model_dump()
    slow_own = load("orders.slow").settings
    assert slow_own.schema_name == "playback" and slow_own.table == "orders_slow"
    caplog.clear()
    retry = load("orders.retry")
    assert retry.query.commit_retry == config.commit_retry and retry.query.metrics_port == 9000
    warned = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert warned == [
        f"topic orders.retry: {topics_dir / 'orders.retry.yaml'} sets commit_retry and deploy, which are its "
        "query's settings: the query orders runs with those of its defaults; set them there"
    ]
    load("orders.same")  # its file sets nothing of the query's
    load("orders.new")  # no file: the defaults file's metrics_port is not the topic's to set
    assert [record.getMessage() for record in caplog.records if record.levelname == "WARNING"] == warned


def metric(text: str, name: str, topic: str) -> float:
    values = [
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name + "{") and f'topic="{topic}"' in line
    ]
    return sum(values)


@pytest.mark.integration
def test_one_query_archives_every_matching_topic_and_those_created_later(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    prefix = topic_name[:40]
    own, by_default, later, no_schema = (
        f"{prefix}.{name}" for name in ("own", "default", "later", "noschema")
    )
    unmatched = f"{topic_name[:40]}_other"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for topic in (own, by_default, no_schema, unmatched):
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    topics_dir = tmp_path / "topics"
    topics_dir.mkdir()
    # A topic with its own file, whose settings win over the defaults; one whose schema does not exist.
    # The first one's table exists already, its columns in another order than the router's: its rows are
    # made in the table's order, and written with the others'.
    layout = ArchiveLayout(load_event_schema("playback"), f"{prefix}_own_table")
    metadata, *event = reversed(layout.table_type.fields)
    reordered = T.StructType([metadata, *reversed(event)])
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {stack.catalog.name}.{stack.catalog.namespace}")
    spark.sql(
        f"CREATE TABLE {stack.catalog.table_identifier(layout.table)} ({ddl_columns(reordered)}) "
        f"USING iceberg PARTITIONED BY ({PARTITION_SPEC})"
    )
    (topics_dir / f"{own}.yaml").write_text(
        yaml.safe_dump({"schema": "playback", "encoding": "json", "table": f"{prefix}_own_table"})
    )
    (topics_dir / f"{no_schema}.yaml").write_text(
        yaml.safe_dump({"schema": "no_such_schema", "encoding": "json"})
    )
    defaults = tmp_path / "defaults.yaml"
    (metrics_port,) = free_ports(1)
    defaults.write_text(
        yaml.safe_dump(
            {
                "schema": "playback",
                "encoding": "json",
                "cluster": "test",
                "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
                "trigger_interval": "1 second",
                "checkpoint_location": str(tmp_path / "checkpoint"),
                "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
                "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false"}},
                "metrics_port": metrics_port,
                "metrics_host": "127.0.0.1",
                "lag_refresh_seconds": 1,
            }
        )
    )

    def send(topic: str, count: int, bad_fraction: float = 0.0, seed: int = 0) -> set[tuple[int, int]]:
        report = produce(
            ProduceRequest(topic=topic, count=count, partitions=2, schema="playback",
                           bad_fraction=bad_fraction, seed=seed),
            stack.bootstrap_servers, show_progress=False,
        )  # fmt: skip
        return produced_offsets(report.offsets)

    sent = {
        own: send(own, 300),
        by_default: send(by_default, 200, bad_fraction=0.1),
        no_schema: send(no_schema, 50),
    }
    send(unmatched, 20)
    command = [
        sys.executable, "-m", "bergstream", "router", "run", "--pattern", rf"{prefix}\..*",
        "--defaults", str(defaults), "--topics-dir", str(topics_dir),
    ]  # fmt: skip
    maintained = ["--maintain-every", "2s"]
    log = tmp_path / "router.log"
    tables = {own: f"{prefix}_own_table", by_default: table_for_topic(by_default),
              later: table_for_topic(later), no_schema: table_for_topic(no_schema)}  # fmt: skip

    def archived(topic: str) -> set[tuple[int, int]]:
        try:
            return set(archived_offsets(stack, tables[topic]))
        except Exception:  # not created yet
            return set()

    with log.open("ab") as out:
        router = subprocess.Popen(
            [*command, *maintained], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
    try:
        eventually(lambda: archived(own) == sent[own] and archived(by_default) == sent[by_default],
                   "both topics archived", timeout=240)  # fmt: skip
        # A topic created while the router runs: archived without a restart, from its first offset.
        admin.create_topics([NewTopic(later, 2, 1)])[later].result(30)
        sent[later] = send(later, 120, seed=3)
        eventually(lambda: archived(later) == sent[later], "the new topic archived", timeout=180)
        # Its next batches, of fewer records than a task's worth, are each read by one task.
        sent[later] |= send(later, 80, seed=4)
        eventually(lambda: archived(later) == sent[later], "the new topic's second round archived")
        # The topic whose schema does not exist: every record dead-lettered, with why.
        catalog = stack.catalog.load()
        dead_letters = f"{stack.catalog.namespace}.{tables[no_schema]}__dlq"
        eventually(lambda: len(archived_dead_letters(stack, dead_letters)) == len(sent[no_schema]),
                   "the topic without a schema dead-lettered whole")  # fmt: skip
        assert all("no_such_schema" in reason for reason in archived_dead_letters(stack, dead_letters))
        assert not catalog.table_exists(f"{stack.catalog.namespace}.{table_for_topic(unmatched)}")
        # Each topic's consumer group says where its archive ends, as a topic's own router's does.
        for topic in (own, by_default, later, no_schema):

            def committed(topic: str = topic) -> bool:
                return sum(committed_offsets(stack, topic, [0, 1]).values()) == len(sent[topic])

            eventually(committed, f"group bergstream-router.{topic} committed")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
            exported = answer.read().decode()
        assert metric(exported, "bergstream_router_records_archived_total", own) == 300
        bad = metric(exported, "bergstream_router_records_dead_lettered_total", by_default)
        assert (
            bad > 0 and metric(exported, "bergstream_router_records_archived_total", by_default) == 200 - bad
        )
        assert metric(exported, "bergstream_router_records_dead_lettered_total", no_schema) == 50
        # Every archived topic's tables maintained in turn by the driver's one maintenance thread.
        runs = "bergstream_router_maintenance_runs_total{"

        def every_topic_maintained() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
                text = answer.read().decode()
            return all(
                any(line.startswith(runs) and f'topic="{topic}"' in line and 'outcome="done"' in line
                    and float(line.split()[-1]) >= 1
                    for line in text.splitlines())
                for topic in (own, by_default, later)
            )  # fmt: skip

        eventually(every_topic_maintained, "each archived topic maintained", timeout=120)
    finally:
        router.send_signal(signal.SIGINT)
        router.wait(120)
    output = log.read_text()
    assert router.returncode == 1, output[-3000:]  # the topic without a schema archived nothing
    # Every topic's tables were written together, in one job, the reordered one too.
    assert f"{by_default} batch 0: read 200" in output and "(together" in output
    assert "writing it with the other topics failed" not in output
    assert appended_by_spark(stack, tables[own]) == []
    for topic in (by_default, later):
        each_file_one_hour_in_order(catalog.load_table(f"{stack.catalog.namespace}.{tables[topic]}"))
    # After its first batch (which may be a backlog's), a topic's batch of fewer records than a task's worth
    # is read by one task, its two partitions together: a file an hour a batch.
    table = catalog.load_table(f"{stack.catalog.namespace}.{tables[later]}")
    added: dict[int, list[str]] = {}
    for entry in table.inspect.entries().to_pylist():
        if entry["status"] == 1:
            added.setdefault(entry["snapshot_id"], []).append(repr(entry["data_file"]["partition"]))
    first = min(table.snapshots(), key=lambda snapshot: snapshot.sequence_number).snapshot_id
    next_batches = [hours for snapshot, hours in added.items() if snapshot != first]
    assert next_batches and all(len(hours) == len(set(hours)) for hours in next_batches), added
    rows = catalog.load_table(f"{stack.catalog.namespace}.{tables[by_default]}").scan().to_arrow().to_pylist()
    assert all(row["event_type"] and row["__metadata__"]["cluster"] == "test" for row in rows)
    assert all(row["__metadata__"]["router_write_ts"] is not None for row in rows)
    assert f"{no_schema}: FAILED: dead-lettered whole" in output

    # Started again from its checkpoint: what came meanwhile is archived once, nothing twice.
    sent[own] |= send(own, 100, seed=7)
    again = run_whole(spark, [*command, "--available-now", "--json"])
    assert again.returncode == 1, again.stderr[-3000:]
    report = json.loads(again.stdout)
    assert report["ok"] is False and no_schema in report["error"]
    totals = {topic["topic"]: topic for topic in report["topics"]}
    assert totals[own]["archived"] == 100 and totals[own]["error"] is None
    assert totals[no_schema]["error"].startswith("dead-lettered whole")
    rows = archived_offsets(stack, tables[own])
    assert len(rows) == len(set(rows)) and set(rows) == sent[own]


def each_file_one_hour_in_order(table: Any) -> None:
    """Each data file of `table` holds one hour, the one its partition names, its rows in ingestion-time
    order."""
    for data_file in table.inspect.files().to_pylist():
        hour = next(iter(data_file["partition"].values()))
        with table.io.new_input(data_file["file_path"]).open() as stream:
            stamps = pq.read_table(stream, columns=["__metadata__"]).column(0).combine_chunks()
        times = [stamp.timestamp() for stamp in stamps.field("kafka_ingestion_ts").to_pylist()]
        assert times == sorted(times) and {int(t) // 3600 for t in times} == {hour}, data_file["file_path"]


def archived_dead_letters(stack: Services, identifier: str) -> list[str]:
    return [
        str(r)
        for r in stack.catalog.load()
        .load_table(identifier)
        .scan(selected_fields=("error",))
        .to_arrow()
        .column("error")
        .to_pylist()
    ]


@pytest.mark.integration
def test_all_archives_the_topics_with_a_file_in_one_query_and_takes_a_new_file_at_its_next_start(
    stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    """`--all`: the topics with a file in --topics-dir, by name, in one query named `all`; its
    checkpoint kept when the files change, a topic whose file is added is archived from its first offset,
    one whose file is removed is no longer read."""
    prefix = topic_name[:40]
    first, second, added = (f"{prefix}.{name}" for name in ("first", "second", "added"))
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for topic in (first, second, added):
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    topics_dir = tmp_path / "topics"
    topics_dir.mkdir()
    for topic in (first, second):
        (topics_dir / f"{topic}.yaml").write_text(yaml.safe_dump({"schema": "playback", "encoding": "json"}))
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text(
        yaml.safe_dump(
            {
                "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
                "checkpoint_location": str(tmp_path / "checkpoint"),
                "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
                "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false"}},
            }
        )
    )

    def send(topic: str, count: int, seed: int) -> set[tuple[int, int]]:
        request = ProduceRequest(topic=topic, count=count, partitions=2, schema="playback", seed=seed)
        return produced_offsets(produce(request, stack.bootstrap_servers, show_progress=False).offsets)

    def run(files: set[str]) -> dict[str, dict[str, object]]:
        done = run_in_process(spark, "router", "run", "--all", "--available-now", "--json", "--defaults",
                              str(defaults), "--topics-dir", str(topics_dir))  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        # One query, of every topic with a file, checkpointed where the defaults say.
        (one_query,) = [line for line in done.stderr.splitlines() if "checkpoints to" in line]
        assert all(topic in one_query for topic in files), one_query
        assert one_query.endswith(str(tmp_path / "checkpoint")), one_query
        report = json.loads(done.stdout)
        assert report["ok"] is True, report
        return {topic["topic"]: topic for topic in report["topics"]}

    sent = {first: send(first, 200, 1), second: send(second, 150, 2), added: send(added, 100, 3)}
    totals = run({first, second})
    assert set(totals) == {first, second}
    assert totals[first]["archived"] == 200 and totals[second]["archived"] == 150
    assert set(archived_offsets(stack, table_for_topic(first))) == sent[first]
    assert not stack.catalog.load().table_exists(f"{stack.catalog.namespace}.{table_for_topic(added)}")

    # The files change: one added, one removed; the same query (its checkpoint) goes on.
    (topics_dir / f"{added}.yaml").write_text(yaml.safe_dump({"schema": "playback", "encoding": "json"}))
    (topics_dir / f"{first}.yaml").unlink()
    send(first, 50, 4)
    sent[second] |= send(second, 70, 5)
    totals = run({second, added})
    assert set(totals) == {second, added}
    assert totals[second]["archived"] == 70 and totals[added]["archived"] == 100
    for topic in (second, added):
        rows = archived_offsets(stack, table_for_topic(topic))
        assert len(rows) == len(set(rows)) and set(rows) == sent[topic], topic
    assert set(archived_offsets(stack, table_for_topic(first))) == sent[first], "a topic without a file read"


@pytest.mark.integration
def test_a_batch_larger_than_a_task_s_buffer_is_written_in_more_files_each_sorted_none_lost(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    """A task holds its rows until it writes them sorted; past its buffer (set small here) it writes what
    it holds and goes on: more files, each one hour in ingestion order, every record once."""
    prefix = topic_name[:40]
    topics = [f"{prefix}.{name}" for name in ("a", "b")]
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for topic in topics:
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    sent = {
        topic: produced_offsets(produce(
            ProduceRequest(topic=topic, count=3000, partitions=2, schema="playback", bad_fraction=0.05,
                           seed=number),
            stack.bootstrap_servers, show_progress=False,
        ).offsets)
        for number, topic in enumerate(topics)
    }  # fmt: skip
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text(
        yaml.safe_dump(
            {
                "schema": "playback",
                "encoding": "json",
                "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
                "checkpoint_location": str(tmp_path / "checkpoint"),
                "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
                "spark": {
                    "master": "local[2]",
                    "conf": {"spark.ui.enabled": "false", "spark.bergstream.router.taskBufferBytes": "64k"},
                },
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "bergstream", "router", "run", "--pattern", rf"{prefix}\.(a|b)",
         "--defaults", str(defaults), "--topics-dir", str(tmp_path / "none"), "--available-now"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "together" in done.stderr, "the topics were not written together"
    catalog = stack.catalog.load()
    for topic in topics:
        rows = archived_offsets(stack, table_for_topic(topic))  # archive and dead letters
        assert len(rows) == len(set(rows)) and set(rows) == sent[topic], topic
        assert archived_dead_letters(stack, f"{stack.catalog.namespace}.{table_for_topic(topic)}__dlq")
        table = catalog.load_table(f"{stack.catalog.namespace}.{table_for_topic(topic)}")
        files = table.inspect.files().to_pylist()
        hours = {next(iter(data_file["partition"].values())) for data_file in files}
        assert len(files) > 4 * len(hours), f"{topic}: {len(files)} files for {len(hours)} hours"
        each_file_one_hour_in_order(table)


@pytest.mark.integration
def test_a_topic_dead_lettered_whole_resumes_where_its_dead_letter_table_ends_when_the_checkpoint_is_lost(
    stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    """A topic whose schema is not found is dead-lettered whole, with its positions recorded as any topic's:
    the checkpoint lost, it resumes where its dead-letter table ends, not from `startingOffsets` (earliest
    here, which would dead-letter every record again)."""
    prefix = topic_name[:40]
    good, bad = f"{prefix}.good", f"{prefix}.bad"
    topics_dir = tmp_path / "topics"
    topics_dir.mkdir()
    (topics_dir / f"{good}.yaml").write_text(yaml.safe_dump({"schema": "playback", "encoding": "json"}))
    (topics_dir / f"{bad}.yaml").write_text(yaml.safe_dump({"schema": "no_such_schema", "encoding": "json"}))
    checkpoint = tmp_path / "checkpoint"
    defaults = write_defaults(stack, tmp_path)

    def send(topic: str, count: int, seed: int) -> set[tuple[int, int]]:
        return send_playback(stack, topic, count, seed)

    def run() -> None:
        done = run_all_in_one_query(spark, defaults, topics_dir)
        # A run with a topic dead-lettered whole reports it as failed, and exits non-zero.
        assert done.returncode == 1, done.stderr[-3000:]
        assert done.stderr.rstrip().endswith(f"bergstream: error: 1 of 2 topics failed: {bad}"), done.stderr[
            -3000:
        ]

    def dead_letters() -> list[tuple[int, int]]:
        table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{table_for_topic(bad)}__dlq")
        metadata = table.scan(selected_fields=("__metadata__",)).to_arrow().column("__metadata__").to_pylist()
        return [(m["partition"], m["offset"]) for m in metadata]

    sent = {good: send(good, 100, 1), bad: send(bad, 60, 2)}
    run()
    assert sorted(dead_letters()) == sorted(sent[bad])
    shutil.rmtree(checkpoint)
    sent[good] |= send(good, 30, 3)
    sent[bad] |= send(bad, 40, 4)
    run()
    rows = dead_letters()
    assert len(rows) == len(set(rows)), f"{len(rows) - len(set(rows))} records dead-lettered twice"
    assert set(rows) == sent[bad]
    archived = archived_offsets(stack, table_for_topic(good))
    assert len(archived) == len(set(archived)) and set(archived) == sent[good]


@pytest.mark.integration
def test_a_topic_new_to_the_checkpoint_starts_where_its_tables_end_not_at_its_first_offset(
    stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    """A topic archived by a router of its own, then given a file under `--all`: the query's
    checkpoint exists, so Spark reads the topic from its earliest offset; the records its tables already
    hold are dropped, the others archived, every offset once."""
    from bergstream.router.config import RouterConfig
    from bergstream.router.driver.launch import archive_available_now

    prefix = topic_name[:40]
    first, joined = f"{prefix}.first", f"{prefix}.joined"
    topics_dir = tmp_path / "topics"
    topics_dir.mkdir()
    settings = {"schema": "playback", "encoding": "json"}
    (topics_dir / f"{first}.yaml").write_text(yaml.safe_dump(settings))
    kafka = {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"}
    defaults = write_defaults(stack, tmp_path)

    def send(topic: str, count: int, seed: int) -> set[tuple[int, int]]:
        return send_playback(stack, topic, count, seed)

    def run() -> None:
        done = run_all_in_one_query(spark, defaults, topics_dir)
        assert done.returncode == 0, done.stderr[-3000:]

    sent = {first: send(first, 100, 1), joined: send(joined, 150, 2)}
    run()
    own = RouterConfig.flat(
        topic=joined, schema="playback", encoding="json", table=table_for_topic(joined), kafka=kafka,
        checkpoint_location=str(tmp_path / "own"), catalog=stack.catalog,
    )  # fmt: skip
    assert archive_available_now(spark, own).archived == 150
    (topics_dir / f"{joined}.yaml").write_text(yaml.safe_dump(settings))
    sent[joined] |= send(joined, 60, 3)
    sent[first] |= send(first, 20, 4)
    run()

    def assert_once() -> None:
        for topic in (first, joined):
            rows = archived_offsets(stack, table_for_topic(topic))
            assert len(rows) == len(set(rows)), (
                f"{topic}: {len(rows) - len(set(rows))} offsets archived twice"
            )
            assert set(rows) == sent[topic], topic

    assert_once()
    floors = tmp_path / "checkpoint" / "bergstream-topic-floors.json"
    assert joined in json.loads(floors.read_text()), "kept until a batch of the topic starts past it"
    sent[joined] |= send(joined, 10, 5)
    run()
    assert_once()
    assert joined not in json.loads(floors.read_text()), (
        "the floor goes once the topic's ranges start past it"
    )


@pytest.mark.integration
def test_a_topic_moved_into_a_query_of_its_own_settings_and_back_is_archived_once(
    stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    """A matching topic whose file comes to set another trigger runs in a query of its own from the next
    start, resuming where its tables end; its file's setting gone, it is back in the pattern's query, whose
    checkpoint still holds where it was read up to before it left: every offset once."""
    prefix = topic_name[:40]
    stays, moves = f"{prefix}.stays", f"{prefix}.moves"
    topics_dir = tmp_path / "topics"
    topics_dir.mkdir()
    defaults = write_defaults(
        stack, tmp_path, schema="playback", encoding="json", trigger_interval="1 second"
    )
    command = pattern_command(rf"{prefix}\..*", defaults, topics_dir, "--available-now", "--json")

    def run() -> str:
        done = run_whole(spark, command)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stderr

    sent = {stays: send_playback(stack, stays, 100, 1), moves: send_playback(stack, moves, 120, 2)}
    run()
    (topics_dir / f"{moves}.yaml").write_text(yaml.safe_dump({"trigger_interval": "2 seconds"}))
    sent[moves] |= send_playback(stack, moves, 50, 3)
    sent[stays] |= send_playback(stack, stays, 10, 4)
    log = run()
    assert f"{moves} run in a query of their own" in log and "trigger_interval 2 seconds" in log, log[-3000:]
    # The pattern's query keeps its checkpoint; the topic's own query checkpoints beside it.
    own = [path.name for path in tmp_path.iterdir() if path.name.startswith("pattern-")]
    assert len(own) == 1 and (tmp_path / "checkpoint").is_dir(), own
    (topics_dir / f"{moves}.yaml").unlink()
    sent[moves] |= send_playback(stack, moves, 30, 5)
    run()
    for topic in (stays, moves):
        rows = archived_offsets(stack, table_for_topic(topic))
        assert len(rows) == len(set(rows)), f"{topic}: {len(rows) - len(set(rows))} offsets archived twice"
        assert set(rows) == sent[topic], f"{topic}: {len(sent[topic] - set(rows))} offsets lost"


def send_playback(stack: Services, topic: str, count: int, seed: int) -> set[tuple[int, int]]:
    request = ProduceRequest(topic=topic, count=count, partitions=2, schema="playback", seed=seed)
    return produced_offsets(produce(request, stack.bootstrap_servers, show_progress=False).offsets)


def run_all_in_one_query(spark: SparkSession, defaults: Path, topics_dir: Path) -> Ran:
    """`router run --all --available-now` over the topics with a file in `topics_dir`, run whole on the
    test's session."""
    return run_in_process(spark, "router", "run", "--all", "--available-now", "--defaults", str(defaults),
                          "--topics-dir", str(topics_dir))  # fmt: skip
