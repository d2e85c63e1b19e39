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
Both record the Kafka range of each batch in their tables' commits and resume from them, and both are
written by the one job of a batch (router/together.py) through `BatchTables`.
"""

from __future__ import annotations

from typing import Any, Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from bergstream.router.accounting import RouterTotals
from bergstream.router.batch_counts import BatchCounts
from bergstream.router.commit_policy import CommitPolicy
from bergstream.router.commit_retry import CommitRetry
from bergstream.router.config import RouterConfig
from bergstream.router.consumer_group import GroupCommitter
from bergstream.router.progress_follower import ProgressFollower
from bergstream.router.write import Appended
from bergstream.schemas.batch_range import BatchRange


class BatchTables(Protocol):
    """A topic's archive and dead-letter tables as the one job of a batch writes them (TopicTables, in
    router/jvm): the plan of its rows, which tables hold the batch already, the properties of its commits,
    and the accounting of what was written."""

    registry: Any  # a schema registry's versions of the topic's schema, brought up to date each batch

    @property
    def commit_policy(self) -> CommitPolicy:
        """When its files are committed (router/commit_policy.py): its target lag and a commit's worth."""

    @property
    def identifiers(self) -> tuple[str | None, str]:
        """The archive table (None: the topic has none written) and the dead-letter table."""

    def topic_rows(self, records: DataFrame, batch_id: int) -> Any:
        """The plan of the topic's rows (TopicRows): each record's archive row or dead letter."""

    def holding(self, batch_id: int) -> tuple[bool, bool]:
        """Whether the archive table (True where none is written) and the dead-letter table hold batch
        `batch_id` already."""

    def batch_properties(self, batch_id: int, covered: BatchRange) -> dict[str, str]:
        """The snapshot summary of the batch's appends: the query's and batch's ids, and its range."""

    def write_tasks(self) -> int:
        """How many tasks the topic's next batch is worth."""

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
        """Batch `batch_id` was written and committed; `replayed`: its archive held it already."""

    def replayed_whole(self, batch_id: int) -> None:
        """Both tables hold batch `batch_id`: a replay with nothing to write."""

    def forget_commits(self) -> None:
        """A write may have committed, or not: the tables' commits are read again."""

    def second_writer(self, batch_id: int, found: str, committed: bool) -> Exception:
        """The error that stops the query: another router's commit `found` covers the batch's offsets."""


class TopicWorker(Protocol):
    """What a query asks of each of its topics."""

    topic: str
    kafka: GroupCommitter
    follower: ProgressFollower
    retry: CommitRetry
    together: BatchTables  # its tables as the one job of a batch writes them

    @property
    def archived(self) -> bool:
        """Whether the topic's records are archived (not dead-lettered whole)."""

    @property
    def refusal(self) -> str | None:
        """Why its records are dead-lettered whole (its settings do not load); None when archived."""

    @property
    def archive_settings(self) -> RouterConfig | None:
        """The settings its archive is kept by (its maintenance's); None when dead-lettered whole."""

    @property
    def topic_id(self) -> str | None:
        """Kafka's id of the topic the query met, checked before each batch; None when not known."""

    def settings_due(self) -> bool:
        """Whether its settings are to be read again now: a topic dead-lettered whole, once in a while."""

    @property
    def totals(self) -> RouterTotals: ...

    def archived_at_start(self, spark: SparkSession, query_id: str | None) -> dict[int, int] | None:
        """Where its tables said its archive ends when the topic joined the query, by commits of query
        `query_id` (None: of any query); None: nowhere. Another router's commits are not this query's
        progress: its write finds them in its way, and stops."""

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
