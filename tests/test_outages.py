"""The catalog's database and the warehouse go away while the router runs: it waits, then goes on, and
every offset is archived exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from bergstream.catalog import CatalogConfig
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local.processes import free_ports
from bergstream.router.config import table_for_topic
from bergstream.router.retry import CommitRetrySettings, JavaCause, kafka_unavailable, transient_reason
from tests.postgres import USER, postgres_server
from tests.routers import (
    appended_by_spark,
    archived_offsets,
    eventually,
    produced_offsets,
    start_router,
    write_config,
)
from tests.services import Services

OUTAGE_LINE = "failed (attempt "
CAPPED_LINE = "trying again in 4.0s"  # RunningRouter's max_backoff_seconds
RECOVERY_LINE = "attempts, "


def scrape(port: int) -> dict[str, float]:
    """Every sample of the router's /metrics, summed over labels, by sample name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


class RunningRouter:
    """A router process with its metrics port, stopped with SIGTERM as Kubernetes would."""

    def __init__(
        self, stack: Services, topic: str, directory: Path, catalog: CatalogConfig, **settings: Any
    ) -> None:
        (self.port,) = free_ports(1)
        self.log = directory / "router.log"
        config = write_config(
            stack, directory, topic,
            catalog=catalog.model_dump(mode="json", exclude_none=True),
            metrics_port=self.port, metrics_host="127.0.0.1", max_offsets_per_trigger=1000,
            commit_retry={"initial_backoff_seconds": 0.5, "max_backoff_seconds": 4}, **settings,
        )  # fmt: skip
        self.process = start_router(topic, config, self.log)

    def metric(self, name: str) -> float:
        try:
            return scrape(self.port).get(name, 0.0)
        except OSError:  # not serving yet
            return 0.0

    def handled(self) -> float:
        return self.metric("bergstream_router_records_archived_total") + self.metric(
            "bergstream_router_records_dead_lettered_total"
        )

    def log_lines(self, text: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if text in line]

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(120)
        assert self.process.returncode == 0, self.log.read_text()[-3000:]


@pytest.mark.integration
def test_a_catalog_database_down_past_the_backoff_cap_loses_and_repeats_nothing(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    def batch(seed: int) -> set[tuple[int, int]]:
        request = ProduceRequest(topic=topic_name, schema="playback", count=2000, bad_fraction=0.02,
                                 partitions=2, seed=seed)  # fmt: skip
        return produced_offsets(produce(request, stack.bootstrap_servers, show_progress=False).offsets)

    with postgres_server() as postgres:
        catalog = CatalogConfig(uri=postgres.jdbc_uri, warehouse=(tmp_path / "warehouse").as_uri(), user=USER)
        offsets = batch(1)
        router = RunningRouter(stack, topic_name, tmp_path, catalog)
        try:
            eventually(lambda: router.handled() == 2000, "the first 2,000 records archived")
            postgres.stop(mode="immediate")  # as a crash would: no goodbye to the catalog's connections
            offsets |= batch(2)
            eventually(lambda: router.metric("bergstream_router_commit_retries_total") >= 2, "retries")
            assert router.metric("bergstream_router_commit_outage_seconds") > 0
            # The outage lasts until the router goes on trying at the capped backoff: two waits of 4 s.
            eventually(lambda: len(router.log_lines(CAPPED_LINE)) >= 2, "two attempts at the capped backoff")
            assert router.metric("bergstream_router_commit_outage_seconds") >= 0.5 + 1 + 2 + 4
            assert router.handled() == 2000, "nothing can be committed while the catalog is down"
            postgres.start()
            eventually(lambda: router.handled() == 4000, "the 2,000 records of the outage archived")
            assert router.metric("bergstream_router_commit_outage_seconds") == 0
            offsets |= batch(3)
            eventually(lambda: router.handled() == 6000, "2,000 more after the outage")
            assert router.metric("bergstream_router_records_dead_lettered_total") < 0.05 * 6000
            # Stopped while a batch waits for the catalog: it stops at once, and that batch is archived
            # when the router starts again.
            postgres.stop(mode="immediate")
            offsets |= batch(4)
            retries = router.metric("bergstream_router_commit_retries_total")
            eventually(lambda: router.metric("bergstream_router_commit_retries_total") > retries, "a retry")
        finally:
            router.stop()
        failures = router.log_lines(OUTAGE_LINE)
        assert len(failures) >= 6, "one log line per attempt, with backoff 0.5, 1, 2, then 4 s at the cap"
        assert all("PSQLException" in line or "Connection" in line for line in failures), failures[0]
        assert len(router.log_lines(RECOVERY_LINE)) == 1
        assert router.log_lines("stopped while batch"), router.log.read_text()[-3000:]
        assert not router.log_lines("is set aside"), router.log_lines("is set aside")
        stopped = router.log.read_text()
        assert "StackOverflowError" not in stopped, stopped[stopped.index("StackOverflowError") - 2000 :][
            :4000
        ]
        postgres.start()
        router = RunningRouter(stack, topic_name, tmp_path, catalog)
        try:
            eventually(lambda: router.handled() == 2000, "the batch of the stop archived by the next run")
        finally:
            router.stop()
        services = Services(stack.bootstrap_servers, catalog, None)
        seen = archived_offsets(services, topic_name)
        # The batches written alone while the catalog was out, and the replayed one, by the same job.
        assert appended_by_spark(services, topic_name) == []
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} offsets archived more than once"
    assert set(seen) == offsets, f"{len(offsets - set(seen))} offsets lost"


