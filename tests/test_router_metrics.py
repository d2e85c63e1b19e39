"""The router's metrics, scraped by a real Prometheus while the router runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bergstream.deploy import PROMETHEUS_DIR, grafana
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local.processes import free_ports
from bergstream.local.prometheus import prometheus_server
from tests.routers import eventually, start_router, write_config
from tests.services import Services

pytestmark = pytest.mark.integration


def test_prometheus_sees_reads_archives_dead_letters_and_lag(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    port, ui_port = free_ports(2)
    spark = {
        "master": "local[2]",
        "conf": {"spark.ui.port": str(ui_port), "spark.sql.shuffle.partitions": "2"},
    }
    config = write_config(stack, tmp_path, topic_name, metrics_port=port, metrics_host="127.0.0.1",
                          lag_refresh_seconds=1, spark=spark)  # fmt: skip
    request = ProduceRequest(topic=topic_name, schema="playback", count=3000, bad_fraction=0.02, partitions=2)
    first = produce(request, stack.bootstrap_servers, show_progress=False)
    router = start_router(topic_name, config, tmp_path / "router.log")
    try:
        spark_ui = [f"127.0.0.1:{ui_port}"]
        with prometheus_server([f"127.0.0.1:{port}"], spark_targets=spark_ui) as prometheus:
            topic = f'topic="{topic_name}"'

            def total(metric: str) -> float:
                return prometheus.value(f"sum(bergstream_router_{metric}{{{topic}}})") or 0.0

            eventually(lambda: total("records_read_total") == 3000, "3,000 records read")
            bad = sum(first.malformed.values())
            assert total("records_dead_lettered_total") == bad
            assert total("records_archived_total") == 3000 - bad
            eventually(lambda: total("lag_offsets") == 0, "no lag once all is archived")
            assert total("files_written_total") > 0
            assert total("bytes_written_total") > 0
            assert total("batch_duration_seconds_count") >= 1
            assert total("commit_latency_seconds_count") >= 1
            caught_up = f"max(bergstream_router_lag_seconds{{{topic}}})"
            eventually(lambda: prometheus.value(caught_up) == 0, "no time lag once all is archived")
            assert (prometheus.value(f"bergstream_router_newest_archived_age_seconds{{{topic}}}") or 0) > 0

            more = ProduceRequest(topic=topic_name, schema="playback", count=500, seed=9)
            produce(more, stack.bootstrap_servers, show_progress=False)
            eventually(lambda: total("records_read_total") == 3500, "500 more records read")
            eventually(lambda: total("lag_offsets") == 0, "the lag back to zero")
            per_partition = prometheus.query(f"bergstream_router_records_read_total{{{topic}}}")
            assert {sample["metric"]["partition"] for sample in per_partition} == {"0", "1"}
            # The lag series join kafka-lag-exporter's on its labels: consumer group and cluster name.
            lags = prometheus.query(f"bergstream_router_lag_offsets{{{topic}}}")
            assert {
                (s["metric"]["partition"], s["metric"]["group"], s["metric"]["cluster_name"]) for s in lags
            } == {(partition, f"bergstream-router.{topic_name}", "test") for partition in ("0", "1")}

            # Spark's own metrics, scraped from the router's Spark UI: its streaming query's rates and the
            # executors' memory.
            query_name = f"bergstream-router-{topic_name}".replace("-", "_")
            prefix = f"metrics_bergstream_router_driver_spark_streaming_{query_name}_"
            streaming = f'{{job="spark-driver", __name__=~"{prefix}.*"}}'
            eventually(lambda: bool(prometheus.query(streaming)), "the router's streaming query's metrics")
            names = {sample["metric"]["__name__"] for sample in prometheus.query(streaming)}
            assert any("inputRate" in name for name in names), names
            executors = prometheus.query('{job="spark-executors", __name__=~"metrics_executor_.*"}')
            assert any(s["metric"]["__name__"] == "metrics_executor_memoryUsed_bytes" for s in executors), [
                s["metric"]["__name__"] for s in executors
            ]

            # Every panel of the Grafana dashboard answers from what this Prometheus scraped; only
            # expired offsets, which this router never met, have no series.
            for expression in grafana.queries():
                query = expression.replace("$topic", topic_name).replace("$__rate_interval", "30s")
                series = prometheus.query(query)
                assert series or "expired_offsets" in query, f"no series for {query}"
    finally:
        router.send_signal(signal.SIGINT)
        router.wait(120)
    assert router.returncode == 0, (tmp_path / "router.log").read_text()[-3000:]


def router_metrics(port: int, name: str) -> dict[str, float]:
    """{partition or "": value} of one metric, read from the router's own endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        sample.labels.get("partition", ""): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def spark_jvm(router: subprocess.Popen[bytes]) -> int:
    """The pid of the router's JVM, the child that runs Spark's driver."""
    children = psutil.Process(router.pid).children()
    for child in children:
        if "java" in " ".join(child.cmdline()):
            return child.pid
    raise AssertionError(f"router {router.pid} has no JVM among its children {children}")


