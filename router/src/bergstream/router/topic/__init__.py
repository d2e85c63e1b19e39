"""A topic's archive, one worker: its settings, its rows (parse, check, stamp), its tables, its positions,
its accounting, metrics, lag and consumer group `bergstream-router.<topic>`, built once from the topic's
settings (`RouterConfig`).

A query of the driver (router/driver) holds one worker per topic it reads, of either kind, behind the one
interface `TopicWorker`:
- `ArchivedTopic`: its records parsed into its archive table, those that do not parse into its dead-letter
  table (archived.py);
- `DeadLetteredTopic`: a topic whose settings do not load or whose schema is not found; each of its records
  goes to its dead-letter table whole, with the reason, under the same exactly-once append, until its
  settings load (dead_lettered.py).
Both record the Kafka range of each batch in their tables' commits and resume from them.
"""

from __future__ import annotations

from typing import Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from bergstream.router.accounting import RouterTotals
from bergstream.router.commit_retry import CommitRetry
from bergstream.router.consumer_group import GroupCommitter
from bergstream.router.progress import ProgressFollower
from bergstream.schemas.positions import BatchRange


class TopicWorker(Protocol):
    """What a query asks of each of its topics."""

    topic: str
    kafka: GroupCommitter
    follower: ProgressFollower
    retry: CommitRetry

    @property
    def archived(self) -> bool:
        """Whether the topic's records are archived (not dead-lettered whole)."""

    @property
    def totals(self) -> RouterTotals: ...

    def positions(self, spark: SparkSession) -> dict[int, int] | None:
        """Where the topic's tables say its archive ends; None when they record no position."""

    def resume(self, spark: SparkSession) -> dict[int, int] | None:
        """Where the topic starts when the query's checkpoint holds no batch: where its tables end; None
        when they record no position (the settings' startingOffsets hold)."""

    def replayed(self, batch_id: int) -> bool:
        """Whether the topic's tables hold batch `batch_id` of the query already."""

    def started(self, query: StreamingQuery) -> None:
        """`query` started: the topic's batches are appended under its id."""

    def archive(self, records: DataFrame, batch_id: int, covered: BatchRange) -> None:
        """Archive the topic's records of batch `batch_id`, whose Kafka range is `covered`, on its own."""
