"""One streaming query over a set of topics: named ones (`router run --topic`, `--all`, `--group`) or every
topic whose whole name a pattern matches (`--pattern`, topics created later too).

Its micro-batch is split by topic: each topic's rows are appended to its own archive and dead-letter
tables, each exactly once per batch under the query's and the batch's ids, with the Kafka range the batch
covers in that topic (offset_log.py), by the topic's worker (router/topic), with its own accounting,
metrics and consumer group `bergstream-router.<topic>`, committed after each batch. A batch costs what its
topics with records cost: a quiet topic nothing but its place in the offset log, another what a router of
its own always did (it is the same code).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from bergstream.kafka_settings import librdkafka_settings
from bergstream.kafka_source import SOURCE_DEFAULTS, isolation_level, kafka_ranges
from bergstream.query import QueryRunner, foreach_batch
from bergstream.router.accounting import RouterTotals
from bergstream.router.config import RouterConfig
from bergstream.router.consumer_group import SharedKafka
from bergstream.router.driver.batch import BatchArchive, policies
from bergstream.router.driver.behind import SetAside
from bergstream.router.driver.floors import Floors
from bergstream.router.driver.members import Members
from bergstream.router.driver.settings import DriverSettings
from bergstream.router.driver.unread import UnreadRanges, check_retention
from bergstream.router.identity import CheckpointFile, TopicRecreated
from bergstream.router.metrics import RouterMetrics
from bergstream.router.offset_log import (
    checkpoint_has_batches,
    checkpoint_query_id,
    last_committed_batch,
    logged_offsets,
    may_hold_records,
    moved_back,
    topic_ranges,
)
from bergstream.router.pending import PendingCommits
from bergstream.router.table import ensure_namespace
from bergstream.router.together import TogetherWriter
from bergstream.router.topic import TopicWorker

log = logging.getLogger("bergstream.router.driver")
POOL_PROPERTY = "spark.scheduler.pool"
GROUP = "kafka.group.id"
# The Iceberg commits of one batch's topics made at once.
COMMIT_THREADS = 8
# The most topics whose lag is measured after each batch, rather than every lag_refresh_seconds alone.
MEASURED_EACH_BATCH = 8


def pool_name(query: str) -> str:
    """The FAIR scheduling pool of a query's jobs: a query with a backlog holds back no other."""
    return f"bergstream-router.{query}"


