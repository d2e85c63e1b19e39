"""One micro-batch of a query: each topic's range met (added to what it has unread, unread.py), the topics
that are due read from Kafka in one read, each from where its archive ends, every topic that can be written
together written by one Spark job (together.py), the others archived one by one by their workers, several at
once. A batch whose due topics are exactly its topics with records, each due for this batch's range alone
(a topic without a target lag: every batch), writes the records Spark read for it, as before target lags.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from bergstream.errors import first_line
from bergstream.router.commit_policy import CommitPolicy
from bergstream.router.driver.behind import SetAside
from bergstream.router.driver.floors import Floors
from bergstream.router.driver.unread import UnreadRanges
from bergstream.router.errors import KafkaUnavailable, StopRequested
from bergstream.router.metrics import RouterMetrics
from bergstream.router.retry import java_causes, kafka_unavailable
from bergstream.router.together import TogetherWriter, failure_reason
from bergstream.router.topic import TopicWorker
from bergstream.schemas.batch_range import EARLIEST, BatchRange

log = logging.getLogger("bergstream.router.driver")
# Reads the ranges {topic: (start, end)} from Kafka as one batch.
RangeReader = Callable[[dict[str, tuple[dict[int, int], dict[int, int]]]], DataFrame]


# The offsets each partition of each of some topics' logs starts at now.
LogStarts = Callable[[list[str]], dict[str, dict[int, int]]]


def starts_by_name(covered: BatchRange) -> bool:
    """Whether a batch's range starts at a name (`earliest`, `latest`) rather than offsets: a query's first
    batch, a topic new to it. Such a range is read by its batch, not later, unless its start is found by
    offsets (`earliest`: where each partition's log starts); `latest` is where Kafka's log ended when the
    query started."""
    return isinstance(covered.start, str) or any(offset < 0 for offset in covered.start.values())


def at_earliest(covered: BatchRange) -> bool:
    """Whether a range starts at each partition's earliest offset, by name."""
    if isinstance(covered.start, str):
        return covered.start == "earliest"
    return any(offset == EARLIEST for offset in covered.start.values()) and all(
        offset >= 0 or offset == EARLIEST for offset in covered.start.values()
    )


class BatchArchive:
    """Archives each batch of one query across its topics' tables."""

    def __init__(
        self,
        floors: Floors,
        together: TogetherWriter,
        behind: SetAside,
        pool: ThreadPoolExecutor,
        cores: int,
        unread: UnreadRanges,
        read: RangeReader,
        log_starts: LogStarts,
        metrics: RouterMetrics,
    ) -> None:
        self.floors = floors
        self.behind = behind
        self.together = together
        self.unread = unread
        self._read = read
        self._log_starts = log_starts
        self._metrics = metrics
        self._pool = pool
        self._cores = cores

    def archive(
        self,
        records: DataFrame,
        batch_id: int,
        ranges: dict[str, BatchRange],
        busy: dict[str, TopicWorker],
        workers: Mapping[str, TopicWorker],
        first_of_fresh_checkpoint: bool,
        draining: bool,
    ) -> None:
        """Batch `batch_id`: its ranges in every topic of the query (`ranges`), the `busy` topics those that
        may hold records (`records`, Spark's read of them); every topic due read and archived. `draining`:
        every topic is due (the query archives what its topics hold and ends)."""
        records = self.floors.apply(records, batch_id, ranges, busy, first_of_fresh_checkpoint)
        self._by_offsets(ranges, busy)
        now = time.time()
        by_name = {}
        for topic, covered in ranges.items():
            if topic in self.behind:
                # A topic behind has its share set aside again, not read: it catches up from Kafka.
                if topic in busy:
                    self.behind.set_aside(topic, covered, "behind")
            elif starts_by_name(covered):
                if topic in busy:
                    by_name[topic] = covered
            elif topic in workers and self.unread.met(topic, covered, now) and topic in busy:
                # Its tables hold the whole range already (a batch run again after its commit): counted
                # as a replay, as a topic committing every batch always was.
                busy[topic].together.replayed_whole(batch_id)
        left = self.gone([topic for topic in self.unread.topics() if topic not in ranges])
        due = self.unread.due(policies(workers), now, every=draining, left=left)
        due.update(dict.fromkeys(by_name, "first"))
        whole = set(due) == set(busy) and all(
            (by_name.get(topic) or self.unread.range(topic)) == ranges[topic] for topic in due
        )
        try:
            self.archive_due(batch_id, due, workers, records, by_name, whole)
        except KafkaUnavailable as error:
            if by_name:
                raise  # a range that starts by name is read by its batch or not at all: Spark runs it again
            # Their ranges are met, kept unread beside the checkpoint: read once Kafka answers again.
            log.warning("%s; the %d topics due stay unread, due again", error, len(due))

    def gone(self, left: list[str]) -> list[str]:
        """Of the topics that `left` the query with a range unread, those Kafka still has, to be read now;
        the range of a topic deleted is lost, counted as expired (its records went with it)."""
        if not left:
            return []
        try:
            present = set(self._log_starts(left))
        except Exception as error:
            log.warning("whether %d topics that left the query are still in Kafka is not known now (%s)",
                        len(left), first_line(error))  # fmt: skip
            return []
        for topic in sorted(set(left) - present):
            lost = self.unread.set_aside(topic)
            if lost is None or isinstance(lost.start, str):
                continue
            for partition, end in sorted(lost.end.items()):
                count = max(0, end - lost.start.get(partition, end))
                if count:
                    self._metrics.expired_offsets.labels(topic, str(partition)).inc(count)
            log.error("topic %s was deleted with offsets %s unread (its target lag's worth at most): they "
                      "are lost, counted as expired", topic, lost)  # fmt: skip
        return [topic for topic in left if topic in present]

    def _by_offsets(self, ranges: dict[str, BatchRange], busy: Mapping[str, TopicWorker]) -> None:
        """The busy topics' ranges that start at `earliest` by name, started by offsets instead (in place):
        where each partition's log starts now, as Spark's read of the batch starts there. Kafka out for a
        moment: they stay by name, and are read by the batch."""
        named = sorted(topic for topic in busy if topic not in self.behind and at_earliest(ranges[topic]))
        if not named:
            return
        try:
            starts = self._log_starts(named)
        except Exception as error:
            log.warning("where the logs of %d topics start is not known now (%s); read by the batch",
                        len(named), first_line(error))  # fmt: skip
            return
        for topic in named:
            covered, start = ranges[topic], starts.get(topic)
            if start is None or set(covered.end) - set(start):
                continue
            given = {} if isinstance(covered.start, str) else covered.start
            ranges[topic] = BatchRange(
                {p: start[p] if given.get(p, EARLIEST) == EARLIEST else given[p] for p in covered.end},
                covered.end,
            )

    def archive_due(
        self,
        batch_id: int,
        due: dict[str, str],
        workers: Mapping[str, TopicWorker],
        records: DataFrame | None = None,
        by_name: Mapping[str, BatchRange] | None = None,
        whole: bool = False,
        settled: bool = False,
    ) -> None:
        """Read the `due` topics' ranges unread ({topic: why}) and archive them under batch `batch_id`.
        `records`: the batch's own read, for the topics whose range starts by name (`by_name`), or for all
        of them when the batch's records are exactly what is due (`whole`). `settled`: between batches, up
        to where the newest batch that ended ends."""
        by_name = by_name or {}
        covered: dict[str, BatchRange] = {}
        for topic in sorted(due):
            taken = by_name.get(topic) or self.unread.range(topic, settled)
            if taken is None:
                continue
            if topic not in workers:
                # Met before the driver started, and no longer in the query: nothing archives it here.
                log.error("topic %s left the query with offsets %s unread; they are archived when a router "
                          "of the topic starts again", topic, taken)  # fmt: skip
                continue
            covered[topic] = taken
        if not covered:
            return
        if whole and records is not None:
            source = records
        else:
            offsets = {
                t: (dict(c.start), dict(c.end))
                for t, c in covered.items()
                if t not in by_name and not isinstance(c.start, str)
            }
            self._count_expired(offsets, workers)
            read = self._read(offsets) if offsets else None
            named = None
            if by_name and records is not None:
                named = records.where(F.col("topic").isin(sorted(by_name)))
            parts = [part for part in (named, read) if part is not None]
            source = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        reasons: dict[str, int] = {}
        for topic in covered:
            reasons[due[topic]] = reasons.get(due[topic], 0) + 1
        log.debug("batch %d: %d topics due (%s)", batch_id, len(covered), reasons)
        due_workers = {topic: workers[topic] for topic in covered}
        before = {topic: _written(worker) for topic, worker in due_workers.items()}
        failed, unreadable = self._write(source, batch_id, covered, due_workers)
        for topic in covered:
            if topic in failed or topic in unreadable:
                continue
            records_now, bytes_now = _written(due_workers[topic])
            self.unread.archived(topic, covered[topic], records_now - before[topic][0],
                                 bytes_now - before[topic][1])  # fmt: skip
            self._metrics.pending_commits.labels(topic, due[topic]).inc()
        if unreadable:
            raise KafkaUnavailable(
                f"batch {batch_id}: Kafka cannot be read now ({unreadable[sorted(unreadable)[0]]}); "
                f"{len(unreadable)} topics' ranges stay where they were"
            )

    def _count_expired(
        self, ranges: Mapping[str, tuple[dict[int, int], dict[int, int]]], workers: Mapping[str, TopicWorker]
    ) -> None:
        """Of the `ranges` ({topic: (start, end)}) about to be read, the offsets Kafka's retention removed
        before their read (a router stopped past a topic's retention, a retention by size): counted as
        expired and logged, as those a batch misses are, and each topic's accounting told it left off where
        its log starts (expired.py), so that the read's first offset counts none of them again. The range
        recorded is the whole one, as a batch's is. Kafka not answering: nothing read (KafkaUnavailable)."""
        if not ranges:
            return
        try:
            starts = self._log_starts(sorted(ranges))
        except Exception as error:
            # Kafka does not answer: the read would wait out its own timeouts, then fail.
            raise KafkaUnavailable(
                f"Kafka does not answer where the logs of {len(ranges)} topics start ({first_line(error)})"
            ) from error
        for topic, (start, end) in sorted(ranges.items()):
            for partition, first in sorted(start.items()):
                kept = starts.get(topic, {}).get(partition, first)
                count = min(kept, end.get(partition, first)) - first
                if count > 0:
                    workers[topic].follower.expired.left_off({partition: first + count})
                    self._metrics.expired_offsets.labels(topic, str(partition)).inc(count)
                    log.warning("%s partition %d: offsets %d to %d (%d records) expired from Kafka before "
                                "being archived", topic, partition, first, first + count - 1,
                                count)  # fmt: skip

    def overdue(self, batch_id: int, workers: Mapping[str, TopicWorker], subscription: str) -> None:
        """Between batches (Spark runs none while no topic has new records): read and archive the topics due
        by their target lag, under the last batch's id, up to where it ended. Kafka out for a moment, most
        often: their ranges stay unread, due at the next batch, whose failure Spark's query handles as any
        batch's. An error no retry mends is raised."""
        due = self.unread.due(policies(workers), settled=True)
        if not due:
            return
        try:
            self.archive_due(batch_id, due, workers, settled=True)
            self.unread.record(batch_id)
        except Exception as error:
            if self.behind.fails(error) or isinstance(error, StopRequested):
                raise
            log.warning("%s: the %d topics due between batches are not read now (%s); they are at the next "
                        "batch", subscription, len(due), first_line(error))  # fmt: skip

    def drain(self, last: int, workers: Mapping[str, TopicWorker], subscription: str) -> dict[str, str]:
        """The query ended: every topic's range unread read and archived under its last batch `last`, as
        many at once as a batch does. Those that fail stay unread, recorded, read when the router starts
        again: returned, with why ({topic: why})."""
        due = self.unread.due({}, every=True, settled=True)
        if not due:
            return {}
        try:
            self.archive_due(last, due, workers, settled=True)
            self.unread.record(last)
        except Exception as error:
            log.error("%s: the ranges unread as the query ended are not all archived (%s); they are when the "
                      "router starts again", subscription, first_line(error))  # fmt: skip
            why = f"left unread as the query ended ({first_line(error)}); read when the router starts again"
            return {topic: why for topic in due if self.unread.range(topic, settled=True) is not None}
        log.info("%s: the ranges of %d topics unread archived as the query ended", subscription, len(due))
        return {}

    def _write(
        self, records: DataFrame, batch_id: int, ranges: dict[str, BatchRange], busy: dict[str, TopicWorker]
    ) -> tuple[set[str], dict[str, str]]:
        """Write the `busy` topics' `records` (their ranges `ranges`) under batch `batch_id`; the topics set
        aside, their write failed, and those Kafka could not be read for ({topic: why}), not set aside: Kafka
        out is no topic's failure."""
        # The job's tasks: one per core at most, fewer for a few records; each topic is read by as many of
        # them as its last batch's records are worth (TopicGroups, router/jvm): a file an hour and task.
        shares = {topic: worker.together.write_tasks() for topic, worker in busy.items()}
        tasks = max(1, min(self._cores, sum(shares.values())))
        source = records
        together = self.together.writable(batch_id, busy)
        # The one job that writes every topic together reads Kafka itself. Where the batch's records are
        # read again (a topic archived alone, a schema registry's versions looked up first), they are read
        # from Kafka once, into memory, for all of them.
        cached = False

        def cache() -> None:
            nonlocal source, cached
            if not cached and len(busy) > 1:
                source = source.coalesce(tasks).persist(StorageLevel.MEMORY_AND_DISK)
                source.count()
                cached = True

        registries = any(busy[topic].together.registry is not None for topic in together)
        if len(together) < len(busy) or registries:
            cache()
        failed: set[str] = set()
        unreadable: dict[str, str] = {}
        try:
            alone = [topic for topic in busy if topic not in together]
            if together:
                tables = {topic: busy[topic].together for topic in together}
                alone += self.together.write(source, batch_id, ranges, tables, together, tasks, shares)
            if alone:
                cache()
            futures = {
                topic: self._pool.submit(
                    busy[topic].archive, source.where(F.col("topic") == topic), batch_id, ranges[topic]
                )
                for topic in alone
            }
            for topic, future in futures.items():
                error = future.exception()
                kafka = None if error is None else kafka_unavailable(java_causes(error))
                if kafka is not None:
                    unreadable[topic] = kafka
                elif error is not None:
                    log.error("batch %d of topic %s failed: %s", batch_id, topic, first_line(error))
                    self.set_aside(topic, ranges[topic], error)
                    failed.add(topic)
        finally:
            if cached:
                source.unpersist()
        return failed, unreadable

    def set_aside(self, topic: str, covered: BatchRange, error: BaseException) -> None:
        """The topic's range is archived later, from Kafka; an error no other way mends (another router
        writing the topic, the topic recreated) stops the query, and so does a stop asked for while the
        topic waited for its tables (the batch is not committed: Spark runs it again at the next start)."""
        if self.behind.fails(error) or isinstance(error, StopRequested):
            raise error
        self.unread.set_aside(topic)
        self.behind.set_aside(topic, covered, failure_reason(error))


def policies(workers: Mapping[str, TopicWorker]) -> dict[str, CommitPolicy]:
    """Each topic's commit policy."""
    return {topic: worker.together.commit_policy for topic, worker in workers.items()}


def _written(worker: TopicWorker) -> tuple[int, int]:
    totals = worker.totals
    return totals.archived + totals.dead_lettered, totals.bytes
