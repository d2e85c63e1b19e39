"""A topic that fails stops no other: its share of the batch is set aside by Kafka range, and archived from
Kafka once its tables take commits again.

A topic's write fails (its catalog or warehouse out past `commit_retry.give_up_after_seconds`, a table that
refuses the rows, a schema registry's error): the batch goes on for the other topics, and the failed topic's
range is recorded beside the query's checkpoint (BEHIND_FILE: per topic, the end of what is set aside, and
why) before the batch ends, so that Spark's checkpoint moving past it loses nothing. Each following batch's
range of the topic is added to it, its rows not written. While it is behind, the topic is caught up in the
background, with backoff: the records from where its tables record that its archive ends (where they record
nothing, made again since, from where the range set aside starts) up to the end set aside are read from Kafka
as a batch and archived by the topic's worker under the scheduling batch's id, as one batch (its commits
recording that range); once it reaches the end set aside, the topic rejoins the query's batches where they
are. Its consumer group is committed, and its lag measured, at its tables' position meanwhile, and
`bergstream_router_topic_up` is 0. What Kafka deletes before the catch-up reads it is counted as expired, as
for a stopped router.

What a failing topic costs the others in its query: at most `commit_retry.give_up_after_seconds` (60 s by
default) of one batch, its first; after that, nothing but the read of its records.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from bergstream.kafka_source import kafka_range
from bergstream.router.errors import SecondWriter, StopRequested
from bergstream.router.identity import CheckpointFile, TopicRecreated
from bergstream.router.retry import Backoff
from bergstream.router.topic import TopicWorker
from bergstream.schemas.batch_range import EARLIEST, BatchRange, offsets_json
from bergstream.schemas.schema_registry import RegistryStopped

log = logging.getLogger("bergstream.router.driver")
# Beside the query's checkpoint: {"<topic>": {"end": {"<partition>": <offset>}, "reason": "..."}}, and
# "start" (as "end") where the first range set aside starts by offsets.
BEHIND_FILE = "bergstream-topics-behind.json"
# Errors that no waiting mends and that archiving another way would make worse: the query stops.
FATAL = (SecondWriter, TopicRecreated, RegistryStopped)
# How often a topic behind is tried again: doubling from the first to the cap.
CATCH_UP_BACKOFF = Backoff(initial_backoff_seconds=5.0, max_backoff_seconds=300.0)


class BatchTaken(Exception):
    """The catch-up waits for a later batch's id."""


@dataclass
class Gap:
    """What a topic has set aside: up to `end`, per partition, and why."""

    end: dict[int, int]
    reason: str
    failures: int = 0
    due: float = 0.0  # monotonic seconds: when to try catching up again
    running: Future[dict[int, int]] | None = None
    batch_id: int = -1  # the batch whose id the running catch-up commits under
    taken: int = -1  # the newest batch id the topic's tables hold already: the catch-up waits for a later one
    start: dict[int, int] | None = None  # where the first range set aside starts, where known by offsets


