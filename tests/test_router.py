"""`bergstream router run`: every offset archived exactly once, the group committed, bad settings refused."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions
from prometheus_client.parser import text_string_to_metric_families
from pyiceberg.exceptions import NoSuchTableError

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local.processes import free_ports
from bergstream.router.config import load_router_config
from bergstream.router.driver.launch import archive_available_now
from tests.commands import refused_before_spark
from tests.routers import (
    archive_whole,
    archived_offsets,
    committed_offsets,
    eventually,
    produced_offsets,
    run_router,
    start_router,
    write_config,
)
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def wait_for_line(log: Path, text: str, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().count(text) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} did not appear {count} times in {log}")


def test_available_now_archives_each_offset_once_and_commits_the_group(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    """The command as a process of its own, then run again (nothing new, then new records) on the tests'
    session."""
    config = write_config(stack, tmp_path, topic_name)
    first = produce(
        ProduceRequest(topic=topic_name, schema="playback", count=3000, bad_fraction=0.03, partitions=3),
        stack.bootstrap_servers, show_progress=False,
    )  # fmt: skip
    done = run_router(topic_name, config, "--available-now")
    assert done.returncode == 0, done.stderr[-3000:]
    bad = sum(first.malformed.values())
    assert f"read 3,000, archived {3000 - bad:,}, dead-lettered {bad:,}" in done.stdout
    # The files the summary counts are the ones the appends added to the two tables.
    counted = re.search(r"dead-lettered [\d,]+, (\d+) files", done.stdout)
    catalog = stack.catalog.load()
    tables = (topic_name, f"{topic_name}__dlq")
    added = [catalog.load_table(f"{stack.catalog.namespace}.{t}").inspect.files().num_rows for t in tables]
    assert counted is not None and int(counted.group(1)) == sum(added) and all(added), (counted, added)

    again = archive_whole(spark, topic_name, config)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "read 0," in again.stdout

    second = produce(
        ProduceRequest(topic=topic_name, schema="playback", count=1000, partitions=3, seed=2),
        stack.bootstrap_servers, show_progress=False,
    )  # fmt: skip
    assert archive_whole(spark, topic_name, config).returncode == 0

    seen = archived_offsets(stack, topic_name)
    expected = produced_offsets(first.offsets) | produced_offsets(second.offsets)
    assert len(seen) == len(set(seen)) == len(expected) == 4000
    assert set(seen) == expected
    ends = {p: high + 1 for p, (_, high) in second.offsets.items()}
    assert committed_offsets(stack, topic_name, [0, 1, 2]) == ends


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"kafka": {"subscribe": "other"}}, "kafka: Value error, option 'subscribe' is not allowed here"),
        (
            {"kafka": {"startingOffsets": "earliest"}},
            "kafka: Value error, kafka.bootstrap.servers is missing",
        ),
        (
            {"kafka": {"kafka.bootstrap.servers": "127.0.0.1:1", "maxOffsetsPerTrigger": "5"}},
            "max_offsets_per_trigger",
        ),
        (
            {"kafka": {"kafka.bootstrap.servers": "127.0.0.1:1", "startingOffset": "earliest"}},
            "unknown option",
        ),
        ({"trigger_interval": "often"}, "trigger_interval: Value error, 'often' is not an interval"),
        ({"trigger_interval": "30 s"}, "trigger_interval: Value error, '30 s' is not an interval"),
        ({"encoding": "protobuf"}, "encoding"),
        ({"colour": "blue"}, "colour: Extra inputs are not permitted"),
        ({"topic": "someone_else"}, "topic is 'someone_else' but 'refused' was asked for"),
        ({"schema": "clicks"}, "no event schema named 'clicks'"),
    ],
)
def test_bad_settings_are_refused_naming_the_file_and_key(
    stack: Services,
    tmp_path: Path,
    settings: dict[str, object],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = write_config(stack, tmp_path, "refused", **settings)
    command = ["router", "run", "--topic", "refused", "--config", str(config), "--available-now"]
    refused = refused_before_spark(monkeypatch, *command)
    assert refused.exit_code == 1
    assert message in refused.message
    assert str(config) in refused.message


def test_sigkill_at_random_moments_and_a_lost_checkpoint_lose_and_repeat_nothing(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    """Killed three times; once, its checkpoint is lost too: the router resumes where its tables end."""
    config = write_config(stack, tmp_path, topic_name, max_offsets_per_trigger=1500)
    rng = random.Random(42)
    offsets: set[tuple[int, int]] = set()
    log = tmp_path / "router.log"
    for round_number in range(3):
        report = produce(
            ProduceRequest(topic=topic_name, schema="playback", count=4000, bad_fraction=0.02, partitions=3,
                           seed=round_number),
            stack.bootstrap_servers, show_progress=False,
        )  # fmt: skip
        offsets |= produced_offsets(report.offsets)
        batches = log.read_text().count(" batch ") if log.exists() else 0
        router = start_router(topic_name, config, log)
        wait_for_line(log, " batch ", count=batches + 1)  # warmed up: the next batches take a second or two
        time.sleep(rng.uniform(0, 5))
        os.killpg(router.pid, signal.SIGKILL)  # the Python driver and its Spark JVM, at once
        router.wait()
        if round_number == 1:
            shutil.rmtree(tmp_path / "checkpoints" / topic_name)
    drained = archive_whole(spark, topic_name, config)
    assert drained.returncode == 0, drained.stderr[-3000:]
    assert log.read_text().count("holds no batch; resuming where the tables' snapshots say") == 1

    seen = archived_offsets(stack, topic_name)
    duplicates = len(seen) - len(set(seen))
    assert duplicates == 0, f"{duplicates} offsets archived more than once"
    assert set(seen) == offsets, f"{len(offsets - set(seen))} offsets lost"


def test_expired_offsets_are_counted_and_the_router_goes_on(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    config = write_config(stack, tmp_path, topic_name)
    request = ProduceRequest(topic=topic_name, schema="playback", count=100, partitions=1)
    produce(request, stack.bootstrap_servers, show_progress=False)
    # The router's checkpoint at offset 100, as a run in the tests' own Spark session leaves it.
    assert archive_available_now(spark, load_router_config(topic_name, config, {}, {})).read == 100

    produce(request, stack.bootstrap_servers, show_progress=False)  # offsets 100..199
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    from confluent_kafka import TopicPartition

    deleted = admin.delete_records([TopicPartition(topic_name, 0, 150)])
    for future in deleted.values():
        future.result(30)
    produce(request, stack.bootstrap_servers, show_progress=False)  # offsets 200..299

    done = archive_whole(spark, topic_name, config)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "partition 0: offsets 100 to 149 (50 records) expired from Kafka before being archived" in done.stderr
    )
    assert "50 offsets expired before they were read" in done.stdout
    seen = sorted(archived_offsets(stack, topic_name))
    assert seen == [(0, o) for o in [*range(100), *range(150, 300)]]


def test_an_available_now_run_whose_last_write_fails_exits_failed_and_the_next_archives_the_rest_once(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    """A run's records held to its end by a target lag, then its one write refused by the file system (the
    table's data folder a file): the run exits failed, naming the topic, and archives nothing. Mended, the
    next run archives every offset of both, once."""
    # A failed commit set aside at once, not waited out as an outage of the warehouse.
    retry = {"give_up_after_seconds": 0}
    config = write_config(stack, tmp_path, topic_name, target_lag="1h", commit_retry=retry)
    request = ProduceRequest(topic=topic_name, schema="playback", count=200, partitions=2)
    first = produced_offsets(produce(request, stack.bootstrap_servers, show_progress=False).offsets)
    done = archive_whole(spark, topic_name, config)
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(archived_offsets(stack, topic_name)) == first

    later = ProduceRequest(topic=topic_name, schema="playback", count=300, partitions=2, seed=2)
    second = produced_offsets(produce(later, stack.bootstrap_servers, show_progress=False).offsets)
    table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{topic_name}")
    data = Path(urllib.parse.urlparse(table.location()).path) / "data"
    data.rename(kept := data.with_name("data.kept"))
    data.write_text("no folder: every write below it fails\n")
    try:
        failed = archive_whole(spark, topic_name, config)
    finally:
        data.unlink()
        kept.rename(data)
    assert failed.returncode != 0, failed.stdout[-3000:]
    said = failed.stdout + failed.stderr
    assert f"{topic_name}: FAILED: set aside, not caught up" in said, said[-3000:]
    assert f"error: 1 of 1 topics failed: {topic_name}" in said, said[-3000:]
    assert set(archived_offsets(stack, topic_name)) == first

    mended = archive_whole(spark, topic_name, config)
    assert mended.returncode == 0, mended.stderr[-3000:]
    seen = archived_offsets(stack, topic_name)
    assert len(seen) == len(set(seen)) and set(seen) == first | second


def archived(stack: Services, topic: str) -> int:
    """Records in the topic's tables; 0 before the router made them."""
    try:
        return len(archived_offsets(stack, topic))
    except NoSuchTableError:
        return 0


