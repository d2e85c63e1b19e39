"""The router's Prometheus metrics, served by the driver."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)

from bergstream.errors import BergstreamError

_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_MAINTENANCE_SECONDS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)
# The lag series' labels: kafka-lag-exporter's `group` and `cluster_name` beside the topic and partition.
_LAG_LABELS = ("topic", "partition", "group", "cluster_name")


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


class RouterMetrics:
    def __init__(self, topic: str, registry: CollectorRegistry | None = None) -> None:
        self.topic = topic
        self._server: WSGIServer | None = None
        if registry is None:
            # The driver's own registry, with what Prometheus's default one holds: the process (CPU, memory,
            # open files), Python's garbage collector and version, and which bergstream this is.
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
            build = Info(
                "bergstream_build", "The bergstream, PySpark and Python of this driver", registry=registry
            )
            build.info({"version": _version("bergstream"), "pyspark": _version("pyspark"),
                        "python": platform.python_version()})  # fmt: skip
        self.registry = registry
        r = self.registry
        self.records_read = Counter(
            "bergstream_router_records_read", "Records read from Kafka", ["topic", "partition"], registry=r
        )
        self.records_archived = Counter(
            "bergstream_router_records_archived", "Rows appended to the archive table", ["topic"], registry=r
        )
        self.records_dead_lettered = Counter(
            "bergstream_router_records_dead_lettered",
            "Rows appended to the dead-letter table",
            ["topic"],
            registry=r,
        )
        self.batches = Counter(
            "bergstream_router_batches",
            "Micro-batches processed; outcome=replayed when the batch was already committed",
            ["topic", "outcome"],
            registry=r,
        )
        self.batch_duration = Histogram(
            "bergstream_router_batch_duration_seconds", "Time to process one micro-batch", ["topic"],
            buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.commit_latency = Histogram(
            "bergstream_router_commit_latency_seconds", "Time to write and commit one table's append",
            ["topic", "table"], buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.files_written = Counter(
            "bergstream_router_files_written", "Data files committed", ["topic", "table"], registry=r
        )
        self.bytes_written = Counter(
            "bergstream_router_bytes_written", "Bytes of data files committed", ["topic", "table"], registry=r
        )
        self.lag_offsets = Gauge(
            "bergstream_router_lag_offsets",
            "Records in Kafka not yet archived",
            _LAG_LABELS,
            registry=r,
        )
        self.lag_seconds = Gauge(
            "bergstream_router_lag_seconds",
            "How long the first record not yet archived has waited since it was produced; 0 when all is "
            "archived",
            _LAG_LABELS,
            registry=r,
        )
        self.unstable_offsets = Gauge(
            "bergstream_router_unstable_offsets",
            "Records past the last stable offset, which a router reading committed records cannot read yet: "
            "in transactions still open, or behind one",
            ["topic", "partition"],
            registry=r,
        )
        self.last_stable_offset = Gauge(
            "bergstream_router_last_stable_offset",
            "The partition's last stable offset: where a router reading committed records can read up to",
            ["topic", "partition"],
            registry=r,
        )
        self.newest_ingestion = Gauge(
            "bergstream_router_newest_ingestion_timestamp_seconds",
            "Newest Kafka record timestamp committed to the archive",
            ["topic"],
            registry=r,
        )
        self.newest_archived_age = Gauge(
            "bergstream_router_newest_archived_age_seconds",
            "Now minus the newest Kafka record timestamp committed to the archive; grows on a quiet topic",
            ["topic"],
            registry=r,
        )
        self.expired_offsets = Counter(
            "bergstream_router_expired_offsets",
            "Offsets deleted from Kafka before the router read them",
            ["topic", "partition"],
            registry=r,
        )
        self.commit_retries = Counter(
            "bergstream_router_commit_retries",
            "Appends tried again because the catalog or the warehouse was unavailable",
            ["topic", "table"],
            registry=r,
        )
        self.commit_outage = Gauge(
            "bergstream_router_commit_outage_seconds",
            "Seconds since commits began failing on an unavailable catalog or warehouse; 0 when they succeed",
            ["topic"],
            registry=r,
        )
        self.last_batch = Gauge(
            "bergstream_router_last_committed_batch",
            "Id of the newest committed micro-batch",
            ["topic"],
            registry=r,
        )

        # What a topic on a target lag has not read yet (router/driver/unread.py).
        self.pending_records = Gauge(
            "bergstream_router_pending_records",
            "Offsets the query passed and the topic has not read yet: it is read when its commit is due",
            ["topic"],
            registry=r,
        )
        self.pending_bytes = Gauge(
            "bergstream_router_pending_bytes", "The offsets not read yet, by the size of the topic's records",
            ["topic"],
            registry=r,
        )  # fmt: skip
        self.pending_oldest = Gauge(
            "bergstream_router_pending_oldest_timestamp_seconds",
            "When the query met the oldest records not read yet (they are at most a batch older); 0: none",
            ["topic"],
            registry=r,
        )
        self.pending_since = Gauge(
            "bergstream_router_pending_since_timestamp_seconds",
            "When the query met the first of the records not read yet; 0 when none is",
            ["topic"],
            registry=r,
        )
        self.target_lag = Gauge(
            "bergstream_router_target_lag_seconds",
            "The topic's target lag: it is read and committed before its oldest record not read is older; "
            "0 when it commits every batch",
            ["topic"],
            registry=r,
        )
        self.pending_commits = Counter(
            "bergstream_router_commits",
            "Commits of a topic's tables, by why: every batch (no target lag), lag, size, drain (the query "
            "ends), left (the topic left the query), first (a range starting by name) or restart (files a "
            "driver of an earlier version left pending)",
            ["topic", "reason"],
            registry=r,
        )
        self.metadata_bytes = Gauge(
            "bergstream_router_table_metadata_bytes",
            "Size of the table's current metadata file, which every commit writes whole",
            ["topic", "table"],
            registry=r,
        )

        self.maintenance_runs = Counter(
            "bergstream_router_maintenance_runs",
            "Maintenance runs inside the router (--maintain-every); outcome=failed when one did not finish",
            ["topic", "outcome"],
            registry=r,
        )
        self.maintenance_duration = Histogram(
            "bergstream_router_maintenance_duration_seconds", "Time one maintenance run took", ["topic"],
            buckets=_MAINTENANCE_SECONDS, registry=r,
        )  # fmt: skip
        self.maintenance_last_success = Gauge(
            "bergstream_router_maintenance_last_success_timestamp_seconds",
            "When the last maintenance run inside the router finished without error",
            ["topic"],
            registry=r,
        )
        self.maintenance_expired_snapshots = Counter(
            "bergstream_router_maintenance_expired_snapshots",
            "Snapshots expired by maintenance inside the router",
            ["topic", "table"],
            registry=r,
        )

        self.maintenance_backfill_held_snapshots = Gauge(
            "bergstream_router_maintenance_backfill_held_snapshots",
            "Snapshots past the retention that expiry kept because backfills hold them (the log names them)",
            ["topic", "table"],
            registry=r,
        )

        # Per topic: whether it is archived now, and what failed it (router/driver).
        self.topic_up = Gauge(
            "bergstream_router_topic_up",
            "1 while the topic is archived by a running query; 0 while its query is down, or while it is "
            "dead-lettered whole (its settings do not load, its schema is not found)",
            ["topic"],
            registry=r,
        )
        self.topic_restarts = Counter(
            "bergstream_router_topic_restarts",
            "Times the topic was archived again after a failure: its query started again, or its settings "
            "loaded again after it was dead-lettered whole",
            ["topic"],
            registry=r,
        )
        self.topic_failures = Counter(
            "bergstream_router_topic_failures",
            "Failures of the topic's archive, by what failed: settings (dead-lettered whole), start or query",
            ["topic", "stage"],
            registry=r,
        )

    def serve(self, port: int, host: str) -> int:
        """Serve /metrics; returns the port (useful when 0 asked for any free one)."""
        try:
            server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
            raise BergstreamError(
                f"cannot serve the metrics of {self.topic} on {host}:{port}: {error.strerror}; "
                "choose another with --metrics-port or metrics_port"
            ) from error
        self._server = server
        bound: int = server.server_port
        return bound

    def close(self) -> None:
        """Stop serving /metrics: the driver's run ended (its process may go on, as a test's does)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
