"""A three-broker Kafka cluster loses the leader of a partition to SIGKILL while the router archives and
while a backfill replays: every record lands exactly once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bergstream.backfill.read.batches import window_of
from bergstream.backfill.read.order import BoundedOrder
from bergstream.backfill.replay import ReplayReport, replay
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local import LocalStack, StackConfig, kafka_broker
from bergstream.local.processes import free_ports
from bergstream.router.config import load_router_config
from bergstream.router.driver.launch import archive_available_now
from tests.routers import (
    archived_offsets,
    eventually,
    produced_offsets,
    run_router,
    start_router,
    unread_record,
    write_config,
)
from tests.services import Services
from tests.test_unread_ranges import archived, archived_once_exactly, killed, metric_value

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    ports = free_ports(6)
    config = StackConfig(
        data_dir=tmp_path_factory.mktemp("cluster"), kafka_port=ports[0], controller_port=ports[1],
        brokers=3, other_ports=((ports[2], ports[3]), (ports[4], ports[5])),
    )  # fmt: skip
    stack = LocalStack(config)
    stack.up()
    try:
        yield stack
    finally:
        # All at once: stopped one by one, the last broker has no controller quorum left to shut down with,
        # and waits out its grace period before it is killed.
        with ThreadPoolExecutor(len(config.nodes)) as pool:
            assert all(pool.map(kafka_broker.stop, config.nodes))


def services(stack: LocalStack) -> Services:
    return Services(stack.config.bootstrap_servers, stack.config.catalog, None)


def leader_of(stack: LocalStack, topic: str, partition: int) -> kafka_broker.BrokerConfig:
    metadata = AdminClient({"bootstrap.servers": stack.config.bootstrap_servers}).list_topics(
        topic, timeout=10
    )
    leader = metadata.topics[topic].partitions[partition].leader
    return next(node for node in stack.config.nodes if node.node_id == leader)


def kill(node: kafka_broker.BrokerConfig) -> None:
    pid = kafka_broker.running_pid(node)
    assert pid is not None, f"broker {node.node_id} is not running"
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while kafka_broker.running_pid(node) is not None:
        assert time.monotonic() < deadline, f"broker {node.node_id} outlived SIGKILL"
        time.sleep(0.1)


def test_the_leader_killed_while_the_router_archives_loses_and_repeats_nothing(
    cluster: LocalStack, topic_name: str, tmp_path: Path
) -> None:
    kafka = services(cluster)

    def batch(seed: int) -> set[tuple[int, int]]:
        request = ProduceRequest(topic=topic_name, schema="playback", count=3000, bad_fraction=0.02,
                                 partitions=3, seed=seed)  # fmt: skip
        return produced_offsets(produce(request, kafka.bootstrap_servers, show_progress=False).offsets)

    offsets = batch(1)
    # Spark's Kafka source asks where the partitions end through an admin client, whose request to the
    # leader killed waits out default.api.timeout.ms before it asks again: 15 s rather than a minute a batch.
    config = write_config(kafka, tmp_path, topic_name, max_offsets_per_trigger=1000,
                          kafka=kafka_settings(kafka, api_timeout_ms=15000))  # fmt: skip
    log = tmp_path / "router.log"
    router = start_router(topic_name, config, log)
    try:
        deadline = time.monotonic() + 180
        while " batch 0: read " not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline and router.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        leader = leader_of(cluster, topic_name, 0)
        kill(leader)  # while the router is in the middle of the backlog
        # Written to the two brokers left (min.insync.replicas is 2) once the controller has fenced the
        # leader and moved its partitions.
        offsets |= batch(2)
        # The router reads all of it, the backlog and what came during the outage, before the leader is back.
        _read_at_least(router, log, len(offsets), deadline + 180)
        kafka_broker.start(leader)
        offsets |= batch(3)
        _read_at_least(router, log, len(offsets), deadline + 360)
    finally:
        router.send_signal(signal.SIGTERM)
        router.wait(120)
    output = log.read_text()
    assert router.returncode == 0, output[-3000:]
    # The check of the topics' ids before each batch asked the broker killed once, not every batch until
    # it came back: each such batch waits out the check's timeout.
    unchecked = re.findall(r"batch \d+ is written without checking its topics' ids", output)
    assert len(unchecked) <= 1, unchecked
    seen = archived_offsets(kafka, topic_name)
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} offsets archived more than once"
    assert set(seen) == offsets, f"{len(offsets - set(seen))} offsets lost"


def kafka_settings(kafka: Services, api_timeout_ms: int) -> dict[str, str]:
    """A router's Kafka settings whose requests give up after `api_timeout_ms` (a minute by default)."""
    return {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "startingOffsets": "earliest",
        "kafka.default.api.timeout.ms": str(api_timeout_ms),
        "kafka.request.timeout.ms": str(min(api_timeout_ms, 10000)),
    }


def _read_at_least(router: subprocess.Popen[bytes], log: Path, records: int, deadline: float) -> None:
    while sum(int(n) for n in re.findall(r" batch \d+: read (\d+),", log.read_text())) < records:
        assert time.monotonic() < deadline and router.poll() is None, log.read_text()[-3000:]
        time.sleep(0.5)


