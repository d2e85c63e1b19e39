"""`bergstream router run --pattern REGEX`: one streaming query archives every topic whose name matches.

A query per topic pays Spark's fixed cost of a micro-batch once per topic and trigger, whatever the
topic's traffic; a new topic needs a settings file and a restart. Here one Kafka query reads every
matching topic (Spark's `subscribePattern`, which finds topics created later at each trigger), and its
micro-batch is split by topic: each topic's rows are appended to its own archive and dead-letter tables,
each exactly once per batch under the query's and the batch's ids, with the Kafka range the batch covers
in that topic (the same snapshot properties as a topic's own router: positions.py). A topic is archived
as its own router archives it (archiver.py), with its own accounting, metrics and consumer group
`bergstream-router.<topic>`, committed after each batch.

What costs a batch grows with the topics that have records in it, not with those matched: a quiet topic
costs nothing but its place in the offset log. One Spark job reads the batch from Kafka and writes every
topic's Parquet files (TopicRows and TopicTables, in router/jvm); the driver then commits each topic's
tables, several at once. A topic this job cannot write (a table made elsewhere, a replayed batch, a topic
dead-lettered whole, a write together that failed) is appended on its own by Spark's writer; the batch is
cached first only when some topic reads it again that way.

A topic's settings are its own file (`<topics dir>/<topic>.yaml`) where one exists, else the defaults
file (`--defaults`, or the site's `topic_defaults`), each over the site's or the local stack's endpoints.
Its table is created on its first batch. The query's own settings (Kafka connection, trigger, rate limit,
checkpoint) come from the defaults file alone. A topic whose settings do not load, or whose schema cannot
be found, is not dropped and stops no other: its records go to its dead-letter table, whole, each with
the reason, and its settings are read again every `RETRY_SETTINGS_SECONDS` until they load;
`bergstream router redrive` then archives the dead letters.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from bergstream.catalog import CatalogConfig
from bergstream.errors import BergstreamError, ConfigError, first_line
from bergstream.kafka_settings import librdkafka_settings
from bergstream.kafka_source import isolation_level
from bergstream.kafka_topics import topic_ids
from bergstream.query import QueryRunner
from bergstream.router.accounting import BatchAccounting, RouterTotals
from bergstream.router.app import start_archive_query
from bergstream.router.archive_tables import ArchiveTables
from bergstream.router.archiver import BatchArchiver
from bergstream.router.commit_retry import CommitRetry
from bergstream.router.config import (
    DeploySettings,
    KafkaOptions,
    RouterConfig,
    TriggerInterval,
    check_topic_name,
    table_for_topic,
)
from bergstream.router.consumer_group import GroupCommitter, SharedKafka
from bergstream.router.counts import BatchCounts, PartitionRead, from_observation, observed_columns
from bergstream.router.expired import ExpiredOffsets
from bergstream.router.fleet import failure_reason
from bergstream.router.identity import (
    FLOORS_FILE,
    CheckpointFile,
    TopicIdentity,
    TopicRecreated,
    refuse_another,
)
from bergstream.router.metrics import RouterMetrics
from bergstream.router.positions import (
    EARLIEST_START,
    checkpoint_has_batches,
    may_hold_records,
    newest_recorded,
    resume_offsets,
    topic_ranges,
)
from bergstream.router.progress import ProgressFollower
from bergstream.router.resume import recorded_positions, starting_offsets
from bergstream.router.retry import CommitRetrySettings
from bergstream.router.schedule import RotatingMaintenance
from bergstream.router.table import ensure_namespace
from bergstream.router.write import Appended, BatchTableWriter
from bergstream.schemas.archive import DEAD_LETTER_SUFFIX, METADATA, dead_letter_create_statements
from bergstream.schemas.parse import ERROR
from bergstream.schemas.positions import EARLIEST, BatchRange, Origin, offsets_json
from bergstream.schemas.stamp import metadata
from bergstream.settings_file import merge, problems, read_mapping, without_none
from bergstream.signals import on_stop_signals
from bergstream.spark import SparkSettings

log = logging.getLogger("bergstream.router.pattern")
# How often the settings of a topic that is being dead-lettered whole are read again.
RETRY_SETTINGS_SECONDS = 60.0
# The Iceberg commits of one batch's topics made at once.
COMMIT_THREADS = 8
_TOPIC_TABLES = "io.bergstream.router.TopicTables"


def _counts(outcome: dict[str, Any]) -> tuple[BatchCounts, Appended, Appended]:
    """A topic's counts of a batch written together with others' (TopicTables.BatchWrite.json), and what
    its archive and dead-letter appends added."""
    archived, dead_lettered, archive_files, archive_bytes, dead_files, dead_bytes, newest = (
        int(value) for value in outcome["totals"]
    )
    partitions = tuple(
        PartitionRead(int(partition), int(read), int(first), int(last))
        for partition, (read, first, last) in sorted(outcome["partitions"].items(), key=lambda p: int(p[0]))
    )
    counts = BatchCounts(
        read=sum(p.read for p in partitions),
        archived=archived,
        newest=None if newest == _NO_TIME else datetime.fromtimestamp(newest / 1e6, UTC),
        partitions=partitions,
    )
    return (
        counts,
        Appended(archived, archive_files, archive_bytes),
        Appended(dead_lettered, dead_files, dead_bytes),
    )


# Java's Long.MIN_VALUE: no record, no time.
_NO_TIME = -(2**63)


class PatternConfig(BaseModel):
    """The query's own settings: from the defaults file over the endpoints, the flags over both. The keys of
    a topic's settings that concern one topic (its schema, table, maintenance) are for the topics."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    pattern: str
    kafka: KafkaOptions = Field(repr=False)
    cluster: str = "local"
    trigger_interval: TriggerInterval = "30 seconds"
    max_offsets_per_trigger: int | None = Field(default=1_000_000, gt=0)
    checkpoint_location: str
    catalog: CatalogConfig
    spark: SparkSettings = Field(default_factory=SparkSettings)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "0.0.0.0"
    lag_refresh_seconds: float = Field(default=15.0, gt=0)
    commit_retry: CommitRetrySettings = Field(default_factory=CommitRetrySettings)
    # How many topics of one batch are appended at once; unset, the driver's cores.
    parallel_topics: int | None = Field(default=None, gt=0)
    # How `bergstream deploy --pattern` renders the query's driver.
    deploy: DeploySettings = Field(default_factory=DeploySettings)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        check_topic_name(name)  # it names the checkpoint's folder as a topic's name does
        return name

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"{pattern!r} is not a regular expression: {error}") from error
        return pattern

    @property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)


