"""(e) Apache Iceberg's Kafka Connect sink, run as a standalone Kafka Connect worker on this machine.

The worker's classpath is the `kafka-connect` jar set; the sink and what it needs at runtime (Parquet,
Hadoop's client, the catalog's JDBC driver) are its plugin, from the `iceberg-kafka-connect` set. Values
are schemaless JSON; Kafka's InsertField transform adds the record timestamp as the `timestamp` column,
into a table created beforehand with the layout of (d).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench.router.plain import TIMESTAMP
from bergstream import jars
from bergstream.catalog import CatalogConfig
from bergstream.errors import BergstreamError, require_tool
from bergstream.kafka_topics import ensure_topic
from bergstream.local import processes

WORKER_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"
SINK_CLASS = "org.apache.iceberg.connect.IcebergSinkConnector"
LOG4J_CONFIG = Path(__file__).parent / "connect-log4j2.properties"


class ConnectError(BergstreamError):
    """The Kafka Connect worker or the sink failed; the message names the connector and the worker's log."""


@dataclass(frozen=True)
class SinkSpec:
    """One Iceberg sink connector: a topic into a table, committed every `commit_interval_ms`."""

    name: str
    topic: str
    table: str  # namespace.table
    commit_interval_ms: int
    tasks: int

    @property
    def control_topic(self) -> str:
        # Each connector needs a control topic of its own.
        return f"{self.name}-control"


def sink_properties(spec: SinkSpec, catalog: CatalogConfig, bootstrap: str) -> dict[str, str]:
    if catalog.type != "jdbc":
        raise ConnectError(
            f"connector {spec.name}: the bench runs Iceberg's sink on a JDBC catalog only, not {catalog.type}"
        )
    properties = {
        "name": spec.name,
        "connector.class": SINK_CLASS,
        "tasks.max": str(spec.tasks),
        "topics": spec.topic,
        "iceberg.tables": spec.table,
        # The JDBC catalog keeps tables under the catalog's name: the same name as Spark's catalog.
        "iceberg.catalog": catalog.name,
        "iceberg.catalog.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
        "iceberg.catalog.uri": catalog.uri,
        "iceberg.catalog.warehouse": catalog.warehouse,
        "iceberg.catalog.jdbc.schema-version": "V1",
        "iceberg.control.topic": spec.control_topic,
        "iceberg.control.commit.interval-ms": str(spec.commit_interval_ms),
        # The sink reads the worker's Kafka settings from its command line when it can; said here too.
        "iceberg.kafka.bootstrap.servers": bootstrap,
        "transforms": "kafkaTimestamp",
        "transforms.kafkaTimestamp.type": "org.apache.kafka.connect.transforms.InsertField$Value",
        "transforms.kafkaTimestamp.timestamp.field": TIMESTAMP,
    }
    for key, value in catalog.properties.items():
        properties[f"iceberg.catalog.{key}"] = value
    if catalog.user is not None:
        properties["iceberg.catalog.jdbc.user"] = catalog.user
    if catalog.password is not None:
        properties["iceberg.catalog.jdbc.password"] = catalog.password.get_secret_value()
    return properties


def worker_properties(
    bootstrap: str, rest_port: int, home: Path, plugins: Path, commit_interval_ms: int
) -> dict[str, str]:
    return {
        "bootstrap.servers": bootstrap,
        # A sink task sees the sink's control topic only when its consumer's poll returns, and on an idle
        # topic the poll waits for the next offset flush: at the default 60 s, the last commit of a drained
        # backlog waits up to a minute. Flushing on the commit interval keeps the coordinator's rounds short.
        "offset.flush.interval.ms": str(commit_interval_ms),
        "listeners": f"http://127.0.0.1:{rest_port}",
        "plugin.path": str(plugins),
        "offset.storage.file.filename": str(home / "connect.offsets"),
        # Keys are not written to the table: passed through as bytes, never parsed.
        "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
    }


def write_properties(path: Path, properties: dict[str, str]) -> Path:
    path.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
    return path


def plugin_folder(home: Path) -> Path:
    """plugin.path: one folder, the sink's plugin, linking the resolved jars."""
    plugins = home / "plugins"
    plugin = plugins / "iceberg-kafka-connect"
    plugin.mkdir(parents=True, exist_ok=True)
    for jar in jars.resolved_jars("iceberg-kafka-connect"):
        (plugin / jar.name).symlink_to(jar)
    return plugins


