"""`bergstream local prometheus`: the machine's Prometheus scraping routers, with bergstream's alerts."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from bergstream.deploy import ALERT_RULES
from bergstream.local.processes import free_ports

ROOT = Path(__file__).resolve().parent.parent


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as answer:
        body: dict[str, Any] = json.load(answer)
    return body


def test_local_prometheus_scrapes_its_targets_with_the_alert_rules(tmp_path: Path) -> None:
    metrics_port, prometheus_port = free_ports(2)
    registry = CollectorRegistry()
    lag = Gauge("bergstream_router_lag_seconds", "time lag", ["topic", "partition"], registry=registry)
    lag.labels("playback", "0").set(42.0)
    server, _thread = start_http_server(metrics_port, addr="127.0.0.1", registry=registry)
    command = [
        sys.executable, "-m", "bergstream", "local", "prometheus", "--target", f"127.0.0.1:{metrics_port}",
        "--port", str(prometheus_port), "--scrape-interval", "1s",
    ]  # fmt: skip
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{prometheus_port}"
    try:
        deadline, value = time.monotonic() + 60, None
        while value is None:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "Prometheus scraped nothing in 60 s"
            time.sleep(0.5)
            try:
                result = _get(f"{url}/api/v1/query?query=bergstream_router_lag_seconds")["data"]["result"]
            except OSError:
                continue
            value = float(result[0]["value"][1]) if result else None
        assert value == 42.0
        groups = _get(f"{url}/api/v1/rules")["data"]["groups"]
        loaded = {rule["name"] for group in groups for rule in group["rules"]}
        expected = {
            rule["alert"]
            for group in yaml.safe_load((ALERT_RULES).read_text())["groups"]
            for rule in group["rules"]
        }
        assert loaded == expected and expected
    finally:
        # As a supervisor stops it; Prometheus is in a session of its own, so it is the command that stops it.
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        server.shutdown()
    # Stopped with the command: nothing answers on its port any more.
    try:
        urllib.request.urlopen(f"{url}/-/ready", timeout=2)
        raise AssertionError("Prometheus still answers after Ctrl-C")
    except OSError:
        pass
