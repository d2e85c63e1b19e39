"""One micro-batch of a query: split by topic, each topic's rows above its floor, every topic that can be
written together written by one Spark job (together.py), the others archived one by one by their workers,
several at once."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from bergstream.errors import first_line
from bergstream.router.driver.behind import SetAside
from bergstream.router.driver.floors import Floors
from bergstream.router.errors import StopRequested
from bergstream.router.pending import PendingCommits
from bergstream.router.together import TogetherWriter, failure_reason
from bergstream.router.topic import TopicWorker
from bergstream.schemas.batch_range import BatchRange

log = logging.getLogger("bergstream.router.driver")


class BatchArchive:
    """Archives each batch of one query across its topics' tables."""

    def __init__(
        self,
        floors: Floors,
        together: TogetherWriter,
        behind: SetAside,
        pool: ThreadPoolExecutor,
        cores: int,
        pending: PendingCommits,
    ) -> None:
        self.floors = floors
        self.behind = behind
        self.together = together
        self.pending = pending
        self._pool = pool
        self._cores = cores

    def archive(
        self,
        records: DataFrame,
        batch_id: int,
        ranges: dict[str, BatchRange],
        busy: dict[str, TopicWorker],
        first_of_fresh_checkpoint: bool,
    ) -> None:
        """Archive batch `batch_id`'s `records` of the `busy` topics, whose Kafka ranges are `ranges`."""
        records = self.floors.apply(records, batch_id, ranges, busy, first_of_fresh_checkpoint)
        # A topic behind has its share set aside again, not written: it catches up from Kafka.
        for topic in [topic for topic in busy if topic in self.behind]:
            self.behind.set_aside(topic, ranges[topic], "behind")
            del busy[topic]
        if not busy:
            return
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
        try:
            alone = [topic for topic in busy if topic not in together]
            if together:
                tables = {topic: busy[topic].together for topic in together}
                alone += self.together.write(
                    source, batch_id, ranges, tables, together, tasks, shares, self.pending
                )
            if alone:
                cache()
            futures = {
                topic: self._pool.submit(
                    self._alone, busy[topic], source.where(F.col("topic") == topic), batch_id, ranges[topic]
                )
                for topic in alone
            }
            for topic, future in futures.items():
                failed = future.exception()
                if failed is not None:
                    log.error("batch %d of topic %s failed: %s", batch_id, topic, first_line(failed))
                    self.set_aside(topic, ranges[topic], failed)
        finally:
            if cached:
                source.unpersist()

    def _alone(self, worker: TopicWorker, records: DataFrame, batch_id: int, covered: BatchRange) -> None:
        """The topic's batch on its own, after what it has pending is committed (its commits follow each
        other)."""
        self.flush(worker, batch_id)
        worker.archive(records, batch_id, covered)

    def flush(self, worker: TopicWorker, batch_id: int, reason: str = "flush") -> None:
        """Commit what `worker`'s topic has pending, through outages."""
        held = self.pending.held(worker.topic)
        if held is None:
            return
        self.pending.flush(
            worker.topic, lambda commit: worker.retry.attempt(worker.topic, batch_id, commit), reason
        )
        worker.together.pending_committed(held.batches[-1], held.newest)

    def set_aside(self, topic: str, covered: BatchRange, error: BaseException) -> None:
        """The topic's share of the batch is archived later, from Kafka; an error no other way mends (another
        router writing the topic, the topic recreated) stops the query, and so does a stop asked for while the
        topic waited for its tables (the batch is not committed: Spark runs it again at the next start)."""
        if self.behind.fails(error) or isinstance(error, StopRequested):
            raise error
        self.pending.drop(topic)
        self.behind.set_aside(topic, covered, failure_reason(error))
