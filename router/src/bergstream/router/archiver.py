"""Archiving one topic's micro-batch: read, parsed, stamped, counted and written in one pass, by the job that
writes every batch (together.py), its valid rows appended to the archive table and the records that do not
parse to the dead-letter table. Each append is idempotent per (query, batch), so a batch replayed after a
crash is never archived twice, and records the Kafka range it covers (offset_log.py). A batch of this topic
alone (its write with the query's other topics failed, a catch-up) is tried again through outages
(CommitRetry); a table that job does not write (together.py says which) is appended by Spark's writer."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from functools import partial
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from bergstream.router.accounting import BatchAccounting
from bergstream.router.archive_tables import ArchiveTables
from bergstream.router.batch_counts import BatchCounts, count_batch, from_observation, observed_columns
from bergstream.router.commit_policy import CommitPolicy
from bergstream.router.commit_retry import CommitRetry
from bergstream.router.config import RouterConfig
from bergstream.router.errors import SecondWriter
from bergstream.router.identity import TopicIdentity
from bergstream.router.metrics import RouterMetrics
from bergstream.router.offset_log import batch_range
from bergstream.router.registry_topic import topic_parser
from bergstream.router.together import TogetherWriter, rows_plan, shared_plan
from bergstream.router.transform import DEAD_LETTERED, RecordSplitter
from bergstream.router.write import BATCH_ID, QUERY_ID, Appended, BatchTableWriter, Overlap, write_tasks_for
from bergstream.schemas.batch_range import BatchRange, Origin

log = logging.getLogger("bergstream.router")


class BatchArchiver:
    """The function of the query's `foreachBatch`: each batch into the archive and dead-letter tables."""

    def __init__(
        self,
        spark: SparkSession,
        config: RouterConfig,
        metrics: RouterMetrics,
        tables: ArchiveTables,
        retry: CommitRetry,
        accounting: BatchAccounting,
    ) -> None:
        self.config = config
        # The topic's own settings (`config.query`: those of the query that reads it).
        self.settings = config.settings
        self.metrics = metrics
        self.tables = tables
        self.retry = retry
        self.accounting = accounting
        self._counting = observed_columns(spark)
        # Where the rows come from, the topic's Kafka id included once the router has asked Kafka for it;
        # the id is checked again before each batch.
        self.origin: Origin = config.origin
        self.identity: TopicIdentity | None = None
        # With a schema registry, the subject's newest version is the table's schema, and may change.
        self.layout, self.splitter, self.registry = topic_parser(config, retry.stopping)
        self._writers: tuple[BatchTableWriter, BatchTableWriter] | None = None
        self._query: StreamingQuery | None = None
        self._starting = "latest"
        # The last batch's range: its end is the next batch's start.
        self._covered: tuple[int, BatchRange] | None = None
        # The query's first batch may come before `started` is told the query's id.
        self._started = threading.Event()
        self._expect_dead_letters = False
        self._write_tasks = self.settings.write_tasks or spark.sparkContext.defaultParallelism
        self._previous_read: int | None = None
        # The one job that writes every batch, here of this topic alone (together.py).
        self._job = TogetherWriter(spark, spark.sparkContext.defaultParallelism, commit_threads=1)
        # The plan of the topic's rows for a batch of many topics, and the splitter it was made from.
        self._rows_plan: tuple[RecordSplitter, Any] | None = None

    def started(self, query: StreamingQuery, starting: str) -> None:
        """`query` started, from `starting` (its startingOffsets) when it has no checkpoint: its batches are
        appended under its id."""
        self._writers = self.tables.writers(self.layout, query.id)
        self._query = query
        self._starting = starting
        self._covered = None
        self._started.set()

    def archive(self, records: DataFrame, batch_id: int, covered: BatchRange | None = None) -> None:
        """Archive batch `batch_id`; `covered`, its Kafka range, is read from the query's offset log unless
        given (a query of many topics reads the log once for all of them)."""
        self._started.wait()
        assert self._writers is not None and self._query is not None
        if self.identity is not None:
            self.identity.before_batch(batch_id)
        if covered is None:
            previous = (
                self._covered if self._covered is not None and self._covered[0] == batch_id - 1 else None
            )
            covered = batch_range(
                self._query,
                batch_id,
                self.settings.topic,
                self._starting,
                previous[1].end if previous else None,
            )
        self._covered = (batch_id, covered)
        tasks = write_tasks_for(self._previous_read, self._write_tasks, self.settings.records_per_write_task)
        by_spark = partial(self._archive_by_spark, records, batch_id, covered)
        topic = self.settings.topic
        self._job.archive_alone(records.coalesce(tasks), batch_id, topic, self, covered, self.retry, by_spark)

    def _archive_by_spark(self, records: DataFrame, batch_id: int, covered: BatchRange) -> None:
        """The batch appended by Spark's Iceberg writer: for tables the one job does not write (laid out
        otherwise than bergstream makes them)."""
        assert self._writers is not None
        archive_writer, dead_letter_writer = self._writers
        started = time.monotonic()
        self.refuse_second_writer(batch_id, covered)
        properties = covered.properties(self.origin)
        if self.registry is not None:
            self.registry.before_batch(records, batch_id, self.tables.evolve)
            self.layout, self.splitter = self.registry.layout, self.registry.splitter
        # A topic of many partitions is read by fewer tasks, each reading several partitions in turn:
        # fewer files per batch, and no more tasks than the cores that run them; a small batch by one.
        tasks = write_tasks_for(self._previous_read, self._write_tasks, self.settings.records_per_write_task)
        stamped = self.splitter.stamp(records.coalesce(tasks))
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
            archived = self.retry.attempt(
                archive_writer.identifier, batch_id, lambda: archive_writer.last_committed
            )
            if batch_id > archived:

                def archive() -> tuple[Appended | None, BatchCounts]:
                    observation = self._observation(batch_id)
                    rows = self.splitter.archive_rows(stamped, observation, self._counting)
                    result = self._append(archive_writer, rows, batch_id, properties, phases)
                    if result is None:  # an earlier attempt committed it before its error: count apart
                        return None, count_batch(stamped)
                    return result, from_observation(observation.get)

                result, counts = self.retry.attempt(archive_writer.identifier, batch_id, archive)
                appended.append((archive_writer, result))
                if result is not None and result.records:
                    # Two routers whose batches committed at the same moment did not see each other before.
                    self.refuse_second_writer(batch_id, covered, committed=True)
            # A replayed batch whose archive append is committed may still lack its dead letters.
            if counts is None or counts.dead_lettered:

                def dead_letters(counts: BatchCounts | None = counts) -> Appended | None:
                    observation = self._observation(batch_id)
                    rows = self.splitter.dead_letter_rows(stamped, observation)
                    result = self._append(dead_letter_writer, rows, batch_id, properties, phases)
                    if result is not None and counts is not None:
                        self._check_dead_letters(batch_id, counts, observation)
                    return result

                appended.append(
                    (
                        dead_letter_writer,
                        self.retry.attempt(dead_letter_writer.identifier, batch_id, dead_letters),
                    )
                )
        finally:
            if cached:
                stamped.unpersist()
        self._expect_dead_letters = counts is None or counts.dead_lettered > 0
        self._previous_read = None if counts is None else counts.read
        self.accounting.account(batch_id, counts, appended, time.monotonic() - started, phases)

    # A query's batch (router/together.py) writes every topic's tables in one Spark job, each topic's
    # rows given by `combined_rows`, and accounts each topic's part with `written_together`.

    def write_tasks(self) -> int:
        """How many tasks write the topic's next batch: one per `records_per_write_task` records its last
        batch read, up to `write_tasks` (write_tasks_for)."""
        return write_tasks_for(self._previous_read, self._write_tasks, self.settings.records_per_write_task)

    def replayed(self, batch_id: int) -> bool:
        """Whether either table already holds batch `batch_id`: a replay."""
        return any(self.holding(batch_id))

    def holding(self, batch_id: int) -> tuple[bool, bool]:
        """Whether the archive table, and the dead-letter table, hold batch `batch_id` already."""
        self._started.wait()
        assert self._writers is not None
        archive, dead_letters = (writer.last_committed >= batch_id for writer in self._writers)
        return archive, dead_letters

    def forget_commits(self) -> None:
        """A write may have committed, or not: the next batch reads the tables' snapshots again."""
        for writer in self._writers or ():
            writer.committed(None)

    def topic_rows(self, records: DataFrame, batch_id: int) -> Any:
        """The plan of the topic's rows from its records (TopicRows, in router/jvm: its archive rows and
        dead letters, RecordSplitter.combined_rows), made once per schema of the topic; with a schema
        registry, its versions are brought up to date for this batch first."""
        if self.registry is not None:
            self.registry.before_batch(records, batch_id, self.tables.evolve)
            self.layout, self.splitter = self.registry.layout, self.registry.splitter
        if self._rows_plan is None or self._rows_plan[0] is not self.splitter:
            # In the tables' column order, which may not be the rows' (a table evolved or made by others).
            columns = self.tables.columns(self.layout)
            splitter = self.splitter

            def plan() -> Any:
                template = records.sparkSession.createDataFrame([], records.schema)
                return rows_plan(splitter.combined_rows(splitter.stamp(template), columns))

            made_of = None
            if splitter.made_of is not None:
                made_of = (*splitter.made_of, records.schema.json(), columns[0].json(), columns[1].json())
            self._rows_plan = (splitter, shared_plan(records.sparkSession, made_of, plan))
        return self._rows_plan[1]

    def refuse_second_writer(self, batch_id: int, covered: BatchRange, committed: bool = False) -> None:
        """Stop before batch `batch_id` is written when another router's commit since this query's last one
        covers offsets this batch covers: the same topic written into the table twice. `committed`: the
        batch's archive append is committed; look past it, and stop if another's covers the same offsets."""
        assert self._writers is not None
        # The archive table alone, each look being a catalog read per batch: a second writer whose batches
        # hold dead letters alone is not seen.
        for writer in self._writers[:1]:

            def look(writer: BatchTableWriter = writer) -> list[Overlap]:
                return writer.overlapping(self.origin, covered, batch_id if committed else None)

            # Reading the table's snapshots waits out a catalog's outage as a commit does.
            overlaps = self.retry.attempt(writer.identifier, batch_id, look)
            if overlaps:
                raise self.second_writer(batch_id, overlaps[0].describe(), committed)

    def second_writer(self, batch_id: int, commit: str, committed: bool) -> SecondWriter:
        """The error that stops the router when another router's `commit` ("query Q committed partition P
        offsets A to B in snapshot S") covers offsets batch `batch_id` covers; `committed`: found after this
        batch's own commit."""
        assert self._writers is not None
        writer = self._writers[0]
        topic, cluster = self.settings.topic, self.config.query.cluster
        where = f"topic {topic} (cluster {cluster}): another router writes it into "
        if committed:
            return SecondWriter(
                f"{where}{writer.identifier}: its {commit}, and this router's batch {batch_id} (query "
                f"{writer.query_id}) committed the same offsets at the same time: they are archived twice. "
                "This router stops; run one router per topic and table, and delete the rows of one of the "
                "two snapshots"
            )
        return SecondWriter(
            f"{where}{writer.identifier}: its {commit}, which this router's batch {batch_id} (query "
            f"{writer.query_id}) would archive again. This router stops; run one router per topic and table, "
            "or give the other one a table of its own"
        )

    @property
    def identifiers(self) -> tuple[str, str]:
        """The archive table and the dead-letter table."""
        self._started.wait()
        assert self._writers is not None
        return self._writers[0].identifier, self._writers[1].identifier

    def batch_properties(self, batch_id: int, covered: BatchRange) -> dict[str, str]:
        """The snapshot summary of the batch's appends: the query's and batch's ids, and its range."""
        assert self._writers is not None
        return {
            QUERY_ID: self._writers[0].query_id,
            BATCH_ID: str(batch_id),
            **covered.properties(self.origin),
        }

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
        """Batch `batch_id` was written and committed with other topics': count it as `archive` would (a
        `replayed` batch, whose archive held it already, as a replay: its records were counted when
        committed)."""
        assert self._writers is not None
        archive_writer, dead_letter_writer = self._writers
        for writer, took in zip(self._writers, commits, strict=True):
            writer.committed(batch_id)
            if took > 0:
                self.metrics.commit_latency.labels(self.settings.topic, writer.identifier).observe(took)
        self._expect_dead_letters = counts.dead_lettered > 0
        self._previous_read = counts.read
        appended: list[tuple[BatchTableWriter, Appended | None]] = [
            (archive_writer, None if replayed else archived),
            (dead_letter_writer, dead_lettered),
        ]
        phases = {"together": seconds}
        self.accounting.account(batch_id, None if replayed else counts, appended, seconds, phases)

    @property
    def commit_policy(self) -> CommitPolicy:
        return self.settings.commit_policy

    def replayed_whole(self, batch_id: int) -> None:
        """Both tables hold batch `batch_id`: a replay with nothing to write."""
        self.accounting.account(batch_id, None, [], 0.0, {})

    def _append(
        self,
        writer: BatchTableWriter,
        rows: DataFrame,
        batch_id: int,
        properties: dict[str, str],
        phases: dict[str, float],
    ) -> Appended | None:
        commit_started = time.monotonic()
        result = writer.append(rows, batch_id, properties)
        took = time.monotonic() - commit_started
        if result is not None:
            self.metrics.commit_latency.labels(self.settings.topic, writer.identifier).observe(took)
        phases[writer.identifier.rsplit(".", 1)[-1]] = took
        return result

    def _observation(self, batch_id: int) -> Observation:
        return Observation(f"bergstream-router-{self.settings.topic}-{batch_id}-{uuid.uuid4().hex}")

    def _check_dead_letters(self, batch_id: int, counts: BatchCounts, observation: Observation) -> None:
        """The dead-letter pass reads the batch from Kafka again; it should find what the first pass found.

        It may not when Kafka deleted records in between (retention): those dead letters are lost, and
        said so."""
        dead_lettered = int(observation.get[DEAD_LETTERED])
        if dead_lettered != counts.dead_lettered:
            log.error(
                "%s batch %d: %d records failed to parse when archived but %d were dead-lettered on the "
                "second read from Kafka; records expired from Kafka in between?",
                self.settings.topic, batch_id, counts.dead_lettered, dead_lettered,
            )  # fmt: skip