@pytest.mark.integration
def test_a_catalog_database_that_stops_answering_is_waited_out_and_does_not_hold_the_router_s_stop(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    """The database stalls (its processes stopped, connections open, nothing refused): each commit attempt
    ends at the driver's timeouts (bergstream bounds them for PostgreSQL; short here) as an outage that is
    retried, and SIGTERM ends the router instead of waiting on the database for ever."""

    def batch(seed: int) -> set[tuple[int, int]]:
        request = ProduceRequest(topic=topic_name, schema="playback", count=1000, partitions=2, seed=seed)
        return produced_offsets(produce(request, stack.bootstrap_servers, show_progress=False).offsets)

    timeouts = {"jdbc.socketTimeout": 4, "jdbc.loginTimeout": 4}
    with postgres_server() as postgres:
        catalog = CatalogConfig(uri=postgres.jdbc_uri, warehouse=(tmp_path / "warehouse").as_uri(), user=USER,
                                properties=timeouts)  # fmt: skip
        offsets = batch(1)
        router = RunningRouter(stack, topic_name, tmp_path, catalog)
        try:
            eventually(lambda: router.handled() == 1000, "the first 1,000 records archived")
            postgres.pause()
            try:
                offsets |= batch(2)
                eventually(
                    lambda: router.metric("bergstream_router_commit_retries_total") >= 2, "two retries"
                )
                assert router.handled() == 1000, "nothing can be committed while the catalog is stalled"
                router.stop()  # waits for the exit, bounded: a stop held by the database fails here
            finally:
                postgres.resume()
        finally:
            if router.process.poll() is None:
                router.stop()
        failures = router.log_lines(OUTAGE_LINE)
        assert failures and all("PSQLException" in line or "timed out" in line for line in failures), failures
        assert router.log_lines("stopped while batch"), router.log.read_text()[-3000:]
        # A stop is no failure of the topic: its batch is not committed, and Spark runs it again.
        assert not router.log_lines("is set aside"), router.log_lines("is set aside")
        router = RunningRouter(stack, topic_name, tmp_path, catalog)
        try:
            eventually(lambda: router.handled() == 1000, "the batch of the stall archived by the next run")
        finally:
            router.stop()
        seen = archived_offsets(Services(stack.bootstrap_servers, catalog, None), topic_name)
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} offsets archived more than once"
    assert set(seen) == offsets, f"{len(offsets - set(seen))} offsets lost"