def pattern_name(pattern: str) -> str:
    """The name of a pattern's router when none is given: its Spark query, checkpoint and own group."""
    return f"pattern-{hashlib.sha256(pattern.encode()).hexdigest()[:10]}"


def pattern_defaults(defaults_file: Path | None, defaults: dict[str, Any]) -> dict[str, Any]:
    """The defaults file over `defaults` (the endpoints): every topic's settings and the query's."""
    from_file: dict[str, Any] = {}
    if defaults_file is not None:
        if not defaults_file.is_file():
            raise ConfigError(f"--defaults {defaults_file}: no such file")
        from_file = read_mapping(defaults_file)
        if "topic" in from_file:
            raise ConfigError(
                f"{defaults_file}: names topic {from_file['topic']!r}, but the defaults are every topic's; "
                "leave `topic` out"
            )
    if "catalog" in from_file:
        defaults = {key: value for key, value in defaults.items() if key != "catalog"}
    return merge(defaults, from_file)


def load_pattern_config(
    pattern: str,
    name: str,
    defaults_file: Path | None,
    defaults: dict[str, Any],
    overrides: dict[str, Any],
) -> PatternConfig:
    """The query's settings: `defaults` (the endpoints), the defaults file, `overrides` (the flags)."""
    merged = merge(pattern_defaults(defaults_file, defaults), without_none(overrides))
    merged.update(name=name, pattern=pattern)
    where = defaults_file if defaults_file is not None else f"the router of {pattern!r}"
    try:
        return PatternConfig.model_validate(merged)
    except ValidationError as error:
        raise ConfigError(f"{where}: {problems(error)}") from error


