"""The writers that bench/router compares, each run the same two ways: draining the topic's backlog into a
table, and running on a 1-second trigger (or commit interval) while events arrive at a steady rate.

  (b) the router                         bergstream's archive table, Spark in this process
  (u) the router reading uncommitted     the same, with kafka.isolation.level read_uncommitted (Spark's
                                         default): what reading committed records alone costs
  (d) the plain Spark job (plain.py)     the event and the Kafka timestamp, Spark in this process
  (e) Iceberg's Kafka Connect sink       the same table layout as (d), a Kafka Connect worker (connect.py)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from bench.router.connect import ConnectWorker, SinkSpec
from bench.router.cpu import CpuClock
from bench.router.plain import TIMESTAMP, create_plain_table, start_plain_job
from bench.stack import topic_query
from bergstream.catalog import CatalogConfig
from bergstream.errors import BergstreamError
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.router.driver.query import TopicsQuery
from bergstream.schemas.archive import INGESTION_TS, METADATA

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

TRIGGER = "1 second"
TRIGGER_MS = 1000
NAMESPACE = "archive"


def committed_rows(catalog: CatalogConfig, table: str) -> int:
    """Rows in the table's current snapshot, from its summary."""
    snapshot = catalog.load().load_table(f"{NAMESPACE}.{table}").current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary["total-records"] or 0)


def wait_for_rows(catalog: CatalogConfig, table: str, expected: int, timeout: float, what: str) -> float:
    """Poll until the table holds `expected` rows; the monotonic time it first did."""
    deadline = time.monotonic() + timeout
    while True:
        rows = committed_rows(catalog, table)
        if rows >= expected:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise BergstreamError(
                f"{what}: table {NAMESPACE}.{table} holds {rows:,} of {expected:,} rows after {timeout:.0f}s"
            )
        time.sleep(0.2)


def _wait_for_progress(spark: SparkSession, what: str, timeout: float = 120) -> None:
    """Until a streaming query of the session has reported a trigger: it reads the topic."""
    deadline = time.monotonic() + timeout
    while not any(query.recentProgress for query in spark.streams.active):
        if time.monotonic() > deadline:
            raise BergstreamError(f"{what} reported no progress within {timeout:.0f}s")
        time.sleep(0.2)


class Peer(Protocol):
    key: str
    label: str
    stamp: tuple[str, ...]  # where the Kafka timestamp is in the table

    def cpu(self) -> CpuClock: ...

    def drain(self, topic: str, table: str, events: int) -> None:
        """Write what `topic` holds (`events` records) into `table`; return once it is committed."""

    def start(self, topic: str, table: str) -> None:
        """Start writing `topic` into `table` on the trigger; return once it reads the topic."""

    def stop(self) -> None:
        """Stop writing: after `start`, and after `drain` where the writer keeps running."""


@dataclass
class SparkSide:
    """What (b) and (d) share: one Spark session in this process, the topic's schema and limits."""

    spark: SparkSession
    catalog: CatalogConfig
    bootstrap: str
    schema_name: str
    encoding: Literal["json", "avro"]
    home: Path
    max_offsets_per_trigger: int


@dataclass
class RouterPeer:
    side: SparkSide
    key: str = "b"
    label: str = "(b) router"
    stamp: tuple[str, ...] = (METADATA, INGESTION_TS)
    isolation_level: str = "read_committed"
    _running: tuple[TopicsQuery, threading.Thread] | None = None

    def cpu(self) -> CpuClock:
        return CpuClock.spark_in_process()

    def config(self, topic: str, table: str, trigger: str = TRIGGER) -> RouterConfig:
        side = self.side
        return RouterConfig.flat(
            topic=topic,
            schema=side.schema_name,
            encoding=side.encoding,
            table=table,
            kafka={
                "kafka.bootstrap.servers": side.bootstrap,
                "startingOffsets": "earliest",
                "kafka.isolation.level": self.isolation_level,
            },
            checkpoint_location=str(side.home / "checkpoints" / table),
            catalog=side.catalog,
            max_offsets_per_trigger=side.max_offsets_per_trigger,
            trigger_interval=trigger,
        )

    def drain(self, topic: str, table: str, events: int) -> None:
        totals = archive_available_now(self.side.spark, self.config(topic, table))
        if totals.read != events:
            raise BergstreamError(f"{self.label} read {totals.read:,} records of {topic}, not {events:,}")

    def start(self, topic: str, table: str) -> None:
        config = self.config(topic, table)
        router = topic_query(self.side.spark, config)
        runner = threading.Thread(target=router.run, name=f"router-{topic}")
        runner.start()
        self._running = (router, runner)
        _wait_for_progress(self.side.spark, f"the router for {topic}")

    def stop(self) -> None:
        if self._running is not None:
            router, runner = self._running
            router.stop()
            runner.join()
            self._running = None