class SetAside:
    """The topics of one query that are behind, kept beside its `checkpoint`."""

    def __init__(self, spark: SparkSession, checkpoint: str, kafka_options: dict[str, Any]) -> None:
        self.spark = spark
        self._options = kafka_options
        self._file = CheckpointFile(spark, checkpoint, BEHIND_FILE)
        self._lock = threading.RLock()
        self._gaps: dict[str, Gap] = {}
        for topic, kept in self._file.read().items():
            end = {int(p): int(o) for p, o in kept["end"].items()}
            start = {int(p): int(o) for p, o in kept["start"].items()} if kept.get("start") else None
            self._gaps[str(topic)] = Gap(end, str(kept.get("reason", "")), start=start)
            log.warning("topic %s: behind from before the query started (%s); catching it up to %s",
                        topic, kept.get("reason"), offsets_json(end))  # fmt: skip
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bergstream-catch-up")

    def __contains__(self, topic: str) -> bool:
        with self._lock:
            return topic in self._gaps

    def topics(self) -> list[str]:
        with self._lock:
            return sorted(self._gaps)

    def fails(self, error: BaseException) -> bool:
        """Whether `error` stops the query rather than its topic alone."""
        return isinstance(error, FATAL)

    def set_aside(self, topic: str, covered: BatchRange, reason: str) -> None:
        """The topic's range of a batch is not written: add it to what it has set aside."""
        with self._lock:
            gap = self._gaps.get(topic)
            if gap is None:
                start = None if isinstance(covered.start, str) else dict(covered.start)
                gap = self._gaps[topic] = Gap(dict(covered.end), reason, due=time.monotonic(), start=start)
                log.error("topic %s is set aside from %s: %s; the other topics go on, and it is archived "
                          "from Kafka once it can be", topic, _start_text(covered), reason)  # fmt: skip
            else:
                gap.end = {p: max(offset, gap.end.get(p, offset)) for p, offset in covered.end.items()}
            kept: dict[str, Any] = {"end": {str(p): o for p, o in sorted(gap.end.items())}}
            kept["reason"] = gap.reason
            if gap.start is not None:
                kept["start"] = {str(p): o for p, o in sorted(gap.start.items())}
            self._file.put(topic, kept)

    def catch_up(
        self, workers: dict[str, TopicWorker], batch_id: int, stopping: threading.Event
    ) -> list[tuple[str, dict[int, int]]]:
        """Start the catch-up of each topic behind that is due, under batch `batch_id`; collect those that
        ended: [(topic, the end it reached)] for each topic that rejoins the query's batches."""
        rejoined = []
        with self._lock:
            for topic, gap in list(self._gaps.items()):
                worker = workers.get(topic)
                if worker is None:
                    continue
                if gap.running is not None and gap.running.done():
                    rejoined += self._ended(topic, gap)
                    continue
                due = time.monotonic() >= gap.due and batch_id > gap.taken
                if gap.running is None and due and not stopping.is_set():
                    gap.batch_id = batch_id
                    gap.running = self._pool.submit(
                        self._archive_gap, worker, batch_id, dict(gap.end), gap.start
                    )
        return rejoined

    def _ended(self, topic: str, gap: Gap) -> list[tuple[str, dict[int, int]]]:
        assert gap.running is not None
        running, gap.running = gap.running, None
        error = running.exception()
        if isinstance(error, BatchTaken):
            gap.taken = gap.batch_id  # tried again under the query's next batch id
            log.info("topic %s: %s", topic, error)
            return []
        if isinstance(error, StopRequested):
            return []  # kept beside the checkpoint: caught up when the router starts again
        if error is not None:
            if self.fails(error):
                raise error
            gap.failures += 1
            delay = CATCH_UP_BACKOFF.delay(gap.failures)
            gap.due = time.monotonic() + delay
            log.error("topic %s: catching up failed (attempt %d): %s; tried again in %.0fs", topic,
                      gap.failures, _line(error), delay)  # fmt: skip
            return []
        reached = running.result()
        if any(gap.end.get(p, 0) > offset for p, offset in reached.items()) or set(gap.end) - set(reached):
            gap.failures, gap.due = 0, time.monotonic()  # more was set aside meanwhile
            return []
        del self._gaps[topic]
        self._file.put(topic, None)
        log.warning("topic %s caught up to %s; it rejoins the query's batches", topic, offsets_json(reached))
        return [(topic, reached)]

    def _archive_gap(
        self, worker: TopicWorker, batch_id: int, end: dict[int, int], floor: dict[int, int] | None = None
    ) -> dict[int, int]:
        """Archive the topic's records from where its tables end up to `end`, read from Kafka: one batch. A
        partition they record nothing of (tables made again) starts at `floor`, where the range set aside
        starts: what came before it was archived in the tables dropped."""
        started = time.monotonic()
        recorded = worker.retry.attempt(worker.topic, batch_id, lambda: worker.positions(self.spark)) or {}
        low = {p: first for p, (first, _) in worker.kafka.watermarks(sorted(end)).items()}
        start = {}
        for partition in end:
            offset = recorded.get(partition, EARLIEST)
            if offset == EARLIEST:
                offset = (floor or {}).get(partition, EARLIEST)
            start[partition] = low[partition] if offset == EARLIEST else offset
        if all(start[p] >= offset for p, offset in end.items()):
            return end
        if worker.replayed(batch_id):
            # Its tables hold this batch (a write that failed after it committed, a catch-up that ended before
            # more was set aside): the catch-up commits under a later batch's id.
            raise BatchTaken(
                f"{worker.topic}'s tables hold batch {batch_id} already; caught up under the next batch's id"
            )
        topic = worker.topic
        records = kafka_range(
            self.spark, topic, self._options,
            json.dumps({topic: {str(p): o for p, o in sorted(start.items())}}),
            json.dumps({topic: {str(p): o for p, o in sorted(end.items())}}),
        )  # fmt: skip
        worker.archive(records, batch_id, BatchRange(start, end))
        log.info("topic %s: caught up from %s to %s in %.1fs", topic, offsets_json(start), offsets_json(end),
                 time.monotonic() - started)  # fmt: skip
        return end

    def finish(self, workers: dict[str, TopicWorker], batch_id: int) -> dict[str, str]:
        """Catch up every topic behind now, one attempt each, for a query that archives what its topics hold
        and ends; the topics still behind, with why."""
        with self._lock:
            gaps = list(self._gaps.items())
        for topic, gap in gaps:
            worker = workers.get(topic)
            if gap.running is not None:
                gap.running.exception()  # waited for
                with self._lock:
                    self._ended(topic, gap)
            if worker is None or topic not in self:
                continue
            try:
                reached = self._archive_gap(worker, batch_id, dict(gap.end), gap.start)
            except Exception as error:
                if self.fails(error):
                    raise
                gap.reason = _line(error)
                continue
            with self._lock:
                if reached == gap.end:
                    del self._gaps[topic]
                    self._file.put(topic, None)
        with self._lock:
            return {topic: f"set aside, not caught up: {gap.reason}" for topic, gap in self._gaps.items()}

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _start_text(covered: BatchRange) -> str:
    return covered.start if isinstance(covered.start, str) else offsets_json(covered.start)


def _line(error: BaseException) -> str:
    from bergstream.router.together import failure_reason

    return failure_reason(error)