class TopicArchive:
    """One topic's share of the query: its tables, archiver, accounting, lag and consumer group."""

    def __init__(
        self,
        config: RouterConfig,
        spark: SparkSession,
        metrics: RouterMetrics,
        stopping: threading.Event,
        kafka: GroupCommitter,
    ) -> None:
        self.config = config
        self.topic = config.topic
        self.kafka = kafka
        self.expired = ExpiredOffsets(config.topic, kafka, metrics)
        self.accounting = BatchAccounting(config.topic, metrics, self.expired)
        self.tables = ArchiveTables(spark, config)
        retry = CommitRetry(config.topic, config.commit_retry, metrics, stopping)
        self.archiver = BatchArchiver(spark, config, metrics, self.tables, retry, self.accounting)
        self.follower = ProgressFollower(
            config.topic, kafka, metrics, self.expired, lambda: self.accounting.newest_ingestion,
            config.lag_refresh_seconds, cluster=config.cluster,
        )  # fmt: skip
        self.tables.prepare(self.archiver.layout)

    @property
    def totals(self) -> RouterTotals:
        return self.accounting.totals

    def positions(self, spark: SparkSession) -> dict[int, int] | None:
        """Where the topic's tables say its archive ends; None when they record no position."""
        archiver = self.archiver
        return recorded_positions(
            spark, self.config, archiver.origin, archiver.layout, archiver.splitter, self.kafka
        )

    def resume(self, spark: SparkSession) -> dict[int, int] | None:
        """Where the topic starts when the query's checkpoint holds no batch: where its tables end."""
        archiver = self.archiver
        return starting_offsets(
            spark, self.config, archiver.origin, archiver.layout, archiver.splitter, self.kafka
        )

    def identify(self, spark: SparkSession, checkpoint: str) -> None:
        """Learn the topic's Kafka id, refusing one that the query's checkpoint or the topic's tables record
        otherwise; the tables' commits record it from then on."""
        archiver = self.archiver
        layout = archiver.layout
        tables = [self.config.catalog.table_identifier(t) for t in (layout.table, layout.dead_letter_table)]
        identity = TopicIdentity(self.topic, self.config.cluster, self.kafka)
        archiver.origin = replace(archiver.origin, topic_id=identity.at_start(spark, checkpoint, tables))

    def started(self, query: StreamingQuery) -> None:
        self.archiver.started(query, "latest")  # each batch is given its range
        self.follower.start(refresh=False)

    def archive(self, records: DataFrame, batch_id: int, covered: BatchRange) -> None:
        self.archiver.archive(records, batch_id, covered)


