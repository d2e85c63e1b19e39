"""The router's metrics, scraped by a real Prometheus while the router runs."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local.processes import free_ports
from bergstream.local.prometheus import prometheus_server
from deploy import grafana
from tests.routers import ROOT, eventually, start_router, write_config
from tests.services import Services

pytestmark = pytest.mark.integration


def test_prometheus_sees_reads_archives_dead_letters_and_lag(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    (port,) = free_ports(1)
    config = write_config(
        stack, tmp_path, topic_name, metrics_port=port, metrics_host="127.0.0.1", lag_refresh_seconds=1
    )
    request = ProduceRequest(topic=topic_name, schema="playback", count=3000, bad_fraction=0.02, partitions=2)
    first = produce(request, stack.bootstrap_servers, show_progress=False)
    router = start_router(topic_name, config, tmp_path / "router.log")
    try:
        with prometheus_server([f"127.0.0.1:{port}"]) as prometheus:
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
            assert prometheus.value(f"bergstream_router_lag_seconds{{{topic}}}") is not None

            more = ProduceRequest(topic=topic_name, schema="playback", count=500, seed=9)
            produce(more, stack.bootstrap_servers, show_progress=False)
            eventually(lambda: total("records_read_total") == 3500, "500 more records read")
            eventually(lambda: total("lag_offsets") == 0, "the lag back to zero")
            per_partition = prometheus.query(f"bergstream_router_records_read_total{{{topic}}}")
            assert {sample["metric"]["partition"] for sample in per_partition} == {"0", "1"}

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


def test_alert_rules_and_scrape_config_are_valid() -> None:
    done = subprocess.run(
        ["promtool", "check", "config", str(ROOT / "deploy" / "prometheus" / "prometheus.yml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 6 rules found" in done.stdout + done.stderr


def test_the_dashboard_file_is_rendered_from_its_source() -> None:
    assert json.loads(grafana.DASHBOARD.read_text()) == grafana.dashboard()
    panels = json.loads(grafana.DASHBOARD.read_text())["panels"]
    assert [t["expr"] for p in panels for t in p["targets"]] == grafana.queries()
    assert all('topic=~"$topic"' in expression for expression in grafana.queries())


def test_a_taken_metrics_port_is_refused_with_the_port_named() -> None:
    import socket

    from bergstream.errors import BergstreamError
    from router.metrics import RouterMetrics

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BergstreamError, match=f"127.0.0.1:{port}.*--metrics-port"):
            RouterMetrics("playback").serve(port, "127.0.0.1")
