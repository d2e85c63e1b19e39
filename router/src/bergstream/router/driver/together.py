"""Every topic of a batch written in one Spark job, each table committed once (TopicTables and TopicRows,
in router/jvm), several commits at once: topics archived and topics dead-lettered whole; of a replayed
batch, the tables that lack it. A topic this job cannot write (tables whose last batch cannot be read now,
rows that cannot be planned apart, a write that failed) is archived on its own by its worker, which waits
out outages and finds what landed."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bergstream.errors import first_line
from bergstream.router.counts import BatchCounts, PartitionRead
from bergstream.router.retry import java_causes
from bergstream.router.topic import TopicWorker
from bergstream.router.write import BATCH_ID, QUERY_ID, Appended
from bergstream.schemas.positions import BATCH_START, CLUSTER, NEXT_OFFSETS, TOPIC, BatchRange

log = logging.getLogger("bergstream.router.driver")
_TOPIC_TABLES = "io.bergstream.router.TopicTables"
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
    """A topic's counts of a batch written together with others' (TopicTables.BatchWrite.json), what its
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
    archive_commit, dead_letter_commit = (micros / 1e6 for micros in commits)
    return (
        counts,
        Appended(archived, archive_files, archive_bytes),
        Appended(dead_lettered, dead_files, dead_bytes),
        (archive_commit, dead_letter_commit),
    )


class TogetherWriter:
    """Writes the topics of a batch that can be written together."""

    def __init__(
        self, spark: SparkSession, pool: ThreadPoolExecutor, cores: int, commit_threads: int
    ) -> None:
        self.spark = spark
        self._pool = pool
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
        workers: dict[str, TopicWorker],
        holding: dict[str, tuple[bool, bool]],
    ) -> list[str]:
        """Write the tables of `workers` in one Spark job and commit them, each table that
        does not hold the batch already (`holding`); the topics left to archive one by one: those whose rows
        cannot be planned apart, or whose write failed (their worker tries again, and finds what landed)."""
        started = time.monotonic()
        together = []
        for topic, worker in workers.items():
            if all(holding[topic]):
                worker.together.replayed_whole(batch_id)
            else:
                together.append(topic)
        alone: list[str] = []
        tables = []
        plans = []
        for topic in list(together):
            topic_tables = workers[topic].together
            records = source.where(F.col("topic") == topic) if topic_tables.registry is not None else source
            try:
                plans.append(topic_tables.topic_rows(records, batch_id))
            except Exception as error:  # a parse Spark cannot plan apart: that topic goes alone
                log.warning("topic %s: its rows cannot be planned apart (%s); archived alone",
                            topic, first_line(error))  # fmt: skip
                together.remove(topic)
                alone.append(topic)
                continue
            tables.append(topic_tables)
        if not together:
            return alone
        # A table that holds the batch already is named None: its rows are counted, not written.
        identifiers = [
            tuple(
                None if held else name
                for name, held in zip(topic_tables.identifiers, holding[topic], strict=True)
            )
            for topic, topic_tables in zip(together, tables, strict=True)
        ]
        properties = [
            topic_tables.batch_properties(batch_id, ranges[topic])
            for topic, topic_tables in zip(together, tables, strict=True)
        ]
        planned = time.monotonic()
        jvm = self.spark._jvm
        assert jvm is not None
        try:
            written = getattr(jvm, _TOPIC_TABLES).append(
                self.spark._jsparkSession, source._jdf, source.columns.index("topic"), together, plans,
                [archive for archive, _ in identifiers], [dead_letters for _, dead_letters in identifiers],
                properties, int(time.time() * 1_000_000), self._cores, self._commit_threads,
                [QUERY_ID, BATCH_ID, TOPIC, CLUSTER, BATCH_START, NEXT_OFFSETS],
            )  # fmt: skip
        except Exception as error:
            # The catalog or the warehouse out, most often: each topic alone waits the outage out
            # (CommitRetry), and finds what landed before it.
            log.warning("batch %d: writing %d topics together failed (%s); each alone now", batch_id,
                        len(together), failure_reason(error))  # fmt: skip
            for topic_tables in tables:
                topic_tables.forget_commits()
            return alone + together
        seconds = time.monotonic() - started
        tables_ms, job_ms, commit_ms = (int(ms) for ms in written.millis())
        log.info(
            "batch %d: %d topics written together in %.1fs: their plans in %.1fs, their tables loaded "
            "in %.1fs, one job of %.1fs, %d commits in %.1fs", batch_id,
            len(together), seconds, planned - started, tables_ms / 1000, job_ms / 1000, len(together),
            commit_ms / 1000,
        )  # fmt: skip
        outcomes = json.loads(written.json())
        for topic_tables, outcome in zip(tables, outcomes, strict=True):
            if outcome["second_writer"] is not None:
                raise topic_tables.second_writer(
                    batch_id, outcome["second_writer"], outcome["committed_beside"]
                )
        for topic, topic_tables, outcome in zip(together, tables, outcomes, strict=True):
            refused = outcome["error"]
            if refused is not None:
                log.warning("batch %d of topic %s: writing it with the other topics failed (%s); alone now",
                            batch_id, topic, refused)  # fmt: skip
                topic_tables.forget_commits()
                alone.append(topic)
                continue
            counts, archived, dead_lettered, commits = outcome_counts(outcome)
            replayed = holding[topic][0]
            topic_tables.written_together(
                batch_id, counts, archived, dead_lettered, seconds, commits, replayed
            )
        return alone