class RejectedTopic:
    """A matching topic that cannot be archived (its settings do not load, its schema is not found): each
    of its records goes to its dead-letter table with `reason`, under the same exactly-once append."""

    def __init__(
        self,
        topic: str,
        reason: str,
        config: PatternConfig,
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
        if not spark.catalog.tableExists(self.identifier):
            for statement in dead_letter_create_statements(self.identifier):
                spark.sql(statement)
        log.error("topic %s is dead-lettered whole into %s: %s", topic, self.identifier, reason)

    @property
    def totals(self) -> RouterTotals:
        return self.accounting.totals

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

    def started(self, query: StreamingQuery) -> None:
        self._writer = BatchTableWriter(self.spark, self.identifier, str(query.id))
        self.follower.start(refresh=False)

    def archive(self, records: DataFrame, batch_id: int, covered: BatchRange) -> None:
        writer = self._writer
        assert writer is not None
        started = time.monotonic()
        stamped = records.select("*", F.lit(self.reason).alias(ERROR), metadata(self.config.cluster))
        observation = Observation(f"bergstream-router-{self.topic}-{batch_id}-{uuid.uuid4().hex}")
        rows = stamped.observe(observation, *self._counting).select(
            F.col("key").alias("raw_key"),
            F.col("value").alias("raw_value"),
            F.col(ERROR).alias("error"),
            F.lit(None).cast("string").alias("schema_name"),
            F.col(METADATA),
        )
        properties = covered.properties(
            Origin(self.topic, self.config.cluster, isolation_level(self.config.kafka))
        )
        result = self.retry.attempt(
            self.identifier, batch_id, lambda: writer.append(rows, batch_id, properties)
        )
        counts = None if result is None else from_observation(observation.get)
        phases = {self.identifier.rsplit(".", 1)[-1]: time.monotonic() - started}
        self.accounting.account(batch_id, counts, [(writer, result)], time.monotonic() - started, phases)


Topic = TopicArchive | RejectedTopic


class PatternRouter:
    """The query of every topic `config.pattern` matches. `load(topic)` reads a topic's settings."""

    def __init__(
        self,
        config: PatternConfig,
        load: Callable[[str], RouterConfig],
        spark: SparkSession,
        metrics: RouterMetrics,
        stopping: threading.Event | None = None,
    ) -> None:
        self.config = config
        self.spark = spark
        self.metrics = metrics
        self._load = load
        self._stopping = stopping or threading.Event()
        self.kafka = SharedKafka(
            config.name, librdkafka_settings(config.kafka, prefix="kafka."), isolation_level(config.kafka)
        )
        self.topics: dict[str, Topic] = {}
        self._tables: dict[str, str] = {}  # table name: the topic archived into it
        self._adding = threading.Lock()
        self.runner = QueryRunner(f"the router of {config.pattern!r}", self._start, self._stopping)
        self._query: StreamingQuery | None = None
        self._started = threading.Event()
        self._starting = "latest"
        self._resume: dict[str, dict[int, int]] | None = None
        self._previous: tuple[int, dict[str, dict[int, int]]] | None = None
        self._fresh_checkpoint = False
        # Per topic new to the checkpoint, where its tables say its archive ends: its rows below are dropped
        # until its ranges start past it (kept beside the checkpoint, for a restart meanwhile).
        self._floor_file = CheckpointFile(spark, config.checkpoint_location, FLOORS_FILE)
        self._floors = {
            str(topic): {int(p): int(o) for p, o in floor.items()}
            for topic, floor in self._floor_file.read().items()
        }
        self._followed_batch: int | None = None
        workers = config.parallel_topics or spark.sparkContext.defaultParallelism
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="bergstream-topic")
        self._cores = max(1, spark.sparkContext.defaultParallelism)
        # Commits are mostly waits on the catalog and the object store: more at once than cores.
        self._commit_threads = max(COMMIT_THREADS, workers)

    @property
    def running(self) -> bool:
        return self.runner.running

    def stop(self) -> None:
        self._stopping.set()

    def run(self, available_now: bool = False) -> dict[str, RouterTotals]:
        """Until stopped (with `available_now`, until every matching topic is archived as it is now)."""
        config = self.config
        self._available_now = available_now
        refreshing = threading.Event()
        # Maintenance on a schedule belongs to a router that keeps running, not to one draining the topics.
        maintenance = None
        if not available_now:
            maintenance = RotatingMaintenance(self.spark, self.metrics, self._archived_topics)
        try:
            ensure_namespace(self.spark, config.catalog)
            matching = self.kafka.topics(config.regex)
            log.info(
                "%d topics match %r: %s", len(matching), config.pattern, ", ".join(matching) or "none yet"
            )
            # Side by side: each topic's settings, schema and tables take a fraction of a second.
            list(self._pool.map(self._add, matching))
            if not checkpoint_has_batches(self.spark, config.checkpoint_location):
                # The first batch starts each topic known now where its tables end (or, recording none,
                # where the settings say): no floor to look for in it.
                self._fresh_checkpoint = True
                self._resume = self._resume_offsets()
            threading.Thread(
                target=self._refresh_lag, args=(refreshing,), name="bergstream-lag", daemon=True
            ).start()
            log.info("the router of %r checkpoints to %s", config.pattern, config.checkpoint_location)
            if maintenance is not None:
                maintenance.start()
            with on_stop_signals(self._stopping.set):
                self.runner.run(self._follow)
        finally:
            refreshing.set()
            if maintenance is not None:
                maintenance.stop()
            if self.runner.query is not None:
                self._follow(self.runner.query)
            self._pool.shutdown(wait=True)
            self.kafka.close()
        return {topic: archive.totals for topic, archive in sorted(self.topics.items())}

    def _archived_topics(self) -> list[RouterConfig]:
        """The settings of the topics archived (not dead-lettered whole), those met later included."""
        return [archive.config for archive in list(self.topics.values()) if isinstance(archive, TopicArchive)]

    def _add(self, topic: str) -> Topic:
        """The topic's share of the query, its tables made: archived, or dead-lettered whole."""
        added: Topic
        try:
            settings = self._load(topic)
            with self._adding:
                owner = self._tables.setdefault(settings.table, topic)
            if owner != topic:
                raise ConfigError(
                    f"table {settings.table} already archives topic {owner}; give {topic} its own"
                )
            added = TopicArchive(settings, self.spark, self.metrics, self._stopping,
                                 self.kafka.committer(topic, settings.consumer_group))  # fmt: skip
            added.identify(self.spark, self.config.checkpoint_location)
        except TopicRecreated:
            raise  # its records belong to no table yet: the router stops, saying what to do
        except (ConfigError, BergstreamError) as error:
            committer = self.kafka.committer(topic, f"bergstream-router.{topic}")
            added = RejectedTopic(
                topic, first_line(error), self.config, self.spark, self.metrics, self._stopping, committer
            )
        self.topics[topic] = added
        return added

    def _check_ids(self, topics: list[str], batch_id: int) -> None:
        """Stop before batch `batch_id` is written when one of `topics` is no longer the topic it was when
        the router met it (deleted and created again): one request for all of them."""
        known = {
            topic: archive.archiver.origin.topic_id
            for topic in topics
            if isinstance(archive := self.topics[topic], TopicArchive) and archive.archiver.origin.topic_id
        }
        try:
            current_ids = topic_ids(self.kafka.admin, sorted(known))
        except Exception as error:  # Kafka out for a moment: Spark's reader waits it out, or fails
            log.warning("batch %d is written without checking its topics' ids: %s", batch_id, error)
            return
        for topic, current in current_ids.items():
            where = f"the router, which met it and was about to write batch {batch_id},"
            refuse_another(topic, current, known[topic], where)

    def _resume_offsets(self) -> dict[str, dict[int, int]] | None:
        """Per topic and partition, where a query without checkpoint starts: where the topic's tables end;
        None when no table records a position (the settings' startingOffsets hold)."""
        resumed = {topic: archive.resume(self.spark) for topic, archive in self.topics.items()}
        if all(offsets is None for offsets in resumed.values()):
            return None
        # Spark takes exact offsets only for every partition of every topic: the others start where the
        # settings say, by Spark's numbers for earliest (-2) and latest (-1).
        fallback = -1 if self.config.kafka.get("startingOffsets", "latest") == "latest" else -2
        starting = {}
        for topic, offsets in resumed.items():
            if offsets is None:
                offsets = dict.fromkeys(self.topics[topic].kafka.partitions(), fallback)
            starting[topic] = offsets
        return starting

    def _start(self) -> StreamingQuery:
        config = self.config
        options = dict(config.kafka)
        if self._resume is not None:
            options["startingOffsets"] = json.dumps(
                {
                    topic: {str(p): o for p, o in sorted(offsets.items())}
                    for topic, offsets in self._resume.items()
                }
            )
        interval = None if self._available_now else config.trigger_interval
        query = start_archive_query(
            self.spark, config.pattern, options, config.max_offsets_per_trigger, config.name, self._archive,
            config.checkpoint_location, interval, pattern=True,
        )  # fmt: skip
        self._query = query
        self._starting = options.get("startingOffsets", "latest")
        self._previous = None
        for archive in self.topics.values():
            archive.started(query)
        self._started.set()
        return query

    def _archive(self, records: DataFrame, batch_id: int) -> None:
        self._started.wait()
        query = self._query
        assert query is not None
        previous = self._previous[1] if self._previous and self._previous[0] == batch_id - 1 else None
        ranges = topic_ranges(query, batch_id, self._starting, previous)
        self._previous = (batch_id, {topic: covered.end for topic, covered in ranges.items()})
        busy = sorted(topic for topic, covered in ranges.items() if may_hold_records(covered))
        if not busy:
            return
        for topic in busy:
            self._topic_for_batch(topic, query)
        self._check_ids(busy, batch_id)
        records = self._above_floors(records, batch_id, ranges, busy)
        source = records.coalesce(min(self._cores, len(busy)))
        together = self._together(batch_id, busy)
        # The one job that writes every topic together reads Kafka itself. Where the batch's records are
        # read again (a topic archived alone, a schema registry's versions looked up first), they are read
        # from Kafka once, into memory, for all of them.
        cached = False

        def cache() -> None:
            nonlocal source, cached
            if not cached and len(busy) > 1:
                source = source.persist(StorageLevel.MEMORY_AND_DISK)
                source.count()
                cached = True

        archivers = [self.topics[topic].archiver for topic in together]  # type: ignore[union-attr]
        if len(together) < len(busy) or any(archiver.registry is not None for archiver in archivers):
            cache()
        try:
            alone = [topic for topic in busy if topic not in together]
            alone += self._write_together(source, batch_id, ranges, together)
            if alone:
                cache()
            futures = {
                topic: self._pool.submit(
                    self.topics[topic].archive,
                    source.where(F.col("topic") == topic),
                    batch_id,
                    ranges[topic],
                )
                for topic in alone
            }
            failed = []
            for topic, future in futures.items():
                error = future.exception()
                if error is not None:
                    log.error("batch %d of topic %s failed: %s", batch_id, topic, first_line(error))
                    failed.append(error)
            if failed:
                raise failed[0]
        finally:
            if cached:
                source.unpersist()

    def _above_floors(
        self, records: DataFrame, batch_id: int, ranges: dict[str, BatchRange], busy: list[str]
    ) -> DataFrame:
        """Spark reads a topic new to the checkpoint (met mid-query, or back in it) from its earliest offset,
        where no other start can be given. Where the topic's tables record where its archive ends (its own
        router before, this query before it left), its rows below that floor are dropped and its range
        raised to it (`ranges` changed in place): never archived twice."""
        excluded: Column | None = None
        for topic in busy:
            floor = self._floor(topic, ranges[topic], batch_id)
            if floor is None:
                continue
            ranges[topic] = ranges[topic].raised_to(floor)
            for partition, offset in floor.items():
                below = (
                    (F.col("topic") == topic) & (F.col("partition") == partition) & (F.col("offset") < offset)
                )
                excluded = below if excluded is None else excluded | below
        return records if excluded is None else records.where(~excluded)

    def _floor(self, topic: str, covered: BatchRange, batch_id: int) -> dict[int, int] | None:
        """The topic's floor in this batch: found in its tables when it is new to the checkpoint (its range
        starts at `earliest`), kept until every partition's range starts past it."""
        new = covered.start == EARLIEST_START and not (batch_id == 0 and self._fresh_checkpoint)
        if topic not in self._floors and new:
            share = self.topics[topic]
            retry = share.archiver.retry if isinstance(share, TopicArchive) else share.retry
            # Its tables are read as a commit would be: through a catalog's outage.
            positions = retry.attempt(topic, batch_id, lambda: share.positions(self.spark)) or {}
            found = {p: offset for p, offset in positions.items() if offset != EARLIEST}
            if found:
                log.warning(
                    "topic %s is new to the query's checkpoint, and Spark reads it from its earliest offset; "
                    "its tables record that its archive ends at %s: the records below are dropped, not "
                    "archived twice", topic, offsets_json(found),
                )  # fmt: skip
                self._floors[topic] = found
                self._floor_file.put(topic, {str(p): o for p, o in sorted(found.items())})
        floor = self._floors.get(topic)
        if floor is None:
            return None
        start = covered.start
        if isinstance(start, dict) and all(start.get(p, 0) >= offset for p, offset in floor.items()):
            del self._floors[topic]
            self._floor_file.put(topic, None)
            return None
        return floor

    def _together(self, batch_id: int, busy: list[str]) -> list[str]:
        """The busy topics whose tables can be written together; the others are archived one by one:
        dead-lettered whole, replayed (a table holds the batch already), or whose tables' last batch
        cannot be read now (the catalog out: the topic's own path waits for it, as its own router does)."""
        together = []
        for topic in busy:
            archive = self.topics[topic]
            if not isinstance(archive, TopicArchive):
                continue
            try:
                if archive.archiver.replayed(batch_id):
                    continue
            except Exception as error:
                log.warning("batch %d of topic %s: its tables' last batch cannot be read (%s); alone now",
                            batch_id, topic, failure_reason(error))  # fmt: skip
                continue
            together.append(topic)
        return together

    def _write_together(
        self, source: DataFrame, batch_id: int, ranges: dict[str, BatchRange], together: list[str]
    ) -> list[str]:
        """Write the tables of the topics `together` in one Spark job and commit them, several at once
        (TopicTables, in router/jvm); the topics left to archive one by one: those whose rows cannot be
        planned apart, or whose write failed (their archiver tries again, and finds what landed)."""
        started = time.monotonic()
        together = list(together)
        alone: list[str] = []
        if not together:
            return alone
        archivers = []
        plans = []
        for topic in list(together):
            archiver = self.topics[topic].archiver  # type: ignore[union-attr]
            records = source.where(F.col("topic") == topic) if archiver.registry is not None else source
            try:
                plans.append(archiver.topic_rows(records, batch_id))
            except Exception as error:  # a parse Spark cannot plan apart: that topic goes alone
                log.warning("topic %s: its rows cannot be planned apart (%s); archived alone",
                            topic, first_line(error))  # fmt: skip
                together.remove(topic)
                alone.append(topic)
                continue
            archivers.append(archiver)
        if not together:
            return alone
        identifiers = [archiver.identifiers for archiver in archivers]
        properties = [
            archiver.batch_properties(batch_id, ranges[topic])
            for topic, archiver in zip(together, archivers, strict=True)
        ]
        planned = time.monotonic()
        jvm = self.spark._jvm
        assert jvm is not None
        try:
            written = getattr(jvm, _TOPIC_TABLES).append(
                self.spark._jsparkSession,
                source._jdf,
                source.columns.index("topic"),
                together,
                plans,
                [archive for archive, _ in identifiers],
                [dead_letters for _, dead_letters in identifiers],
                properties,
                int(time.time() * 1_000_000),
                self._cores,
                self._commit_threads,
            )
        except Exception as error:
            # The catalog or the warehouse out, most often: each topic alone waits the outage out
            # (CommitRetry), and finds what landed before it.
            log.warning("batch %d: writing %d topics together failed (%s); each alone now", batch_id,
                        len(together), failure_reason(error))  # fmt: skip
            for archiver in archivers:
                archiver.forget_commits()
            return alone + together
        seconds = time.monotonic() - started
        tables_ms, job_ms, commit_ms = (int(ms) for ms in written.millis())
        log.info(
            "batch %d: %d topics written together in %.1fs: their plans in %.1fs, their tables loaded "
            "in %.1fs, one job of %.1fs, %d commits in %.1fs", batch_id,
            len(together), seconds, planned - started, tables_ms / 1000, job_ms / 1000, len(together),
            commit_ms / 1000,
        )  # fmt: skip
        for topic, archiver, outcome in zip(together, archivers, json.loads(written.json()), strict=True):
            refused = outcome["error"]
            if refused is not None:
                log.warning("batch %d of topic %s: writing it with the other topics failed (%s); alone now",
                            batch_id, topic, refused)  # fmt: skip
                archiver.forget_commits()
                alone.append(topic)
                continue
            archiver.written_together(batch_id, *_counts(outcome), seconds)
        return alone

    def _topic_for_batch(self, topic: str, query: StreamingQuery) -> Topic:
        """The topic's share, added when the query meets it first; a rejected topic's settings read again
        once in a while."""
        archive = self.topics.get(topic)
        if archive is None:
            log.info("topic %s matches %r: archiving it from its first offset", topic, self.config.pattern)
            archive = self._add(topic)
            archive.started(query)
        elif (
            isinstance(archive, RejectedTopic)
            and time.monotonic() - archive.rejected_at > RETRY_SETTINGS_SECONDS
        ):
            archive.rejected_at = time.monotonic()
            again = self._add(topic)
            if isinstance(again, TopicArchive):
                log.info("topic %s: its settings load now; archiving it", topic)
                again.accounting.totals.add(archive.totals)
            again.started(query)
            archive = again
        return archive

    def _follow(self, query: StreamingQuery) -> None:
        """Commit every topic's consumer group to where Spark checkpointed the query."""
        progress = query.lastProgress
        if progress is None or not progress.sources or progress.batchId == self._followed_batch:
            return
        self._followed_batch = progress.batchId
        end_offsets = json.loads(progress.sources[0].json).get("endOffset")
        if not end_offsets:
            return
        text = json.dumps(end_offsets)
        for topic in end_offsets:
            archive = self.topics.get(topic)
            if archive is not None:
                archive.follower.on_progress(text, measure=False)

    def _refresh_lag(self, stop: threading.Event) -> None:
        while not stop.wait(self.config.lag_refresh_seconds):
            for archive in list(self.topics.values()):
                archive.follower.refresh()


