"""`bergstream router run`: one Spark Structured Streaming query that archives one topic.

Each micro-batch is read, parsed, stamped, counted and appended to the archive table in one pass; the
records that do not parse are appended to the dead-letter table. Each append is idempotent per
(query, batch). After Spark checkpoints a batch, its end offsets are
committed to the consumer group `bergstream-router.<topic>`.
"""

from __future__ import annotations

import itertools
import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from bergstream.errors import BergstreamError
from bergstream.router.config import RouterConfig
from bergstream.router.consumer_group import GroupCommitter
from bergstream.router.counts import BatchCounts, count_batch, from_observation, observed_columns
from bergstream.router.evolve import evolve_metadata, evolve_table
from bergstream.router.lag import LagReporter
from bergstream.router.metrics import RouterMetrics
from bergstream.router.offsets import expired_ranges, parse_spark_offsets
from bergstream.router.registry_topic import topic_parser
from bergstream.router.retry import first_line, java_causes, transient_reason
from bergstream.router.schedule import MaintenanceSchedule, warn_of_long_history
from bergstream.router.table import ensure_tables, maintained_properties
from bergstream.router.transform import DEAD_LETTERED
from bergstream.router.write import Appended, BatchTableWriter, write_tasks_for
from bergstream.schemas.archive import (
    ENCODING_PROPERTIES,
    ENCODING_PROPERTY,
    SCHEMA_PROPERTY,
    SCHEMA_REGISTRY_PROPERTY,
    SUBJECT_PROPERTY,
    TOPIC_PROPERTY,
    ArchiveLayout,
)

log = logging.getLogger("bergstream.router")
T = TypeVar("T")

# Spark 4.1's Kafka source fails the progress report of a batch replayed from the offset log after a
# crash (SPARK-55271, a null Option in KafkaMicroBatchStream.metrics) once the batch itself has run and
# been committed. Starting the query again resumes normally; a few such restarts in a row are allowed.
_REPLAY_PROGRESS_FAILURE = 'because the return value of "scala.Option.get()" is null'
_REPLAY_RESTARTS = 3
# Spark's Kafka reader asks a partition's consumer for the partition's offset range after every poll, on the
# connection where the consumer's next fetch is already waiting at the end of the batch's range; the broker
# answers requests on a connection in order, so that fetch holds the answer back for fetch.max.wait.ms
# (500 ms by default) for every partition of every batch. The topic's file may still set its own.
SPARK_CONSUMER_DEFAULTS = {"kafka.fetch.max.wait.ms": "10"}


class RouterStopped(BergstreamError):
    """The streaming query failed; the message carries Spark's reason."""


@dataclass
class RouterTotals:
    batches: int = 0
    replayed_batches: int = 0
    read: int = 0
    archived: int = 0
    dead_lettered: int = 0
    files: int = 0
    bytes: int = 0
    expired: int = 0
    per_partition: dict[int, int] = field(default_factory=dict)

    def add(self, other: RouterTotals) -> None:
        """Count `other`'s batches and records in these totals too."""
        for name in ("batches", "replayed_batches", "read", "archived", "dead_lettered", "files", "bytes",
                     "expired"):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for partition, read in other.per_partition.items():
            self.per_partition[partition] = self.per_partition.get(partition, 0) + read

    def summary(self, topic: str) -> str:
        return (
            f"{topic}: {self.batches} batches ({self.replayed_batches} replayed), read {self.read:,}, "
            f"archived {self.archived:,}, dead-lettered {self.dead_lettered:,}, {self.files} files, "
            f"{self.bytes / 1e6:.1f} MB, {self.expired:,} offsets expired before they were read"
        )