@dataclass
class PlainPeer:
    side: SparkSide
    key: str = "d"
    label: str = "(d) plain Spark job"
    stamp: tuple[str, ...] = (TIMESTAMP,)
    _query: StreamingQuery | None = None

    def cpu(self) -> CpuClock:
        return CpuClock.spark_in_process()

    def _start(self, topic: str, table: str, trigger: str | None) -> StreamingQuery:
        side = self.side
        identifier = side.catalog.table_identifier(table)
        create_plain_table(side.spark, identifier, side.schema_name)
        return start_plain_job(
            side.spark, side.bootstrap, topic, side.schema_name, side.encoding, identifier,
            side.home / "checkpoints" / table, side.max_offsets_per_trigger, trigger,
        )  # fmt: skip

    def drain(self, topic: str, table: str, events: int) -> None:
        self._start(topic, table, None).awaitTermination()
        rows = committed_rows(self.side.catalog, table)
        if rows != events:
            raise BergstreamError(f"(d) wrote {rows:,} rows of {topic} into {table}, not {events:,}")

    def start(self, topic: str, table: str) -> None:
        self._query = self._start(topic, table, TRIGGER)
        _wait_for_progress(self.side.spark, f"the plain job on {topic}")

    def stop(self) -> None:
        if self._query is not None:
            self._query.stop()
            self._query = None


@dataclass
class ConnectPeer:
    """Iceberg's sink in one worker, started with the first connector; each run is a connector of its own,
    removed when the run ends. Tables are created through Spark, as for (d)."""

    side: SparkSide
    tasks: int
    key: str = "e"
    label: str = "(e) Iceberg Kafka Connect sink"
    stamp: tuple[str, ...] = (TIMESTAMP,)
    worker: ConnectWorker | None = None
    _connectors: list[str] = field(default_factory=list)

    def cpu(self) -> CpuClock:
        if self.worker is None or self.worker.pid is None:
            raise BergstreamError("the Kafka Connect worker is not running")
        return CpuClock((self.worker.pid,))

    def _connector(self, topic: str, table: str) -> str:
        side = self.side
        create_plain_table(side.spark, side.catalog.table_identifier(table), side.schema_name)
        spec = SinkSpec(
            f"iceberg-{table}".replace("_", "-"), topic, f"{NAMESPACE}.{table}", TRIGGER_MS, self.tasks
        )
        if self.worker is None:
            self.worker = ConnectWorker(side.home / "connect", side.bootstrap, side.catalog)
            self.worker.start(spec)
        else:
            self.worker.put(spec)
        self._connectors.append(spec.name)
        return spec.name

    def _check(self, name: str) -> None:
        assert self.worker is not None
        failed = self.worker.failure(name)
        if failed is not None:
            raise BergstreamError(f"(e) connector {name} failed: {failed} (see {self.worker.log_file})")

    def drain(self, topic: str, table: str, events: int) -> None:
        name = self._connector(topic, table)
        deadline = time.monotonic() + 1800
        while committed_rows(self.side.catalog, table) < events:
            self._check(name)
            if time.monotonic() > deadline:
                raise BergstreamError(f"(e) did not commit {events:,} rows of {topic} within 30 minutes")
            time.sleep(0.2)

    def start(self, topic: str, table: str) -> None:
        self._connector(topic, table)

    def stop(self) -> None:
        assert self.worker is not None
        while self._connectors:
            self.worker.delete(self._connectors.pop())

    def shut_down(self) -> None:
        if self.worker is not None:
            self.worker.stop()