@pytest.mark.integration
@pytest.mark.parametrize("target_lag", [None, "20s"], ids=["every-batch", "target-lag"])
def test_a_pattern_router_waits_out_a_catalog_outage_topic_by_topic_and_loses_and_repeats_nothing(
    stack: Services, topic_name: str, tmp_path: Path, target_lag: str | None
) -> None:
    """One query for several topics: a batch whose write of every topic together fails on a catalog that
    is down goes topic by topic, each waiting for the catalog with its own retries; once it is back, every
    offset of every topic is archived once. With a target lag, the topics' ranges unread when the catalog
    went down are read and committed once it is back, each once."""
    # The variants' topics apart: the two share a broker, and their names' first 40 characters.
    prefix = topic_name[:36] + ("_lag" if target_lag else "")
    topics = [f"{prefix}.{name}" for name in ("a", "b", "c")]
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for topic in topics:
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)

    def batch(seed: int) -> dict[str, set[tuple[int, int]]]:
        return {
            topic: produced_offsets(produce(
                ProduceRequest(topic=topic, schema="playback", count=300, partitions=2, seed=seed + number),
                stack.bootstrap_servers, show_progress=False,
            ).offsets)
            for number, topic in enumerate(topics)
        }  # fmt: skip

    with postgres_server() as postgres:
        catalog = CatalogConfig(uri=postgres.jdbc_uri, warehouse=(tmp_path / "warehouse").as_uri(), user=USER)
        (port,) = free_ports(1)
        defaults = tmp_path / "defaults.yaml"
        defaults.write_text(yaml.safe_dump({
            "schema": "playback", "encoding": "json", "cluster": "test",
            "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
            "trigger_interval": "1 second", "checkpoint_location": str(tmp_path / "checkpoint"),
            "catalog": catalog.model_dump(mode="json", exclude_none=True),
            "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false"}},
            "metrics_port": port, "metrics_host": "127.0.0.1",
            "commit_retry": {"initial_backoff_seconds": 0.5, "max_backoff_seconds": 2},
            **({"target_lag": target_lag} if target_lag else {}),
        }))  # fmt: skip
        log = tmp_path / "router.log"
        command = [sys.executable, "-m", "bergstream", "router", "run", "--pattern", rf"{prefix}\..*",
                   "--defaults", str(defaults), "--topics-dir", str(tmp_path / "no-files")]  # fmt: skip
        sent = batch(1)
        with log.open("ab") as out:
            router = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

        def archived() -> float:
            """Records archived and committed (a topic's records are written only when it commits)."""
            try:
                return scrape(port).get("bergstream_router_records_archived_total", 0.0)
            except OSError:
                return 0.0

        def pending() -> float:
            try:
                return scrape(port).get("bergstream_router_pending_records", 0.0)
            except OSError:
                return 0.0

        def retrying_topics() -> int:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                families = text_string_to_metric_families(answer.read().decode())
            return len({
                sample.labels["topic"] for family in families for sample in family.samples
                if sample.name == "bergstream_router_commit_retries_total" and sample.value > 0
            })  # fmt: skip

        try:
            # The records of all three topics wait when the query starts, so its first batch holds them
            # all; the catalog goes down once the query runs (its tables are made), before that batch
            # commits: a batch's job takes over a second.
            eventually(lambda: log.exists() and "started: query" in log.read_text(), "the query to start",
                       timeout=240, every=0.1)  # fmt: skip
            if target_lag is not None:
                # On a target lag, the catalog goes down while the first batch's ranges are unread: their
                # read and commit, due on the lag, wait for it.
                eventually(lambda: pending() == 900, "every topic's records unread", timeout=240, every=0.1)
            postgres.stop(mode="immediate")
            # Each topic of the batch waits for the catalog on its own, as many at once as the driver's
            # cores (parallel_topics): two here.
            eventually(lambda: retrying_topics() >= (1 if target_lag else 2), "the topics retrying commits")
            assert archived() == 0, "nothing can be committed while the catalog is down"
            postgres.start()
            eventually(lambda: archived() == 900, "the records of the outage archived", timeout=180)
            for topic, offsets in batch(10).items():
                sent[topic] |= offsets
            eventually(lambda: archived() == 1800, "the records after it archived", timeout=180)
        finally:
            router.send_signal(signal.SIGTERM)
            router.wait(120)
        output = log.read_text()
        assert router.returncode == 0, output[-3000:]
        # The batch's write together failed, each topic alone waited for the catalog.
        assert "alone now" in output and RECOVERY_LINE in output, output[-3000:]
        for topic in topics:
            seen = archived_offsets(Services(stack.bootstrap_servers, catalog, None), table_for_topic(topic))
            assert len(seen) == len(set(seen)), (
                f"{topic}: {len(seen) - len(set(seen))} offsets archived twice"
            )
            assert set(seen) == sent[topic], f"{topic}: {len(sent[topic] - set(seen))} offsets lost"


@contextmanager
def small_filesystem(path: Path, size_mb: int) -> Iterator[None]:
    """A tmpfs of its own at `path`, which the test can fill up or make read-only."""
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount(path: Path, mode: str) -> None:
    # A write in flight makes a read-only remount busy for a moment.
    for _ in range(50):
        if subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=False).returncode == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"could not remount {path} {mode}")