class Router:
    def __init__(self, config: RouterConfig, spark: SparkSession, metrics: RouterMetrics) -> None:
        self.config = config
        self.spark = spark
        self.metrics = metrics
        self.totals = RouterTotals()
        self._counting = observed_columns(spark)
        self._query_started = threading.Event()
        self._stop_lag = threading.Event()
        self._stop_requested = threading.Event()
        # With a schema registry, the subject's newest version is the table's schema, and may change.
        self.layout, self.stamper, self.registry = topic_parser(config, self._stop_requested)
        self._query: StreamingQuery | None = None
        self._followed_batch: int | None = None
        self._writers: tuple[BatchTableWriter, BatchTableWriter] | None = None
        self._next_offsets: dict[int, int] = {}
        self._expect_dead_letters = False
        self._write_tasks = config.write_tasks or spark.sparkContext.defaultParallelism
        self._previous_read: int | None = None
        # Where the archive is, as Spark checkpointed it; and where the consumer group was told it is.
        self._archived: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._newest_ingestion: float | None = None
        # When the catalog or the warehouse stopped taking commits; None while they take them.
        self._outage_started: float | None = None
        metrics.commit_outage.labels(config.topic).set_function(self._outage_seconds)
        self._kafka = GroupCommitter(config.topic, config.consumer_group, config.kafka_client_config())
        self._lag = LagReporter(config.topic, self._kafka, metrics)
        self._lag_lock = threading.Lock()

    def run(self, available_now: bool = False) -> RouterTotals:
        config = self.config
        self._kafka.require_topic()
        described = {
            TOPIC_PROPERTY: config.topic,
            SCHEMA_PROPERTY: config.schema_name,
            ENCODING_PROPERTY: config.encoding,
        }
        if config.schema_registry is not None and config.subject is not None:
            described[SCHEMA_REGISTRY_PROPERTY] = config.schema_registry.url
            described[SUBJECT_PROPERTY] = config.subject
        properties = {**described, **ENCODING_PROPERTIES, **maintained_properties(config)}
        ensure_tables(self.spark, config.catalog, self.layout, config.target_file_size_bytes, properties)
        warn_of_long_history(config)
        self._evolve(self.layout)
        evolve_metadata(self.spark, config.catalog.table_identifier(self.layout.dead_letter_table))
        self._committed = self._kafka.committed()
        self._archived = dict(self._committed)
        self._next_offsets = dict(self._committed)
        lag_thread = threading.Thread(target=self._refresh_lag_forever, name="bergstream-lag", daemon=True)
        previous_handlers = self._handle_stop_signals()
        # Maintenance on a schedule belongs to a router that keeps running, not to one draining the topic.
        schedule: MaintenanceSchedule | None = None
        if config.maintenance.every is not None and not available_now:
            schedule = MaintenanceSchedule(self.spark, config, self.metrics)
        try:
            lag_thread.start()
            if schedule is not None:
                schedule.start()
            for restart in range(_REPLAY_RESTARTS + 1):
                query = self._start(available_now)
                log.info("router for %s started: query %s, checkpoint %s", config.topic, query.id,
                         config.checkpoint_location)  # fmt: skip
                try:
                    while not query.awaitTermination(1):
                        self._follow(query)
                        if self._stop_requested.is_set():
                            log.info("stopping the router for %s after its current batch", config.topic)
                            query.stop()
                    break
                except StreamingQueryException as error:
                    if self._stop_requested.is_set():
                        log.warning("router for %s stopped: %s", config.topic, first_line(error))
                        break
                    if _REPLAY_PROGRESS_FAILURE not in str(error) or restart == _REPLAY_RESTARTS:
                        raise RouterStopped(
                            f"the router for {config.topic} stopped: {first_line(error)}"
                        ) from error
                    log.warning(
                        "restarting the query of %s after a replayed batch (SPARK-55271)", config.topic
                    )
        finally:
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
            self._stop_lag.set()
            if schedule is not None:
                schedule.stop()
            if self._query is not None:
                self._follow(self._query)
            self._refresh_lag()
            self._kafka.close()
        return self.totals

    @property
    def running(self) -> bool:
        """Whether the router's streaming query has started and not ended."""
        query = self._query
        try:
            return self._query_started.is_set() and query is not None and bool(query.isActive)
        except Exception:  # the driver's JVM is gone
            return False

    def stop(self) -> None:
        """Stop the query after its current batch; `run` then returns. Safe from any thread."""
        self._stop_requested.set()

    def _evolve(self, layout: ArchiveLayout) -> None:
        evolve_table(self.spark, self.config.catalog.table_identifier(layout.table), layout)

    def _outage_seconds(self) -> float:
        started = self._outage_started
        return 0.0 if started is None else time.time() - started

    def _handle_stop_signals(self) -> dict[int, Any]:
        """SIGINT and SIGTERM (Ctrl-C, Kubernetes) stop the query cleanly instead of killing the driver."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda *_: self.stop())
        return previous

    def _start(self, available_now: bool) -> StreamingQuery:
        config = self.config
        reader = (
            self.spark.readStream.format("kafka")
            .option("failOnDataLoss", "false")
            .options(**{**SPARK_CONSUMER_DEFAULTS, **config.kafka})
            .option("subscribe", config.topic)
            .option("includeHeaders", "true")
        )
        if config.max_offsets_per_trigger is not None:
            reader = reader.option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
        writer = (
            reader.load()
            .writeStream.queryName(f"bergstream-router-{config.topic}")
            .foreachBatch(self._process_batch)
            .option("checkpointLocation", config.checkpoint_location)
        )
        writer = (
            writer.trigger(availableNow=True)
            if available_now
            else writer.trigger(processingTime=config.trigger_interval)
        )
        query = writer.start()
        catalog = config.catalog
        self._writers = (
            BatchTableWriter(self.spark, catalog.table_identifier(self.layout.table), query.id),
            BatchTableWriter(self.spark, catalog.table_identifier(self.layout.dead_letter_table), query.id),
        )
        self._query = query
        self._query_started.set()
        return query

    def _process_batch(self, records: DataFrame, batch_id: int) -> None:
        self._query_started.wait()
        assert self._writers is not None
        archive_writer, dead_letter_writer = self._writers
        started = time.monotonic()
        if self.registry is not None:
            self.registry.before_batch(records, batch_id, self._evolve)
            self.layout, self.stamper = self.registry.layout, self.registry.stamper
        # A topic of many partitions is read by fewer tasks, each reading several partitions in turn:
        # fewer files per batch, and no more tasks than the cores that run them; a small batch by one.
        tasks = write_tasks_for(self._previous_read, self._write_tasks, self.config.records_per_write_task)
        stamped = self.stamper.stamp(records.coalesce(tasks))
        # A clean batch is read from Kafka once: parsed, counted and appended in one pass. A topic that
        # has just dead-lettered records is likely to again; its batch is kept in memory instead of
        # being read a second time for the dead-letter table.
        cached = self._expect_dead_letters
        if cached:
            stamped = stamped.persist()
        phases: dict[str, float] = {}
        appended: list[tuple[BatchTableWriter, Appended | None]] = []
        counts: BatchCounts | None = None
        try:
            archived = self._committing(archive_writer, batch_id, lambda: archive_writer.last_committed)
            if batch_id > archived:

                def archive() -> tuple[Appended | None, BatchCounts]:
                    observation = self._observation(batch_id)
                    rows = self.stamper.archive_rows(stamped, observation, self._counting)
                    result = self._append(archive_writer, rows, batch_id, phases)
                    if result is None:  # an earlier attempt committed it before its error: count apart
                        return None, count_batch(stamped)
                    return result, from_observation(observation.get)

                result, counts = self._committing(archive_writer, batch_id, archive)
                appended.append((archive_writer, result))
            # A replayed batch whose archive append is committed may still lack its dead letters.
            if counts is None or counts.dead_lettered:

                def dead_letters(counts: BatchCounts | None = counts) -> Appended | None:
                    observation = self._observation(batch_id)
                    rows = self.stamper.dead_letter_rows(stamped, observation)
                    result = self._append(dead_letter_writer, rows, batch_id, phases)
                    if result is not None and counts is not None:
                        self._check_dead_letters(batch_id, counts, observation)
                    return result

                appended.append(
                    (dead_letter_writer, self._committing(dead_letter_writer, batch_id, dead_letters))
                )
        finally:
            if cached:
                stamped.unpersist()
        self._expect_dead_letters = counts is None or counts.dead_lettered > 0
        self._previous_read = None if counts is None else counts.read
        self._account(batch_id, counts, appended, time.monotonic() - started, phases)

    def _committing(self, writer: BatchTableWriter, batch_id: int, attempt: Callable[[], T]) -> T:
        """`attempt()`, tried again with backoff while the catalog or the warehouse is unavailable."""
        topic, settings = self.config.topic, self.config.commit_retry
        delays = settings.delays()
        for number in itertools.count(1):
            try:
                result = attempt()
            except Exception as error:
                reason = transient_reason(java_causes(error))
                if reason is None:
                    raise
                if self._outage_started is None:
                    self._outage_started = time.time()
                waited = time.time() - self._outage_started
                if waited >= settings.give_up_after_seconds:
                    raise RouterStopped(
                        f"{topic} batch {batch_id}: {writer.identifier} could not be committed for "
                        f"{waited:.0f}s ({reason}); gave up after {number} attempts (commit_retry)"
                    ) from error
                delay = next(delays)
                self.metrics.commit_retries.labels(topic, writer.identifier).inc()
                log.warning(
                    "%s batch %d: committing to %s failed (attempt %d, %.0fs into the outage): %s; "
                    "trying again in %.1fs",
                    topic, batch_id, writer.identifier, number, waited, reason, delay,
                )  # fmt: skip
                if self._stop_requested.wait(delay):
                    raise RouterStopped(
                        f"{topic}: stopped while batch {batch_id} waited for {writer.identifier}; "
                        "it is archived when the router starts again"
                    ) from error
                continue
            if self._outage_started is not None:
                log.warning(
                    "%s batch %d: committed to %s after %d attempts, %.0fs after the outage began",
                    topic, batch_id, writer.identifier, number, time.time() - self._outage_started,
                )  # fmt: skip
                self._outage_started = None
            return result
        raise AssertionError("unreachable")

    def _append(
        self, writer: BatchTableWriter, rows: DataFrame, batch_id: int, phases: dict[str, float]
    ) -> Appended | None:
        commit_started = time.monotonic()
        result = writer.append(rows, batch_id)
        took = time.monotonic() - commit_started
        if result is not None:
            self.metrics.commit_latency.labels(self.config.topic, writer.identifier).observe(took)
        phases[writer.identifier.rsplit(".", 1)[-1]] = took
        return result

    def _observation(self, batch_id: int) -> Observation:
        return Observation(f"bergstream-router-{self.config.topic}-{batch_id}-{uuid.uuid4().hex}")

    def _check_dead_letters(self, batch_id: int, counts: BatchCounts, observation: Observation) -> None:
        """The dead-letter pass reads the batch from Kafka again; it should find what the first pass found.

        It may not when Kafka deleted records in between (retention): those dead letters are lost, and
        said so."""
        dead_lettered = int(observation.get[DEAD_LETTERED])
        if dead_lettered != counts.dead_lettered:
            log.error(
                "%s batch %d: %d records failed to parse when archived but %d were dead-lettered on the "
                "second read from Kafka; records expired from Kafka in between?",
                self.config.topic, batch_id, counts.dead_lettered, dead_lettered,
            )  # fmt: skip

    def _account(
        self,
        batch_id: int,
        counts: BatchCounts | None,
        appended: list[tuple[BatchTableWriter, Appended | None]],
        seconds: float,
        phases: dict[str, float],
    ) -> None:
        topic, metrics, totals = self.config.topic, self.metrics, self.totals
        replayed = counts is None
        metrics.batches.labels(topic, "replayed" if replayed else "written").inc()
        metrics.batch_duration.labels(topic).observe(seconds)
        metrics.last_batch.labels(topic).set(batch_id)
        totals.batches += 1
        timings = ", ".join(f"{phase} {took:.1f}s" for phase, took in phases.items())
        if counts is None:
            totals.replayed_batches += 1
            log.info(
                "%s batch %d (replayed, already committed) in %.1fs (%s)", topic, batch_id, seconds, timings
            )
            return
        self._report_expired(counts)
        for read in counts.partitions:
            self._next_offsets[read.partition] = max(self._next_offsets.get(read.partition, 0), read.last + 1)
            totals.per_partition[read.partition] = totals.per_partition.get(read.partition, 0) + read.read
            metrics.records_read.labels(topic, str(read.partition)).inc(read.read)
        if counts.newest is not None:
            newest = counts.newest.timestamp()
            self._newest_ingestion = max(self._newest_ingestion or newest, newest)
            metrics.newest_ingestion.labels(topic).set(self._newest_ingestion)
        written = [(writer, result) for writer, result in appended if result is not None]
        for writer, result in written:
            metrics.files_written.labels(topic, writer.identifier).inc(result.files)
            metrics.bytes_written.labels(topic, writer.identifier).inc(result.bytes)
        files = sum(result.files for _, result in written)
        size = sum(result.bytes for _, result in written)
        metrics.records_archived.labels(topic).inc(counts.archived)
        metrics.records_dead_lettered.labels(topic).inc(counts.dead_lettered)
        totals.read += counts.read
        totals.archived += counts.archived
        totals.dead_lettered += counts.dead_lettered
        totals.files += files
        totals.bytes += size
        log.info(
            "%s batch %d: read %d, archived %d, dead-lettered %d, %d files, %.1f MB in %.1fs (%s)",
            topic, batch_id, counts.read, counts.archived, counts.dead_lettered, files, size / 1e6, seconds,
            timings,
        )  # fmt: skip

    def _report_expired(self, counts: BatchCounts) -> None:
        """Offsets between where the router left off and the first one read, gone from Kafka meanwhile."""
        topic = self.config.topic
        first_read = {read.partition: read.first for read in counts.partitions}
        gaps = [
            p for p, first in first_read.items() if p in self._next_offsets and first > self._next_offsets[p]
        ]
        if not gaps:
            return
        log_start = {p: low for p, (low, _) in self._kafka.watermarks(gaps).items()}
        for expired in expired_ranges({p: self._next_offsets[p] for p in gaps}, first_read, log_start):
            log.warning(
                "%s partition %d: offsets %d to %d (%d records) expired from Kafka before being archived",
                topic, expired.partition, expired.start, expired.end - 1, expired.count,
            )  # fmt: skip
            self.metrics.expired_offsets.labels(topic, str(expired.partition)).inc(expired.count)
            self.totals.expired += expired.count

    def _follow(self, query: StreamingQuery) -> None:
        """Where Spark has checkpointed the query to, from its last progress: once a second, by the loop
        that waits for the query. Read as one JSON document; a listener would cost dozens of calls into
        the JVM for every batch."""
        progress = query.lastProgress
        if progress is None or not progress.sources or progress.batchId == self._followed_batch:
            return
        self._followed_batch = progress.batchId
        end_offsets = json.loads(progress.sources[0].json).get("endOffset")
        self.on_progress(json.dumps(end_offsets) if end_offsets else None)

    def on_progress(self, end_offsets_json: str | None) -> None:
        """Spark checkpointed a batch: the world's view of the router moves forward."""
        end_offsets = parse_spark_offsets(end_offsets_json, self.config.topic)
        if end_offsets:
            self._archived = end_offsets
            for partition, offset in end_offsets.items():
                self._next_offsets[partition] = max(self._next_offsets.get(partition, 0), offset)
        self._refresh_lag()

    def _commit_group(self) -> None:
        """Tell the consumer group where the archive is; a refused commit is tried again next time."""
        archived = self._archived
        if archived and archived != self._committed and self._kafka.commit(archived):
            self._committed = archived

    def _refresh_lag_forever(self) -> None:
        while not self._stop_lag.wait(self.config.lag_refresh_seconds):
            self._refresh_lag()

    def _refresh_lag(self) -> None:
        # From the lag thread and from the loop that follows the query: one at a time, since reading lag
        # moves the client.
        with self._lag_lock:
            self._commit_group()
            self._lag.refresh(self._archived, self._newest_ingestion)


def archive_available_now(spark: SparkSession, config: RouterConfig) -> RouterTotals:
    """Archive what the topic holds now and return: the router with an availableNow trigger."""
    return Router(config, spark, RouterMetrics(config.topic)).run(available_now=True)