def test_time_lag_dates_a_backlog_reads_zero_caught_up_and_grows_while_the_router_is_stuck(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    (port,) = free_ports(1)
    config = write_config(
        stack, tmp_path, topic_name, metrics_port=port, metrics_host="127.0.0.1", lag_refresh_seconds=1,
        max_offsets_per_trigger=500,
    )  # fmt: skip
    backlog = ProduceRequest(topic=topic_name, schema="playback", count=1000, partitions=2)
    produce(backlog, stack.bootstrap_servers, show_progress=False)
    produced_by = time.time()
    time.sleep(3)

    def behind() -> tuple[float, float]:
        """(records, seconds) behind, over all partitions."""
        records = sum(router_metrics(port, "bergstream_router_lag_offsets").values())
        return records, max(router_metrics(port, "bergstream_router_lag_seconds").values(), default=-1.0)

    router = start_router(topic_name, config, tmp_path / "router.log")
    try:
        # A backlog older than the router: dated by its records' timestamps, not by when the router came.
        readings: list[tuple[float, float, float]] = []

        def backlog_seen() -> bool:
            try:
                readings.append((time.time(), *behind()))
            except OSError:  # not serving yet
                return False
            return readings[-1][1] > 0 and readings[-1][2] >= 0

        eventually(backlog_seen, "a backlog in the lag metrics", every=0.3)
        at, records, seconds = readings[-1]
        assert records > 0
        assert seconds >= at - produced_by - 2, readings[-5:]

        # Caught up and quiet: nothing waits, however old the newest archived record is.
        eventually(lambda: behind() == (0, 0.0), "no lag, in records and in seconds", every=0.3)
        time.sleep(3)
        assert behind() == (0, 0.0)
        assert router_metrics(port, "bergstream_router_newest_archived_age_seconds")[""] >= 3

        # Stuck: the JVM stops, the driver's Python side goes on reading Kafka and serving metrics.
        jvm = spark_jvm(router)
        os.kill(jvm, signal.SIGSTOP)
        try:
            more = ProduceRequest(topic=topic_name, schema="playback", count=300, partitions=2, seed=3)
            produce(more, stack.bootstrap_servers, show_progress=False)
            eventually(lambda: behind()[0] == 300, "300 records behind", every=0.3)
            first = behind()[1]
            time.sleep(4)
            later = behind()[1]
            assert later >= first + 3, (first, later)
        finally:
            os.kill(jvm, signal.SIGCONT)
        eventually(lambda: behind() == (0, 0.0), "the lag back to zero once the JVM runs again", every=0.3)
    finally:
        router.send_signal(signal.SIGINT)
        router.wait(120)
    assert router.returncode == 0, (tmp_path / "router.log").read_text()[-3000:]


def test_alert_rules_and_scrape_config_are_valid(promtool: str) -> None:
    done = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS_DIR / "prometheus.yml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout + done.stderr


def test_every_alert_fires_and_stays_quiet_in_its_unit_tests(promtool: str) -> None:
    """promtool runs bergstream/deploy/prometheus/alerts.test.yml: a stuck router alerts, a quiet topic all
    archived does not, and so on for every alert of alerts.yml, each with a case that fires and one that
    does not."""
    folder = PROMETHEUS_DIR
    done = subprocess.run(
        [promtool, "test", "rules", "alerts.test.yml"],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    alerts = {
        rule["alert"]
        for group in yaml.safe_load((folder / "alerts.yml").read_text())["groups"]
        for rule in group["rules"]
    }
    cases = [
        case
        for test in yaml.safe_load((folder / "alerts.test.yml").read_text())["tests"]
        for case in test["alert_rule_test"]
    ]
    fired = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert alerts - fired == set(), "alerts never shown firing"
    assert alerts - quiet == set(), "alerts never shown quiet"


def test_the_dashboard_file_is_rendered_from_its_source() -> None:
    assert json.loads(grafana.DASHBOARD.read_text()) == grafana.dashboard()
    panels = json.loads(grafana.DASHBOARD.read_text())["panels"]
    assert [t["expr"] for p in panels for t in p["targets"]] == grafana.queries()
    assert all('topic=~"$topic"' in expression for expression in grafana.queries())


def test_a_taken_metrics_port_is_refused_with_the_port_named() -> None:
    import socket

    from bergstream.errors import BergstreamError
    from bergstream.router.metrics import RouterMetrics

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BergstreamError, match=f"127.0.0.1:{port}.*--metrics-port"):
            RouterMetrics("playback").serve(port, "127.0.0.1")


def test_the_driver_exports_its_process_gc_python_and_build_beside_the_routers_metrics() -> None:
    from importlib.metadata import version

    from prometheus_client import generate_latest

    from bergstream.router.metrics import RouterMetrics

    families = {family.name: family for family in text_string_to_metric_families(
        generate_latest(RouterMetrics("playback").registry).decode())}  # fmt: skip
    for name in (
        "process_resident_memory_bytes",
        "process_cpu_seconds",
        "python_gc_collections",
        "python_info",
    ):
        assert name in families, name
    (build,) = families["bergstream_build_info"].samples
    assert build.labels["version"] == version("bergstream") and build.value == 1
    assert build.labels["pyspark"] == version("pyspark")
    # A registry given by the caller is left as it is.
    from prometheus_client import CollectorRegistry

    assert (
        "process_cpu_seconds"
        not in generate_latest(RouterMetrics("playback", CollectorRegistry()).registry).decode()
    )
