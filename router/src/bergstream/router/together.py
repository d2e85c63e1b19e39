"""The one writer: every topic of a batch written in one Spark job, each table committed once (TopicTables
and TopicRows, in router/jvm), several commits at once; topics archived and topics dead-lettered whole; of
a replayed batch, the tables that lack it.

A query's batch writes its topics together (`TogetherWriter.write`). A topic whose part of that job could
not be done (its tables' last batch cannot be read now, its rows cannot be planned apart from the others',
its commit failed) is written by the same job on its own (`write_alone`), from its worker, which waits out
outages between attempts (CommitRetry) and finds what landed; so is a topic's catch-up from Kafka. The job
writes any table as Spark's Iceberg writer would (its format, properties, metrics, partition spec, schema
as evolved: the rows are made in its column order). A table it does not write (sorted by another order than
the ingestion time, a column the rows hold and it lacks, a required column the rows lack) is appended by
Spark's writer, the one exception, logged naming why."""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bergstream.errors import first_line
from bergstream.router.batch_counts import BatchCounts, PartitionRead
from bergstream.router.commit_retry import CommitRetry
from bergstream.router.errors import KafkaUnavailable
from bergstream.router.metrics import RouterMetrics
from bergstream.router.retry import java_causes, kafka_unavailable
from bergstream.router.topic import BatchTables, TopicWorker
from bergstream.router.write import BATCH_ID, QUERY_ID, Appended
from bergstream.schemas.archive import INGESTION_TS, METADATA, OFFSET, PARTITION, WRITE_TS
from bergstream.schemas.batch_range import BATCH_START, CLUSTER, NEXT_OFFSETS, TOPIC, BatchRange

log = logging.getLogger("bergstream.router")
_TOPIC_TABLES = "io.bergstream.router.TopicTables"
TOPIC_WRITE = "io.bergstream.router.TopicWrite"
TOPIC_ROWS = "io.bergstream.router.TopicRows"
# Java's Long.MIN_VALUE: no record, no time.
_NO_TIME = -(2**63)


def failure_reason(error: BaseException) -> str:
    """One line: the Java exception and its deepest cause for an error from Spark, else the message."""
    causes = java_causes(error)
    if causes:
        deepest = f"; caused by {causes[-1].line}" if len(causes) > 1 else ""
        return causes[0].line + deepest
    return first_line(error)