def fill(path: Path) -> None:
    with path.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * (1 << 20))
        except OSError:  # No space left on device
            pass


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs for the warehouse needs root")
def test_a_warehouse_read_only_then_full_loses_and_repeats_nothing(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    catalog = CatalogConfig.sqlite(tmp_path / "catalog.db", warehouse)

    def batch(seed: int) -> set[tuple[int, int]]:
        request = ProduceRequest(topic=topic_name, schema="impression", encoding="avro", count=1500,
                                 bad_fraction=0.02, partitions=2, seed=seed)  # fmt: skip
        return produced_offsets(produce(request, stack.bootstrap_servers, show_progress=False).offsets)

    with small_filesystem(warehouse, size_mb=64):
        offsets = batch(1)
        router = RunningRouter(stack, topic_name, tmp_path, catalog, schema="impression", encoding="avro")
        try:
            eventually(lambda: router.handled() == 1500, "the first 1,500 records archived")

            def outage(what: str, begin: Callable[[], None], end: Callable[[], None], seed: int) -> None:
                retries = router.metric("bergstream_router_commit_retries_total")
                begin()
                offsets.update(batch(seed))
                # Four attempts failed: waits of 0.5, 1 and 2 s, and the router waits at the cap of 4 s.
                eventually(
                    lambda: router.metric("bergstream_router_commit_retries_total") >= retries + 4,
                    f"retries while the warehouse is {what}",
                )
                assert router.metric("bergstream_router_commit_outage_seconds") >= 0.5 + 1 + 2
                end()
                eventually(lambda: router.handled() == 1500 * seed, f"the records of the {what} outage")

            filler = warehouse / "filler"
            outage("read-only", lambda: remount(warehouse, "ro"), lambda: remount(warehouse, "rw"), seed=2)
            outage("full", lambda: fill(filler), filler.unlink, seed=3)
            assert router.metric("bergstream_router_records_dead_lettered_total") < 0.05 * 4500
        finally:
            router.stop()
        reasons = " ".join(router.log_lines(OUTAGE_LINE))
        assert "Read-only file system" in reasons and "No space left on device" in reasons, reasons[-2000:]
        seen = archived_offsets(Services(stack.bootstrap_servers, catalog, None), topic_name)
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} offsets archived more than once"
    assert set(seen) == offsets, f"{len(offsets - set(seen))} offsets lost"


def test_backoff_doubles_up_to_its_cap() -> None:
    delays = CommitRetrySettings(initial_backoff_seconds=0.5, max_backoff_seconds=4).delays()
    assert [next(delays) for _ in range(7)] == [0.5, 1, 2, 4, 4, 4, 4]


def cause(*classes: str, message: str = "", sql_state: str | None = None) -> JavaCause:
    return JavaCause(classes, message, sql_state)


def test_outages_are_told_from_errors_no_wait_mends() -> None:
    runtime = ("java.lang.RuntimeException", "java.lang.Exception")
    database_down = [
        cause("org.apache.iceberg.jdbc.UncheckedSQLException", *runtime, message="Failed to get table"),
        cause(
            "org.postgresql.util.PSQLException",
            "java.sql.SQLException",
            sql_state="08001",
            message="Connection to 127.0.0.1:5432 refused.",
        ),
        cause("java.net.ConnectException", "java.io.IOException", message="Connection refused"),
    ]
    assert transient_reason(database_down) == "ConnectException: Connection refused"
    read_only = [
        cause("org.apache.spark.SparkException", *runtime, message="Job aborted due to stage failure"),
        cause("java.io.UncheckedIOException", *runtime, message="Failed to create Parquet file"),
        cause("java.io.FileNotFoundException", "java.io.IOException", message="/w/x (Read-only file system)"),
    ]
    assert transient_reason(read_only) == "FileNotFoundException: /w/x (Read-only file system)"
    starting_up = [cause("org.postgresql.util.PSQLException", "java.sql.SQLException", sql_state="57P03",
                         message="the database system is starting up")]  # fmt: skip
    assert transient_reason(starting_up) == "PSQLException: the database system is starting up"
    schema_refused = [
        cause("org.apache.spark.sql.AnalysisException", "java.lang.Exception", message="Cannot write"),
        cause("org.postgresql.util.PSQLException", "java.sql.SQLException", sql_state="42P01", message="x"),
    ]
    assert transient_reason(schema_refused) is None
    assert transient_reason([]) is None


def test_kafka_out_is_told_from_a_topics_own_failure() -> None:
    errors = "org.apache.kafka.common.errors."
    kafka = (f"{errors}ApiException", "org.apache.kafka.common.KafkaException", "java.lang.RuntimeException")
    brokers_out = [
        cause("java.util.concurrent.ExecutionException", "java.lang.Exception", message="x"),
        cause(f"{errors}TimeoutException", f"{errors}RetriableException", *kafka, message="Timed out: nodes"),
    ]
    assert kafka_unavailable(brokers_out) == "TimeoutException: Timed out: nodes"
    # Kafka refusing for good, or no Kafka error at all: no wait on Kafka mends it.
    refused = [cause(f"{errors}TopicAuthorizationException", f"{errors}AuthorizationException", *kafka)]
    assert kafka_unavailable(refused) is None
    assert kafka_unavailable([cause("java.net.ConnectException", "java.io.IOException")]) is None
