"""A topic archived: its records parsed into its archive table, those that do not parse into its
dead-letter table, each batch exactly once (archiver.py), with its accounting, lag and consumer group."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import replace

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from bergstream.router.accounting import BatchAccounting, RouterTotals
from bergstream.router.archive_tables import ArchiveTables
from bergstream.router.archiver import BatchArchiver
from bergstream.router.commit_retry import CommitRetry
from bergstream.router.config import RouterConfig
from bergstream.router.consumer_group import GroupCommitter
from bergstream.router.expired import ExpiredOffsets
from bergstream.router.identity import TopicIdentity
from bergstream.router.metrics import RouterMetrics
from bergstream.router.progress_follower import ProgressFollower
from bergstream.router.recorded_positions import RecordedHistory
from bergstream.router.resume import recorded_positions, starting_offsets
from bergstream.router.topic import BatchTables
from bergstream.router.write import QUERY_ID
from bergstream.schemas.batch_range import EARLIEST, NEXT_OFFSETS, BatchRange

log = logging.getLogger("bergstream.router")


class ArchivedTopic:
    """One topic's share of a query: its tables (made if missing), archiver, accounting, lag and group."""

    archived = True

    def __init__(
        self,
        config: RouterConfig,
        spark: SparkSession,
        metrics: RouterMetrics,
        stopping: threading.Event,
        kafka: GroupCommitter,
    ) -> None:
        self.config = config
        self.topic = config.settings.topic
        self.kafka = kafka
        self.expired = ExpiredOffsets(self.topic, kafka, metrics)
        self.accounting = BatchAccounting(self.topic, metrics, self.expired)
        self.tables = ArchiveTables(spark, config)
        self.retry = CommitRetry(self.topic, config.query.commit_retry, metrics, stopping)
        self.archiver = BatchArchiver(spark, config, metrics, self.tables, self.retry, self.accounting)
        self.together: BatchTables = self.archiver
        self.follower = ProgressFollower(
            self.topic, kafka, metrics, self.expired, lambda: self.accounting.newest_ingestion,
            config.query.lag_refresh_seconds, cluster=config.query.cluster,
        )  # fmt: skip
        # Read once at start, for the check of the topic's id that follows (`identify`).
        self._recorded: dict[str, RecordedHistory] | None = self.tables.prepare(self.archiver.layout)
        # Where each of its tables' newest commits says its archive ends, with the query that committed it,
        # as read at start.
        self._archived_ends: list[tuple[str | None, dict[int, int]]] = []

    @property
    def totals(self) -> RouterTotals:
        return self.accounting.totals

    @property
    def refusal(self) -> str | None:
        return None

    @property
    def archive_settings(self) -> RouterConfig | None:
        return self.config

    @property
    def topic_id(self) -> str | None:
        return self.archiver.origin.topic_id

    def settings_due(self) -> bool:
        return False

    def archived_at_start(self, spark: SparkSession, query_id: str | None) -> dict[int, int] | None:
        # Where every table holds the archive to: a batch whose archive committed and whose dead letters did
        # not is run again, and its dead letters written alone.
        end: dict[int, int] | None = None
        for committed_by, ends in self._archived_ends:
            if query_id is None or committed_by == query_id:
                end = end or {}
                end.update({p: min(o, end.get(p, o)) for p, o in ends.items()})
        return end

    def positions(self, spark: SparkSession) -> dict[int, int] | None:
        archiver = self.archiver
        return recorded_positions(
            spark, self.config, archiver.origin, archiver.layout, archiver.splitter, self.kafka
        )

    def resume(self, spark: SparkSession) -> dict[int, int] | None:
        archiver = self.archiver
        offsets = starting_offsets(
            spark, self.config, archiver.origin, archiver.layout, archiver.splitter, self.kafka
        )
        if offsets is not None:
            self.expired.left_off({p: o for p, o in offsets.items() if o != EARLIEST})
        return offsets

    def identify(self, spark: SparkSession, checkpoint: str) -> None:
        """Learn the topic's Kafka id, refusing one that the query's checkpoint or the topic's tables record
        otherwise; the tables' commits record it from then on."""
        tables, self._recorded = self._recorded, None
        assert tables is not None, "a topic is identified once, at start, against its tables as prepared"
        self._archived_ends = archived_ends(tables, self.topic, self.config.query.cluster)
        identity = TopicIdentity(self.topic, self.config.query.cluster, self.kafka)
        archiver = self.archiver
        archiver.origin = replace(archiver.origin, topic_id=identity.at_start(spark, checkpoint, tables))

    def replayed(self, batch_id: int) -> bool:
        return self.archiver.replayed(batch_id)

    def started(self, query: StreamingQuery) -> None:
        self.archiver.started(query, "latest")  # each batch is given its range
        self.follower.start(refresh=False)

    def archive(self, records: DataFrame, batch_id: int, covered: BatchRange) -> None:
        self.archiver.archive(records, batch_id, covered)


def archived_ends(
    histories: Mapping[str, RecordedHistory], topic: str, cluster: str
) -> list[tuple[str | None, dict[int, int]]]:
    """Per table of `histories`, the position its newest commit records for `topic` read from `cluster`,
    with the id of the query that committed it."""
    ends = []
    for history in histories.values():
        newest = history.newest_of(NEXT_OFFSETS, topic, cluster)
        recorded = None if newest is None else BatchRange.recorded(newest[1], topic, cluster)
        if newest is not None and recorded is not None:
            ends.append((newest[1].get(QUERY_ID), dict(recorded.end)))
    return ends