class TopicsQuery:
    """The query of `settings`. `load(topic)` reads a topic's settings; `strict` (topics named one by one):
    each must load and exist in Kafka at start."""

    def __init__(
        self,
        settings: DriverSettings,
        load: Callable[[str], RouterConfig],
        spark: SparkSession,
        metrics: RouterMetrics,
        stopping: threading.Event | None = None,
        strict: bool = False,
        on_added: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.spark = spark
        self.metrics = metrics
        self._stopping = stopping or threading.Event()
        self.kafka = SharedKafka(
            settings.name,
            librdkafka_settings(settings.kafka, prefix="kafka."),
            isolation_level(settings.kafka),
        )
        self.unread = UnreadRanges(spark, settings.checkpoint_location, metrics, settings.trigger_seconds)
        # Where a topic's archive ends is where this query's commits say (a fresh checkpoint: any query's,
        # where it starts each topic).
        query_id = checkpoint_query_id(spark, settings.checkpoint_location)

        def added(topic: str) -> None:
            # Where its tables end, read at start: what it has unread starts there.
            worker = self.members.topics[topic]
            self.unread.known(topic, worker.archived_at_start(spark, query_id))
            if on_added is not None:
                on_added(topic)

        self.members = Members(settings, load, spark, metrics, self._stopping, self.kafka, strict, added)
        self.runner = QueryRunner(f"the router of {settings.subscription}", self._start, self._stopping)
        self._query: StreamingQuery | None = None
        self._started = threading.Event()
        # Held by a batch's writes, and by the reads of due topics between batches.
        self._writing = threading.Lock()
        self._available_now = False
        self._starting = "latest"
        self._resume: dict[str, dict[int, int]] | None = None
        self._previous: tuple[int, dict[str, dict[int, int]]] | None = None
        self._fresh_checkpoint = False
        self._prepared = False
        self._checkpoint_batch: int | None = None
        # This run's last batch whose topics are archived or set aside: catch-ups between batches use its id.
        self._archived_batch: int | None = None
        # With available_now, the topics not archived as they were when the query ended, with why.
        self.still_behind: dict[str, str] = {}
        self._followed_batch: int | None = None
        workers = settings.parallel_topics or spark.sparkContext.defaultParallelism
        # Its threads' jobs run in the query's pool too: a Python thread inherits no Spark local property.
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, workers), thread_name_prefix="bergstream-topic", initializer=self.in_pool
        )
        cores = max(1, spark.sparkContext.defaultParallelism)
        # Commits are mostly waits on the catalog and the object store: more at once than cores.
        together = TogetherWriter(spark, cores, max(COMMIT_THREADS, workers), metrics)
        self.behind = SetAside(spark, settings.checkpoint_location, dict(settings.kafka))
        floors = Floors(spark, settings.checkpoint_location)
        # Files a driver of an earlier version left pending beside the checkpoint: committed once, at start.
        self.pending = PendingCommits(spark, settings.checkpoint_location, metrics)
        options = {**SOURCE_DEFAULTS, **dict(settings.kafka)}
        # One pool of Spark's consumers, one per partition, for its batches and reads of due ranges alike.
        prefix = options.get("groupIdPrefix", "spark-kafka-relation")
        self._group = f"{prefix}-bergstream-router-{settings.name}"

        def read(ranges: dict[str, tuple[dict[int, int], dict[int, int]]]) -> DataFrame:
            return kafka_ranges(spark, options, ranges, self._group)

        def log_starts(topics: list[str]) -> dict[str, dict[int, int]]:
            return {topic: bounds.start for topic, bounds in self.kafka.log_bounds(topics).items()}

        self.batches = BatchArchive(
            floors, together, self.behind, self._pool, cores, self.unread, read, log_starts, metrics
        )

    def in_pool(self) -> None:
        """This thread's Spark jobs run in the query's scheduling pool."""
        self.spark.sparkContext.setLocalProperty(POOL_PROPERTY, pool_name(self.settings.name))

    @property
    def topics(self) -> dict[str, TopicWorker]:
        return self.members.topics

    @property
    def running(self) -> bool:
        return self.runner.running

    def up(self, topic: str) -> float:
        """1 while the topic is archived by this query running; 0 otherwise (`bergstream_router_topic_up`)."""
        worker = self.members.topics.get(topic)
        archived = worker is not None and worker.archived and topic not in self.behind
        return 1.0 if self.runner.running and archived else 0.0

    def stop(self) -> None:
        self._stopping.set()

    def prepare(self) -> None:
        """Every topic of the query known now, its tables made and its id checked; where a fresh checkpoint
        starts each. Named topics that Kafka lacks are refused when `strict`, else met once created."""
        if self._prepared:
            return
        self._prepared = True
        settings = self.settings
        if settings.topics is not None and self.members.strict:
            # Each asked for by name: a topic just created is in Kafka's answer, and so is a refused ACL. (Its
            # group's ACL is checked before the driver starts: the shared consumer is of no topic's group.)
            for topic in settings.topics:
                self.kafka.committer(topic, f"bergstream-router.{topic}").require_topic(group=False)
            existing = list(settings.topics)
        else:
            existing = self.kafka.topics(settings.regex)
        log.info("%s: %d topics now: %s", settings.subscription, len(existing),
                 ", ".join(existing) or "none yet")  # fmt: skip
        # Made once here: topics creating their tables at once would each try to make the namespace.
        ensure_namespace(self.spark, settings.catalog)
        # Side by side, a fraction of a second each; their ids written beside the checkpoint once for all.
        with CheckpointFile(self.spark, settings.checkpoint_location).gathered():
            list(self._pool.map(self.members.add, existing))
        # Topics that left the query while the router was stopped, with a range unread: read once more, unless
        # deleted (and made again: the recorded offsets are the old topic's), their range then lost.
        left = self.unread.left_before_start()
        if left:
            present = set(self.kafka.topics(re.compile(".*")))

            def rejoin(topic: str) -> None:
                try:
                    self.members.add(topic)
                except TopicRecreated:
                    self.unread.lost_before_start(topic, "was deleted and made again")

            for topic in left:
                if topic not in present:
                    self.unread.lost_before_start(topic, "was deleted")
            list(self._pool.map(rejoin, [topic for topic in left if topic in present]))
        self._check_retention()
        if not checkpoint_has_batches(self.spark, settings.checkpoint_location):
            # The first batch starts each topic known now where its tables end (or, recording none, where the
            # settings say): no floor to look for in it.
            self._fresh_checkpoint = True
            self._resume = self.members.resume_offsets()

    def _check_retention(self) -> None:
        """Refuse a target lag Kafka's retention does not leave room for (unread.py)."""
        lags = {topic: policy.target_lag for topic, policy in policies(self.topics).items()}
        check_retention(self.kafka.admin, {topic: lag for topic, lag in lags.items() if lag})

    def run(self, available_now: bool = False) -> dict[str, RouterTotals]:
        """Until stopped (with `available_now`, until every topic is archived as it is now)."""
        self._available_now = available_now
        refreshing = threading.Event()
        try:
            try:
                self.prepare()
            except TopicRecreated:
                # A topic made again while the router was stopped: files an earlier version left pending
                # from before are its old archive's, committed before the query stops, saying what to do.
                self._recover()
                raise
            threading.Thread(
                target=self._refresh_lag, args=(refreshing,), name="bergstream-lag", daemon=True
            ).start()
            log.info("the router of %s checkpoints to %s", self.settings.subscription,
                     self.settings.checkpoint_location)  # fmt: skip
            self._recover()
            self.runner.run(self._follow)
            unread = self._drain_unread()
            last = self._last_batch() if available_now and self.behind.topics() else None
            if last is not None:
                self.still_behind = self.behind.finish(self.topics, last)
            self.still_behind.update(unread if available_now else {})
        finally:
            refreshing.set()
            if self.runner.query is not None:
                self._follow(self.runner.query)
            self.behind.close()
            self._pool.shutdown(wait=True)
            self.kafka.close()
        return {topic: worker.totals for topic, worker in sorted(self.topics.items())}

    def _start(self) -> StreamingQuery:
        settings = self.settings
        options = dict(settings.kafka)
        if self._resume is not None:
            options["startingOffsets"] = json.dumps(
                {
                    topic: {str(p): o for p, o in sorted(offsets.items())}
                    for topic, offsets in self._resume.items()
                }
            )
        reader = self.spark.readStream.format("kafka").options(**{**SOURCE_DEFAULTS, **options})
        option, subscribed = settings.source_options(every_topic_exists=self.members.strict)
        reader = reader.option(option, subscribed).option("includeHeaders", "true").option(GROUP, self._group)
        if settings.max_offsets_per_trigger is not None:
            reader = reader.option("maxOffsetsPerTrigger", str(settings.max_offsets_per_trigger))
        name = f"bergstream-router-{settings.name}"
        writer = (
            reader.load()
            .writeStream.queryName(name)
            .foreachBatch(foreach_batch(name, self._archive))
            .option("checkpointLocation", settings.checkpoint_location)
        )
        if self._available_now:
            query = writer.trigger(availableNow=True).start()
        else:
            query = writer.trigger(processingTime=settings.trigger_interval).start()
        self._query = query
        self._starting = options.get("startingOffsets", "latest")
        self._previous = None
        for worker in self.topics.values():
            worker.started(query)
        self._started.set()
        return query

    def _archive(self, records: DataFrame, batch_id: int) -> None:
        self._started.wait()
        self.unread.cadence.began(time.monotonic())
        try:
            self._archive_batch(records, batch_id)
        finally:
            self.unread.cadence.ended(time.monotonic())

    def _archive_batch(self, records: DataFrame, batch_id: int) -> None:
        query = self._query
        assert query is not None
        previous = self._previous[1] if self._previous and self._previous[0] == batch_id - 1 else None
        ranges = topic_ranges(query, batch_id, self._starting, previous)
        self._previous = (batch_id, {topic: covered.end for topic, covered in ranges.items()})
        busy_topics = sorted(topic for topic, covered in ranges.items() if may_hold_records(covered))
        # A topic whose end fell below the batch's start holds nothing for Spark: made again with fewer
        # records, it is refused all the same before anything more is archived or committed for it.
        moved = [topic for topic, covered in sorted(ranges.items()) if moved_back(covered)]
        self.members.check_ids([t for t in moved if t in self.topics and t not in busy_topics], batch_id)
        busy = {topic: self.members.for_batch(topic, query) for topic in busy_topics}
        self.members.check_ids(busy_topics, batch_id)
        first_of_fresh_checkpoint = batch_id == 0 and self._fresh_checkpoint
        if self._archived_batch is None and batch_id > 0:
            # This run's first batch: ranges recorded unread end where the checkpoint's last batch did.
            self.unread.ended(logged_offsets(query, batch_id - 1) or {})
        with self._writing:
            self.batches.archive(records, batch_id, ranges, busy, self.topics, first_of_fresh_checkpoint,
                                 self._available_now)  # fmt: skip
            # Before the batch ends (Spark's checkpoint then moves past it): what each topic left unread.
            self.unread.record(batch_id)
        # After the batch: a topic behind has this batch's range set aside too, and its catch-up under this
        # batch's id covers it.
        self._archived_batch = batch_id
        self._catch_up(batch_id)

    def _recover(self) -> None:
        """Commit what a driver before this one left pending on the checkpoint, each table once."""
        self.pending.recover(self.topics, self.behind.set_aside, self.settings.subscription)

    def _drain_unread(self) -> dict[str, str]:
        """The query ended (stopped, or every topic archived as it was): what each topic has unread. The
        topics left unread, with why."""
        if (last := self._last_batch()) is None:
            return {}
        self._ends_from_checkpoint(last)
        with self._writing:
            return self.batches.drain(last, self.topics, self.settings.subscription)

    def _ends_from_checkpoint(self, last: int) -> None:
        """Before this run's first batch: where the checkpoint's last batch ended, from its offset log, for
        the ranges recorded unread when the router stopped."""
        if self._archived_batch is None and self._query is not None:
            self.unread.ended(logged_offsets(self._query, last) or {})

    def _last_batch(self) -> int | None:
        """The query's last batch done: this run's, else (nothing new since the start) its checkpoint's."""
        if self._archived_batch is not None:
            return self._archived_batch
        if self._checkpoint_batch is None:
            self._checkpoint_batch = last_committed_batch(self.spark, self.settings.checkpoint_location)
        return self._checkpoint_batch

    def _catch_up(self, batch_id: int) -> None:
        """Catch up the topics set aside that are due; those that caught up rejoin the query's batches, their
        consumer group committed where they reached."""
        for topic, reached in self.behind.catch_up(self.topics, batch_id, self._stopping):
            worker = self.topics[topic]
            self.unread.rejoined(topic, reached)
            worker.follower.on_progress(json.dumps({topic: {str(p): o for p, o in reached.items()}}))

    def _follow(self, query: StreamingQuery) -> None:
        """Commit every topic's consumer group to where Spark checkpointed the query; catch up the topics set
        aside while no batch runs too."""
        if self.behind.topics():
            last = self._last_batch()
            if last is not None:
                self._catch_up(last)
        # Between batches (Spark runs none while no topic has records): quiet topics read on their lag.
        running = self.runner.running and not self._stopping.is_set()
        if running and self.unread.topics() and self._writing.acquire(blocking=False):
            try:
                last = self._last_batch()
                if last is not None:
                    self._ends_from_checkpoint(last)
                    self.batches.overdue(last, self.topics, self.settings.subscription)
            except BaseException:  # one no retry mends (batch.py): the query stops with it
                query.stop()
                raise
            finally:
                self._writing.release()
        progress = query.lastProgress
        if progress is None or not progress.sources or progress.batchId == self._followed_batch:
            return
        self._followed_batch = progress.batchId
        end_offsets = json.loads(progress.sources[0].json).get("endOffset")
        if not end_offsets:
            return
        text = json.dumps(end_offsets)
        for topic in end_offsets:
            worker = self.topics.get(topic)
            # A topic behind stays at its tables' position until it catches up.
            if worker is not None and topic not in self.behind:
                # A query of a few topics measures their lag after each batch; of many, on the lag timer.
                worker.follower.on_progress(text, measure=len(end_offsets) <= MEASURED_EACH_BATCH)

    def _refresh_lag(self, stop: threading.Event) -> None:
        """Every lag_refresh_seconds, every topic's lag, from its log's bounds read with all the others'."""
        while not stop.wait(self.settings.lag_refresh_seconds):
            workers = list(self.topics.values())
            try:
                bounds = self.kafka.log_bounds([worker.topic for worker in workers])
            except Exception as error:  # Kafka out for a moment: each topic reads its own, or keeps its lag
                log.debug("reading the log bounds of %d topics failed: %s", len(workers), error)
                bounds = {}
            for worker in workers:
                worker.follower.refresh(bounds=bounds.get(worker.topic))
