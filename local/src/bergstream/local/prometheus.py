"""A Prometheus server on 127.0.0.1, from the machine's Prometheus binary, scraping given targets."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bergstream.errors import MissingToolError, StackError
from bergstream.local import processes


@dataclass(frozen=True)
class PrometheusServer:
    url: str

    def query(self, expression: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expression})}"
        with urllib.request.urlopen(address, timeout=10) as answer:
            body = json.load(answer)
        if body.get("status") != "success":
            raise StackError(f"Prometheus query {expression!r} failed: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def value(self, expression: str) -> float | None:
        result = self.query(expression)
        return float(result[0]["value"][1]) if result else None


def spark_scrape_configs(targets: list[str]) -> list[dict[str, Any]]:
    """Prometheus's jobs for the metrics a router's Spark UI serves (SPARK_PROMETHEUS_CONF, in
    router/driver/launch.py)."""
    return [
        {"job_name": job, "metrics_path": path, "static_configs": [{"targets": targets}]}
        for job, path in (("spark-driver", "/metrics/prometheus"),
                          ("spark-executors", "/metrics/executors/prometheus"))
    ]  # fmt: skip


@contextmanager
def prometheus_server(
    targets: list[str],
    scrape_interval: str = "1s",
    rules: Path | None = None,
    port: int | None = None,
    spark_targets: list[str] | None = None,
) -> Iterator[PrometheusServer]:
    """Prometheus scraping `targets` as the job bergstream-router, and the Spark UIs of `spark_targets` as
    the jobs spark-driver and spark-executors, with the alert `rules` file if given, on `port` (a free one by
    default), until the block ends."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise MissingToolError("'prometheus' was not found; install it (Debian: apt-get install prometheus)")
    if port is None:
        (port,) = processes.free_ports(1)
    elif processes.port_in_use("127.0.0.1", port):
        raise StackError(f"port {port} on 127.0.0.1 is already in use; choose another with --port")
    home = Path(tempfile.mkdtemp(prefix="bergstream-prometheus-"))
    config: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [{"job_name": "bergstream-router", "static_configs": [{"targets": targets}]}],
    }
    if spark_targets:
        config["scrape_configs"] += spark_scrape_configs(spark_targets)
    if rules is not None:
        shutil.copy(rules, home / "alerts.yml")
        config["rule_files"] = ["alerts.yml"]
    (home / "prometheus.yml").write_text(yaml.safe_dump(config))
    command = [
        binary, f"--config.file={home / 'prometheus.yml'}", f"--storage.tsdb.path={home / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]  # fmt: skip
    with (home / "prometheus.log").open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = PrometheusServer(f"http://127.0.0.1:{port}")
    try:
        processes.wait_until_answers(
            "Prometheus", f"{server.url}/-/ready", process, home / "prometheus.log", 60, any_status=False
        )
        yield server
    finally:
        processes.stop(process.pid, grace_seconds=10)
        process.wait()
        shutil.rmtree(home, ignore_errors=True)
