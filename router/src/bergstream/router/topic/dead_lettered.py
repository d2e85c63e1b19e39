"""A topic dead-lettered whole: its settings do not load, or its schema is not found. It is not dropped and
stops no other topic: each of its records goes to its dead-letter table with the reason, under the same
exactly-once append and with the same recorded Kafka ranges as a topic archived, and it resumes from them;
the query reads its settings again once in a while (`RETRY_SETTINGS_SECONDS`), and `bergstream router
redrive` archives its dead letters once they parse."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from bergstream.kafka_source import isolation_level
from bergstream.router.accounting import BatchAccounting, RouterTotals
from bergstream.router.batch_counts import BatchCounts, from_observation, observed_columns
from bergstream.router.commit_policy import CommitPolicy
from bergstream.router.commit_retry import CommitRetry
from bergstream.router.config import RECORDS_PER_WRITE_TASK, RouterConfig, table_for_topic
from bergstream.router.consumer_group import GroupCommitter
from bergstream.router.errors import SecondWriter
from bergstream.router.expired import ExpiredOffsets
from bergstream.router.metrics import RouterMetrics
from bergstream.router.progress_follower import ProgressFollower
from bergstream.router.recorded_positions import newest_recorded, resume_offsets
from bergstream.router.together import TogetherWriter, rows_plan
from bergstream.router.topic import BatchTables
from bergstream.router.write import BATCH_ID, QUERY_ID, Appended, BatchTableWriter, write_tasks_for
from bergstream.schemas.archive import (
    DEAD_LETTER_SUFFIX,
    METADATA,
    REDRIVE_ID,
    REDRIVEN_AT,
    dead_letter_create_statements,
)  # fmt: skip
from bergstream.schemas.batch_range import BatchRange, Origin, offsets_json
from bergstream.schemas.parse import ERROR
from bergstream.schemas.stamp import metadata

if TYPE_CHECKING:
    from bergstream.router.driver.settings import DriverSettings

log = logging.getLogger("bergstream.router")
# How often the settings of a topic that is dead-lettered whole are read again.
RETRY_SETTINGS_SECONDS = 60.0


class DeadLetteredTopic:
    """A matching topic that cannot be archived (its settings do not load, its schema is not found): each
    of its records goes to its dead-letter table with `reason`, under the same exactly-once append."""

    archived = False

    def __init__(
        self,
        topic: str,
        reason: str,
        config: DriverSettings,
        spark: SparkSession,
        metrics: RouterMetrics,
        stopping: threading.Event,
        kafka: GroupCommitter,
    ) -> None:
        self.topic = topic
        self.reason = reason
        self.config = config
        self.spark = spark
        self.kafka = kafka
        self.rejected_at = time.monotonic()
        self.identifier = config.catalog.table_identifier(table_for_topic(topic) + DEAD_LETTER_SUFFIX)
        self.expired = ExpiredOffsets(topic, kafka, metrics)
        self.accounting = BatchAccounting(topic, metrics, self.expired)
        self.retry = CommitRetry(topic, config.commit_retry, metrics, stopping)
        self.follower = ProgressFollower(
            topic, kafka, metrics, self.expired, lambda: self.accounting.newest_ingestion,
            config.lag_refresh_seconds, cluster=config.cluster,
        )  # fmt: skip
        self._counting = observed_columns(spark)
        self._writer: BatchTableWriter | None = None
        self.together: BatchTables = self
        self._job = TogetherWriter(spark, spark.sparkContext.defaultParallelism, commit_threads=1)
        self.registry = None
        self._rows_plan: Any = None
        self._previous_read: int | None = None
        if not spark.catalog.tableExists(self.identifier):
            for statement in dead_letter_create_statements(self.identifier):
                spark.sql(statement)
        log.error("topic %s is dead-lettered whole into %s: %s", topic, self.identifier, reason)

    @property
    def totals(self) -> RouterTotals:
        return self.accounting.totals

    @property
    def refusal(self) -> str | None:
        return self.reason

    @property
    def archive_settings(self) -> RouterConfig | None:
        return None

    @property
    def topic_id(self) -> str | None:
        return None

    def settings_due(self) -> bool:
        """Every RETRY_SETTINGS_SECONDS: the settings may have been mended."""
        if time.monotonic() - self.rejected_at <= RETRY_SETTINGS_SECONDS:
            return False
        self.rejected_at = time.monotonic()
        return True

    def archived_at_start(self, spark: SparkSession, query_id: str | None) -> dict[int, int] | None:
        return self.positions(spark)

    def positions(self, spark: SparkSession) -> dict[int, int] | None:
        """Where the topic's dead-letter table says its archive ends; None when it records no position."""
        recorded = newest_recorded(spark, self.identifier, self.topic, self.config.cluster)
        return None if recorded is None else resume_offsets([recorded], self.kafka.partitions())

    def resume(self, spark: SparkSession) -> dict[int, int] | None:
        """Where the topic starts when the query's checkpoint holds no batch: where its dead-letter table
        ends, as a topic archived resumes where its tables end; None when it records no position."""
        offsets = self.positions(spark)
        if offsets is None:
            return None
        log.warning(
            "topic %s, dead-lettered whole: the query's checkpoint holds no batch; resuming where %s ends "
            "(%s), not from the settings' startingOffsets", self.topic, self.identifier,
            offsets_json(offsets),
        )  # fmt: skip
        return offsets

    def replayed(self, batch_id: int) -> bool:
        writer = self._writer
        assert writer is not None
        return writer.last_committed >= batch_id

    def started(self, query: StreamingQuery) -> None:
        self._writer = BatchTableWriter(self.spark, self.identifier, str(query.id))
        self.follower.start(refresh=False)

    # Its rows as the one job of a batch writes them (BatchTables): no archive table, every record a dead
    # letter.

    @property
    def identifiers(self) -> tuple[str | None, str]:
        return None, self.identifier

    def topic_rows(self, records: DataFrame, batch_id: int) -> Any:
        if self._rows_plan is None:
            spark = records.sparkSession
            stamped = self._stamped(spark.createDataFrame([], records.schema))
            dead_letter = F.struct(
                *self._dead_letter_columns(),
                F.lit(None).cast("timestamp").alias(REDRIVEN_AT),
                F.lit(None).cast("string").alias(REDRIVE_ID),
            )
            # No record is archived: `a` is null, of a type that carries the metadata the writer reads.
            rows = stamped.select(
                F.when(F.lit(False), F.struct(F.col(METADATA))).alias("a"), dead_letter.alias("d")
            )
            self._rows_plan = rows_plan(rows)
        return self._rows_plan

    def holding(self, batch_id: int) -> tuple[bool, bool]:
        return True, self.replayed(batch_id)

    def batch_properties(self, batch_id: int, covered: BatchRange) -> dict[str, str]:
        writer = self._writer
        assert writer is not None
        return {QUERY_ID: writer.query_id, BATCH_ID: str(batch_id), **self._properties(covered)}

    def write_tasks(self) -> int:
        return write_tasks_for(
            self._previous_read, self.spark.sparkContext.defaultParallelism, RECORDS_PER_WRITE_TASK
        )

    def written_together(
        self,
        batch_id: int,
        counts: BatchCounts,
        archived: Appended,
        dead_lettered: Appended,
        seconds: float,
        commits: tuple[float, float] = (0.0, 0.0),
        replayed: bool = False,
    ) -> None:
        """Its batch `batch_id` was written: its archive is never written, so `replayed` does not apply."""
        writer = self._writer
        assert writer is not None
        writer.committed(batch_id)
        self._previous_read = counts.read
        self.accounting.account(batch_id, counts, [(writer, dead_lettered)], seconds, {"together": seconds})

    @property
    def commit_policy(self) -> CommitPolicy:
        return self.config.commit_policy

    def replayed_whole(self, batch_id: int) -> None:
        self.accounting.account(batch_id, None, [], 0.0, {})

    def forget_commits(self) -> None:
        if self._writer is not None:
            self._writer.committed(None)

    def second_writer(self, batch_id: int, found: str, committed: bool) -> Exception:
        return SecondWriter(f"topic {self.topic}: another router writes it into {self.identifier}: {found}")

    def _stamped(self, records: DataFrame) -> DataFrame:
        return records.select("*", F.lit(self.reason).alias(ERROR), metadata(self.config.cluster))

    def _dead_letter_columns(self) -> list[Column]:
        return [
            F.col("key").alias("raw_key"),
            F.col("value").alias("raw_value"),
            F.col(ERROR).alias("error"),
            F.lit(None).cast("string").alias("schema_name"),
            F.col(METADATA),
        ]

    def _properties(self, covered: BatchRange) -> dict[str, str]:
        return covered.properties(Origin(self.topic, self.config.cluster, isolation_level(self.config.kafka)))

    def archive(self, records: DataFrame, batch_id: int, covered: BatchRange) -> None:
        """The topic's batch on its own (a write together failed, a catch-up), by the same job, its outages
        waited out."""
        by_spark = partial(self._archive_by_spark, records, batch_id, covered)
        self._job.archive_alone(records, batch_id, self.topic, self, covered, self.retry, by_spark)

    def _archive_by_spark(self, records: DataFrame, batch_id: int, covered: BatchRange) -> None:
        writer = self._writer
        assert writer is not None
        started = time.monotonic()
        stamped = self._stamped(records)
        observation = Observation(f"bergstream-router-{self.topic}-{batch_id}-{uuid.uuid4().hex}")
        rows = stamped.observe(observation, *self._counting).select(*self._dead_letter_columns())
        properties = self._properties(covered)
        result = self.retry.attempt(
            self.identifier, batch_id, lambda: writer.append(rows, batch_id, properties)
        )
        counts = None if result is None else from_observation(observation.get)
        phases = {self.identifier.rsplit(".", 1)[-1]: time.monotonic() - started}
        self.accounting.account(batch_id, counts, [(writer, result)], time.monotonic() - started, phases)
