"""`bergstream router run`: one Spark Structured Streaming query that archives one topic.

The router wires its roles: the tables set up before the query (archive_tables.py), the function that
archives each micro-batch (archiver.py) with its commits tried again through an outage (commit_retry.py),
the accounting of each batch (accounting.py, expired.py), and the following of the query's progress into
the consumer group `bergstream-router.<topic>` and the lag metrics (progress.py). The query itself is
started, watched and restarted by bergstream's query runner; without a checkpoint, from where the tables
record that the archive ends (resume.py).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from bergstream.kafka_source import kafka_stream
from bergstream.query import QueryRunner, foreach_batch, query_failure
from bergstream.router.accounting import BatchAccounting, RouterTotals
from bergstream.router.archive_tables import ArchiveTables
from bergstream.router.archiver import BatchArchiver
from bergstream.router.commit_retry import CommitRetry
from bergstream.router.config import RouterConfig
from bergstream.router.consumer_group import GroupCommitter
from bergstream.router.errors import RouterStopped
from bergstream.router.expired import ExpiredOffsets
from bergstream.router.identity import TopicIdentity
from bergstream.router.metrics import RouterMetrics
from bergstream.router.progress import ProgressFollower
from bergstream.router.resume import starting_offsets
from bergstream.router.schedule import MaintenanceSchedule
from bergstream.schemas.positions import EARLIEST
from bergstream.signals import on_stop_signals

log = logging.getLogger("bergstream.router")


class Router:
    def __init__(
        self,
        config: RouterConfig,
        spark: SparkSession,
        metrics: RouterMetrics,
        stopping: threading.Event | None = None,
    ) -> None:
        """`stopping`, set, stops the router: while it waits for a schema registry at start too."""
        self.config = config
        self.spark = spark
        self.metrics = metrics
        stopping = stopping or threading.Event()
        self._kafka = GroupCommitter(
            config.topic, config.consumer_group, config.kafka_client_config(), config.origin.isolation_level
        )
        try:
            expired = ExpiredOffsets(config.topic, self._kafka, metrics)
            self._expired = expired
            self.accounting = BatchAccounting(config.topic, metrics, expired)
            self.tables = ArchiveTables(spark, config)
            retry = CommitRetry(config.topic, config.commit_retry, metrics, stopping)
            self.archiver = BatchArchiver(spark, config, metrics, self.tables, retry, self.accounting)
            self._identity = TopicIdentity(config.topic, config.cluster, self._kafka)
            self.archiver.identity = self._identity
        except BaseException:
            self._kafka.close()
            raise
        self.follower = ProgressFollower(
            config.topic, self._kafka, metrics, expired, lambda: self.accounting.newest_ingestion,
            config.lag_refresh_seconds, cluster=config.cluster,
        )  # fmt: skip
        self.runner = QueryRunner(f"the router for {config.topic}", self._start, stopping)
        self._available_now = False
        # Where the query starts when its checkpoint holds no batch: the tables' recorded positions.
        self._resume: dict[int, int] | None = None

    @property
    def running(self) -> bool:
        """Whether the router's streaming query has started and not ended."""
        return self.runner.running

    def stop(self) -> None:
        """Stop the query after its current batch; `run` then returns. Safe from any thread."""
        self.runner.stopping.set()

    def run(self, available_now: bool = False) -> RouterTotals:
        config = self.config
        self._available_now = available_now
        try:
            self._kafka.require_topic()
            layout = self.archiver.layout
            self.tables.prepare(layout)
            tables = [config.catalog.table_identifier(t) for t in (layout.table, layout.dead_letter_table)]
            topic_id = self._identity.at_start(self.spark, config.checkpoint_location, tables)
            self.archiver.origin = replace(config.origin, topic_id=topic_id)
            self._resume = starting_offsets(
                self.spark, config, self.archiver.origin, layout, self.archiver.splitter, self._kafka
            )
            if self._resume is not None:
                self._expired.left_off({p: o for p, o in self._resume.items() if o != EARLIEST})
        except BaseException:
            self._kafka.close()
            raise
        # Maintenance on a schedule belongs to a router that keeps running, not to one draining the topic.
        schedule: MaintenanceSchedule | None = None
        if config.maintenance.every is not None and not available_now:
            schedule = MaintenanceSchedule(self.spark, config, self.metrics)
        self.follower.start()
        try:
            if schedule is not None:
                schedule.start()
            log.info("the router for %s checkpoints to %s", config.topic, config.checkpoint_location)
            with on_stop_signals(self.runner.stopping.set):
                self.runner.run(self.follower.follow)
        except StreamingQueryException as error:
            raise RouterStopped(f"the router for {config.topic} stopped: {query_failure(error)}") from error
        finally:
            if schedule is not None:
                schedule.stop()
            self.follower.stop(self.runner.query)
            self._kafka.close()
        return self.accounting.totals

    def _start(self) -> StreamingQuery:
        config = self.config
        options = dict(config.kafka)
        if self._resume is not None:
            resume = {str(partition): offset for partition, offset in sorted(self._resume.items())}
            options["startingOffsets"] = json.dumps({config.topic: resume})
        interval = None if self._available_now else config.trigger_interval
        query = start_archive_query(
            self.spark, config.topic, options, config.max_offsets_per_trigger, config.topic,
            self.archiver.archive, config.checkpoint_location, interval,
        )  # fmt: skip
        self.archiver.started(query, options.get("startingOffsets", "latest"))
        return query


def start_archive_query(
    spark: SparkSession,
    subscription: str,
    options: dict[str, str],
    max_offsets_per_trigger: int | None,
    name: str,
    archive: Callable[[DataFrame, int], None],
    checkpoint: str,
    trigger_interval: str | None,
    pattern: bool = False,
) -> StreamingQuery:
    """The router's query `bergstream-router-<name>`: the Kafka records of `subscription` (a topic, or with
    `pattern` a regular expression), each micro-batch handed to `archive`, on a processing-time trigger of
    `trigger_interval`, or, None, what is there now."""
    writer = (
        kafka_stream(spark, subscription, options, max_offsets_per_trigger, pattern=pattern)
        .writeStream.queryName(f"bergstream-router-{name}")
        .foreachBatch(foreach_batch(f"bergstream-router-{name}", archive))
        .option("checkpointLocation", checkpoint)
    )
    if trigger_interval is None:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=trigger_interval).start()


def archive_available_now(spark: SparkSession, config: RouterConfig) -> RouterTotals:
    """Archive what the topic holds now and return: the router with an availableNow trigger."""
    return Router(config, spark, RouterMetrics(config.topic)).run(available_now=True)