def outcome_counts(outcome: dict[str, Any]) -> tuple[BatchCounts, Appended, Appended, tuple[float, float]]:
    """A topic's counts of a batch written together with others' (BatchWrite.json, in router/jvm), what its
    archive and dead-letter appends added, and the seconds each commit took (0: none)."""
    archived, dead_lettered, archive_files, archive_bytes, dead_files, dead_bytes, newest, *commits = (
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
    archive_commit, dead_letter_commit = (micros / 1e6 for micros in commits[:2])
    return (
        counts,
        Appended(archived, archive_files, archive_bytes),
        Appended(dead_lettered, dead_files, dead_bytes),
        (archive_commit, dead_letter_commit),
    )


class Refused(Exception):
    """The one job does not write this topic's tables; the reason is the message."""


class TogetherWriter:
    """Writes the topics of a batch in one job: together, or one on its own."""

    def __init__(
        self, spark: SparkSession, cores: int, commit_threads: int, metrics: RouterMetrics | None = None
    ) -> None:
        self.spark = spark
        self._metrics = metrics
        self._cores = cores
        self._commit_threads = commit_threads

    def writable(self, batch_id: int, busy: dict[str, TopicWorker]) -> dict[str, tuple[bool, bool]]:
        """The busy topics whose tables can be written together, with whether their archive and dead-letter
        tables hold the batch already (a replay: a table that holds it is not written again): those whose
        tables' last batch can be read now (the catalog out: the topic's own path waits for it). Another
        router's commits in the way are looked for by the write itself, on the tables it loads anyway
        (SecondWriters, in router/jvm)."""
        together = {}
        for topic, worker in busy.items():
            try:
                together[topic] = worker.together.holding(batch_id)
            except Exception as error:
                log.warning("batch %d of topic %s: its tables' last batch cannot be read (%s); alone now",
                            batch_id, topic, failure_reason(error))  # fmt: skip
        return together

    def write(
        self,
        source: DataFrame,
        batch_id: int,
        ranges: dict[str, BatchRange],
        tables: dict[str, BatchTables],
        holding: dict[str, tuple[bool, bool]],
        tasks: int | None = None,
        shares: dict[str, int] | None = None,
    ) -> list[str]:
        """Write the `tables` of a batch's topics in one Spark job, each table that does not hold the batch
        already (`holding`), then commit them, several at once; the topics left to archive on their own:
        those whose rows cannot be planned apart, or whose write failed (their worker tries again, and finds
        what landed). The job has `tasks` tasks at most (else one per core), a topic read by `shares[topic]`
        of them at most (else one)."""
        started = time.monotonic()
        together = []
        for topic, topic_tables in tables.items():
            if all(holding[topic]):
                topic_tables.replayed_whole(batch_id)
            else:
                together.append(topic)
        alone: list[str] = []
        plans = []
        for topic in list(together):
            topic_tables = tables[topic]
            records = source.where(F.col("topic") == topic) if topic_tables.registry is not None else source
            try:
                plans.append(topic_tables.topic_rows(records, batch_id))
            except Exception as error:  # a parse Spark cannot plan apart: that topic goes alone
                log.warning("topic %s: its rows cannot be planned apart (%s); archived alone",
                            topic, first_line(error))  # fmt: skip
                together.remove(topic)
                alone.append(topic)
        if not together:
            return alone
        planned = time.monotonic()
        try:
            written = self._job(source, batch_id, together, plans, tables, ranges, holding, tasks, shares)
        except Exception as error:
            kafka = kafka_unavailable(java_causes(error))
            if kafka is not None:
                for topic in together:
                    tables[topic].forget_commits()
                raise KafkaUnavailable(f"batch {batch_id}: Kafka cannot be read now ({kafka})") from error
            # The catalog or the warehouse out, most often: each topic alone waits the outage out
            # (CommitRetry), and finds what landed before it.
            log.warning("batch %d: writing %d topics together failed (%s); each alone now", batch_id,
                        len(together), failure_reason(error))  # fmt: skip
            for topic in together:
                tables[topic].forget_commits()
            return alone + together
        outcomes = json.loads(written.json())
        seconds = time.monotonic() - started
        tables_ms, job_ms, commit_ms = (int(ms) for ms in written.millis())
        log.info(
            "batch %d: %d topics written together in %.1fs: their plans in %.1fs, their tables loaded "
            "in %.1fs, one job of %.1fs, their commits in %.1fs", batch_id, len(together), seconds,
            planned - started, tables_ms / 1000, job_ms / 1000, commit_ms / 1000,
        )  # fmt: skip
        for topic, outcome in zip(together, outcomes, strict=True):
            if outcome["second_writer"] is not None:
                raise tables[topic].second_writer(
                    batch_id, outcome["second_writer"], outcome["committed_beside"]
                )
        for topic, outcome in zip(together, outcomes, strict=True):
            refused = outcome["error"]
            if refused is not None:
                log.warning("batch %d of topic %s: writing it with the other topics failed (%s); alone now",
                            batch_id, topic, refused)  # fmt: skip
                tables[topic].forget_commits()
                alone.append(topic)
                continue
            counts, archived, dead_lettered, commits = outcome_counts(outcome)
            tables[topic].written_together(
                batch_id, counts, archived, dead_lettered, seconds, commits, holding[topic][0]
            )
            metadata_bytes = outcome["totals"][10]
            if metadata_bytes > 0 and self._metrics is not None:
                self._metrics.metadata_bytes.labels(topic, tables[topic].identifiers[0]).set(metadata_bytes)
        return alone

    def archive_alone(
        self,
        records: DataFrame,
        batch_id: int,
        topic: str,
        tables: BatchTables,
        covered: BatchRange,
        retry: CommitRetry,
        by_spark: Callable[[], None],
    ) -> None:
        """A topic's batch on its own (its write with the others failed, a catch-up, a topic's own query): by
        the same job, its outages waited out by `retry`; by Spark's Iceberg writer (`by_spark`) when the job
        does not write these tables (laid out otherwise than bergstream makes them), the one fallback."""
        # Whether its first table (the archive; a topic dead-lettered whole: its dead letters) held the
        # batch before this attempt: then its records were counted when it was committed.
        archive, dead_letters = tables.identifiers
        first, identifier = (0, archive) if archive is not None else (1, dead_letters)
        replayed = retry.attempt(identifier, batch_id, lambda: tables.holding(batch_id)[first])
        try:
            retry.attempt(
                identifier, batch_id,
                lambda: self.write_alone(records, batch_id, topic, tables, covered, replayed),
            )  # fmt: skip
        except Refused as refused:
            log.warning("%s batch %d: %s; appended by Spark's writer", topic, batch_id, refused)
            by_spark()

    def write_alone(
        self,
        records: DataFrame,
        batch_id: int,
        topic: str,
        tables: BatchTables,
        covered: BatchRange,
        replayed: bool,
    ) -> None:
        """One attempt at writing one topic's `records` of batch `batch_id` by the same job, each of its
        tables that does not hold the batch yet; `replayed`: its archive held the batch before this batch's
        first attempt (its records were counted then). Raises what failed (for CommitRetry to tell an outage
        from an error), `Refused` when the job does not write these tables."""
        started = time.monotonic()
        holding = tables.holding(batch_id)
        if all(holding) and replayed:
            tables.replayed_whole(batch_id)
            return
        # Both tables hold it, committed by an earlier attempt of this batch before its error: the job counts
        # its records and writes nothing.
        plan = tables.topic_rows(records, batch_id)
        try:
            written = self._job(records, batch_id, [topic], [plan], {topic: tables}, {topic: covered},
                                {topic: holding}, None, None)  # fmt: skip
            (outcome,) = json.loads(written.json())
            if outcome["second_writer"] is not None:
                raise tables.second_writer(batch_id, outcome["second_writer"], outcome["committed_beside"])
            if outcome["error"] is not None:
                written.rethrow(0)  # a commit's failure, as Java raised it
                raise Refused(outcome["error"])
        except Exception:
            tables.forget_commits()  # a commit may have landed before the error
            raise
        counts, archived, dead_lettered, commits = outcome_counts(outcome)
        seconds = time.monotonic() - started
        tables.written_together(batch_id, counts, archived, dead_lettered, seconds, commits, replayed)

    def _job(
        self,
        source: DataFrame,
        batch_id: int,
        topics: list[str],
        plans: list[Any],
        tables: dict[str, BatchTables],
        ranges: dict[str, BatchRange],
        holding: dict[str, tuple[bool, bool]],
        tasks: int | None,
        shares: dict[str, int] | None,
    ) -> Any:
        """TopicTables.write of `topics` (with their rows' `plans`), each committed, its summary recording
        its range of `ranges`."""
        jvm = source.sparkSession._jvm
        assert jvm is not None
        topic_write = getattr(jvm, TOPIC_WRITE)
        writes = []
        for topic, plan in zip(topics, plans, strict=True):
            archive, dead_letters = tables[topic].identifiers
            archive_holds, dead_letters_hold = holding[topic]
            properties = tables[topic].batch_properties(batch_id, ranges[topic])
            writes.append(
                topic_write(topic, plan, archive, dead_letters, archive_holds, dead_letters_hold, properties)
            )
        return write_tables(source, writes, tasks or self._cores, shares or {}, self._commit_threads)


def write_tables(
    source: DataFrame, writes: list[Any], cores: int, shares: dict[str, int], commit_threads: int | None
) -> Any:
    """TopicTables.write of `writes` (TopicWrite: each topic's rows, tables and summary) from the records of
    `source`; with `commit_threads`, each then committed, that many at once, nothing kept pending."""
    spark = source.sparkSession
    jvm = spark._jvm
    assert jvm is not None
    tables = getattr(jvm, _TOPIC_TABLES)
    keys = [QUERY_ID, BATCH_ID, TOPIC, CLUSTER, BATCH_START, NEXT_OFFSETS]
    written = tables.write(spark._jsparkSession, source._jdf, source.columns.index("topic"), writes,
                           int(time.time() * 1_000_000), cores, shares, keys)  # fmt: skip
    if commit_threads is not None:
        written.commit(list(range(len(writes))), commit_threads)
    return written


_PLANS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], Any]] = weakref.WeakKeyDictionary()
_PLANS_LOCK = threading.Lock()


def shared_plan(spark: SparkSession, made_of: tuple[Any, ...] | None, plan: Callable[[], Any]) -> Any:
    """The plan of rows made of `made_of` (a topic's schema, encoding, cluster, limits, records' and tables'
    columns), made by `plan` once per Spark context for every topic made of the same: planning a topic's
    rows is Spark's analysis of its parse, which a batch of a thousand topics would otherwise pay a thousand
    times, one after another (4 s for a thousand topics of one schema, bench/topics). None: a plan of the
    topic's own."""
    if made_of is None:
        return plan()
    with _PLANS_LOCK:
        plans = _PLANS.setdefault(spark.sparkContext, {})
        if made_of not in plans:
            plans[made_of] = plan()
        return plans[made_of]


def rows_plan(frame: DataFrame) -> Any:
    """The plan (TopicRows) of a topic's rows from `frame`, its records' two structs `a` (the archive row)
    and `d` (the dead letter), made from an empty frame of its records' columns: the writer finds and sets
    the metadata it counts by the names the layout gives."""
    jvm = frame.sparkSession._jvm
    assert jvm is not None
    return getattr(jvm, TOPIC_ROWS).of(frame._jdf, METADATA, INGESTION_TS, PARTITION, OFFSET, WRITE_TS)