class ConnectWorker:
    """A standalone Kafka Connect worker, started with its first connector, given more over its REST API."""

    def __init__(self, home: Path, bootstrap: str, catalog: CatalogConfig) -> None:
        self.home = home
        self.bootstrap = bootstrap
        self.catalog = catalog
        self.log_file = home / "connect-worker.log"
        self.pid: int | None = None
        (self.rest_port,) = processes.free_ports(1)
        self.url = processes.http_url("127.0.0.1", self.rest_port)

    def start(self, first: SinkSpec, timeout: float = 180) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        worker = write_properties(
            self.home / "worker.properties",
            worker_properties(
                self.bootstrap, self.rest_port, self.home, plugin_folder(self.home), first.commit_interval_ms
            ),
        )
        self._create_control_topic(first)
        connector = write_properties(
            self.home / f"{first.name}.properties", sink_properties(first, self.catalog, self.bootstrap)
        )
        classpath = os.pathsep.join(str(jar) for jar in jars.resolved_jars("kafka-connect"))
        command = [
            require_tool("java", "run the Kafka Connect worker (install OpenJDK 17 or newer)"),
            "-Xmx2g", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "-cp", classpath, WORKER_CLASS, str(worker), str(connector),
        ]  # fmt: skip
        print(f"(e) starting the Kafka Connect worker on {self.url}, log {self.log_file}")

        def ready(process: subprocess.Popen[bytes]) -> None:
            processes.wait_until_answers(
                "the Kafka Connect worker", f"{self.url}/connectors", process, self.log_file, timeout
            )
            self.pid = process.pid
            self.wait_running(first.name, timeout)

        processes.start_server(command, dict(os.environ), self.log_file, self.home / "connect.pid", ready)

    def _create_control_topic(self, spec: SinkSpec) -> None:
        ensure_topic({"bootstrap.servers": self.bootstrap}, spec.control_topic, 1)

    def _request(self, method: str, path: str, body: dict[str, str] | None = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            raise ConnectError(
                f"the Kafka Connect worker answered {method} {path} with {error.code}: "
                f"{error.read().decode(errors='replace')[:300]} (see {self.log_file})"
            ) from error
        return json.loads(text) if text else None

    def put(self, spec: SinkSpec, timeout: float = 120) -> None:
        """Create the connector `spec` (its control topic first) and wait until its tasks run."""
        self._create_control_topic(spec)
        properties = sink_properties(spec, self.catalog, self.bootstrap)
        write_properties(self.home / f"{spec.name}.properties", properties)
        self._request("PUT", f"/connectors/{spec.name}/config", properties)
        self.wait_running(spec.name, timeout)

    def delete(self, name: str) -> None:
        self._request("DELETE", f"/connectors/{name}")

    def failure(self, name: str) -> str | None:
        """Why the connector or one of its tasks failed; None while all run."""
        status = self._request("GET", f"/connectors/{name}/status")
        assert isinstance(status, dict)
        for part in (status["connector"], *status["tasks"]):
            if part["state"] == "FAILED":
                return str(part.get("trace", "no trace")).splitlines()[0][:300]
        return None

    def wait_running(self, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = self._request("GET", f"/connectors/{name}/status")
            except ConnectError:
                status = None  # not registered yet
            if isinstance(status, dict):
                failed = self.failure(name)
                if failed is not None:
                    raise ConnectError(f"connector {name} failed: {failed} (see {self.log_file})")
                states = [status["connector"]["state"], *(task["state"] for task in status["tasks"])]
                if status["tasks"] and all(state == "RUNNING" for state in states):
                    return
            if time.monotonic() > deadline:
                raise ConnectError(
                    f"connector {name} is not running after {timeout:.0f}s: "
                    f"{processes.last_error(self.log_file)} (see {self.log_file})"
                )
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the worker cleanly (SIGTERM: connectors stop, tasks close), killing it only if it hangs."""
        if self.pid is None:
            return
        if not processes.stop(self.pid, grace_seconds=60):
            raise ConnectError(f"the Kafka Connect worker (pid {self.pid}) did not stop; see {self.log_file}")
        self.pid = None