def test_the_leader_killed_during_a_replay_loses_and_repeats_nothing(
    cluster: LocalStack, stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    # The cluster's topic, archived into the tests' catalog by their own Spark session, then replayed.
    kafka = Services(cluster.config.bootstrap_servers, stack.catalog, None)
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=4)
    request = ProduceRequest(topic=topic_name, schema="playback", count=6000, partitions=3, seed=3,
                             ingestion_start=start, ingestion_span=timedelta(hours=2))  # fmt: skip
    produce(request, kafka.bootstrap_servers, show_progress=False)
    config = load_router_config(topic_name, write_config(kafka, tmp_path, topic_name), {}, {})
    assert archive_available_now(spark, config).read == 6000

    target = f"{topic_name}_replayed"
    killed: list[kafka_broker.BrokerConfig] = []

    def on_epoch(report: ReplayReport) -> None:
        if report.epochs_done == 2:
            killed.append(leader_of(cluster, target, 0))
            kill(killed[0])
        elif report.epochs_done == 6:
            kafka_broker.start(killed[0])

    window = window_of(start, start + timedelta(hours=2))
    report = replay(
        kafka.catalog, topic_name, window, BoundedOrder(timedelta(minutes=10)), target,
        {"bootstrap.servers": kafka.bootstrap_servers}, on_epoch=on_epoch,
    )  # fmt: skip
    assert killed and report.epochs_done == report.epochs == 12
    expected = set(archived_offsets(kafka, topic_name))
    assert report.records == len(expected) == 6000
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"check-{target}"})
    partitions = AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(target, timeout=10)
    consumer.assign([TopicPartition(target, p, 0) for p in partitions.topics[target].partitions])
    seen = []
    while len(seen) < report.records:
        message = consumer.poll(10)
        if message is None:
            break
        assert message.error() is None, message.error()
        headers = dict(message.headers() or [])
        seen.append((int(headers["bergstream.source.partition"]), int(headers["bergstream.source.offset"])))
    assert consumer.poll(3) is None, "more records in the replayed topic than were replayed"
    consumer.close()
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} records replayed more than once"
    assert set(seen) == expected, f"{len(expected - set(seen))} records lost by the replay"


def test_kafka_out_while_a_topics_range_is_due_and_at_a_graceful_stop_loses_and_repeats_nothing(
    cluster: LocalStack, topic_name: str, tmp_path: Path
) -> None:
    """A router on a target lag has a range unread when every broker of the cluster goes: the range falls due
    between batches and its read fails, so it stays unread; the operator stops the router while Kafka is
    still out, and its stop ends, the range recorded beside the checkpoint. Kafka back, the router run
    again archives that range and what came since, each record once, the commits' positions following each
    other."""
    kafka = services(cluster)
    sent: set[tuple[int, int]] = set()

    def send(count: int, seed: int) -> None:
        request = ProduceRequest(topic=topic_name, schema="playback", count=count, partitions=3, seed=seed)
        sent.update(produced_offsets(produce(request, kafka.bootstrap_servers, show_progress=False).offsets))

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(topic_name, 3)])[topic_name].result(30)
    (port,) = free_ports(1)
    # Spark's Kafka source waits out each offset request up to default.api.timeout.ms, three times, before
    # its query fails, and a stop asked meanwhile waits for that: 30 s rather than a minute keeps the stop
    # short and still leaves the test a minute to ask for it before the query would fail on its own.
    settings = kafka_settings(kafka, api_timeout_ms=30000)
    config = write_config(kafka, tmp_path, topic_name, target_lag="15s", metrics_port=port,
                          metrics_host="127.0.0.1", kafka=settings)  # fmt: skip
    log = tmp_path / "router.log"
    router = start_router(topic_name, config, log)
    try:
        # Sent once the router runs, so that the records' target lag runs from when the router meets them.
        eventually(lambda: metric_value(port, "bergstream_router_target_lag_seconds", topic_name) == 15,
                   "the router running", timeout=240)  # fmt: skip
        send(300, seed=1)
        eventually(lambda: metric_value(port, "bergstream_router_pending_records", topic_name) == 300,
                   "the records met and unread", timeout=240)  # fmt: skip
        with ThreadPoolExecutor(len(cluster.config.nodes)) as pool:
            list(pool.map(kill, cluster.config.nodes))
        eventually(lambda: "due between batches are not read now" in log.read_text(),
                   "the read of the range due failing while Kafka is out", timeout=300)  # fmt: skip
        assert router.poll() is None, log.read_text()[-3000:]
        router.send_signal(signal.SIGINT)
        router.wait(300)
    finally:
        if router.poll() is None:
            killed(router)
    output = log.read_text()
    assert router.returncode == 0, output[-3000:]
    assert not archived(kafka, topic_name), "archived before its target lag"
    assert unread_record(tmp_path / "checkpoints" / topic_name).keys() == {topic_name}, output[-3000:]

    kafka_broker.start_cluster(cluster.config.nodes)
    send(100, seed=2)
    run = run_router(topic_name, config, "--available-now", timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    archived_once_exactly(kafka, topic_name, sent)