def topic_settings(
    config: PatternConfig,
    defaults_file: Path | None,
    topics_dir: Path | None,
    endpoints: Callable[[str], dict[str, Any]],
    overrides: dict[str, Any],
) -> Callable[[str], RouterConfig]:
    """Reads a matching topic's settings: its own file over `defaults_file` over `endpoints(topic)`, or the
    defaults file alone; the query's checkpoint and cluster are the topic's."""
    from bergstream.router.config import load_router_config, topic_file

    def load(topic: str) -> RouterConfig:
        own = topic_file(topic, topics_dir)
        if not own.is_file() and defaults_file is None:
            raise ConfigError(
                f"topic {topic}: no settings file {own}, and no defaults for topics without one "
                "(--defaults, or the site's topic_defaults)"
            )
        under = endpoints(topic)
        if own.is_file() and defaults_file is not None:
            from_defaults = read_mapping(defaults_file)
            if "catalog" in from_defaults:
                under = {key: value for key, value in under.items() if key != "catalog"}
            under = merge(under, from_defaults)
        path = own if own.is_file() else defaults_file
        assert path is not None
        forced = {"checkpoint_location": config.checkpoint_location, "cluster": config.cluster}
        settings = load_router_config(topic, path, under, {**overrides, **forced})
        if settings.catalog != config.catalog:
            raise ConfigError(
                f"topic {topic}: {path} names another catalog than the router of {config.pattern!r}; the "
                "topics of one query share their catalog"
            )
        return settings

    return load