def logged_reads(log: Path) -> int:
    """Records the router's batches say they read, from its log."""
    return sum(int(n.replace(",", "")) for n in re.findall(r" batch \d+: read ([\d,]+),", log.read_text()))


def reads_by_partition(port: int) -> dict[int, int]:
    """bergstream_router_records_read_total by partition, from the router's metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        int(sample.labels["partition"]): int(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "bergstream_router_records_read_total" and sample.value
    }


def test_partitions_added_while_the_router_runs_are_archived_and_counted(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    (port,) = free_ports(1)
    config = write_config(stack, tmp_path, topic_name, metrics_port=port, metrics_host="127.0.0.1")
    first = produce(
        ProduceRequest(topic=topic_name, schema="playback", count=600, partitions=2),
        stack.bootstrap_servers, show_progress=False,
    )  # fmt: skip
    log = tmp_path / "router.log"
    router = start_router(topic_name, config, log)
    try:
        eventually(lambda: archived(stack, topic_name) == 600, "the first 600 records archived")
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        for future in admin.create_partitions([NewPartitions(topic_name, 4)]).values():
            future.result(30)
        # The router read the topic's partitions when it started: records of the two new ones come from
        # partitions its batches were not told about.
        second = produce(
            ProduceRequest(topic=topic_name, schema="playback", count=2000, partitions=4, seed=2),
            stack.bootstrap_servers, show_progress=False,
        )  # fmt: skip
        assert {2, 3} <= set(second.offsets)
        # Counted, not only committed: the batches that archived them have also been logged.
        eventually(lambda: logged_reads(log) == 2600, "all 2,600 records archived and counted")
        # Each partition's records are counted as its own, the new partitions' too.
        produced = Counter(first.per_partition) + Counter(second.per_partition)
        assert reads_by_partition(port) == dict(produced)
    finally:
        router.send_signal(signal.SIGTERM)  # the driver alone: it stops its query, then its JVM
        router.wait(120)
    seen = archived_offsets(stack, topic_name)
    assert sorted(seen) == sorted(produced_offsets(first.offsets) | produced_offsets(second.offsets))
    assert "read 2,600, archived 2,600, dead-lettered 0" in log.read_text()
