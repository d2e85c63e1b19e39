"""Appends to a topic's tables that happen exactly once per micro-batch, even when a batch is replayed.

Every append carries the streaming query's id and the batch id as snapshot properties. A batch that
Spark replays after a failure (its data committed to Iceberg, its offsets not yet checkpointed) finds
its own snapshot and is not written again. This is the idempotence of Iceberg's streaming sink, kept
for a micro-batch that writes two tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from bergstream.schemas.batch_range import BATCH_START, CLUSTER, NEXT_OFFSETS, TOPIC, BatchRange, Origin

QUERY_ID = "bergstream.router.query-id"
BATCH_ID = "bergstream.router.batch-id"
# How far back from the newest snapshot an append is looked for before asking the snapshots table.
_NEWEST_SNAPSHOTS = 20
_ADDED = ("added-records", "added-data-files", "added-files-size")


def write_tasks_for(previous_read: int | None, most: int, records_per_task: int) -> int:
    """How many tasks write a batch: one per `records_per_task` records the previous batch read (rounded
    up), at least 1 and at most `most`; `most` for a query's first batch, which may be a backlog's.

    Each task writes a file per hour and pays a fixed cost (a Parquet writer, a file, its share of the
    commit's manifest): a 5,000-record batch costs a fifth less CPU in one task than in two."""
    if previous_read is None:
        return most
    return max(1, min(most, -(-previous_read // records_per_task)))


@dataclass(frozen=True)
class Overlap:
    """Another query's commit covering offsets a batch covers: per partition, [first, end)."""

    snapshot_id: int
    query_id: str
    offsets: dict[int, tuple[int, int]]

    def describe(self) -> str:
        ranges = ", ".join(
            f"partition {p} offsets {a} to {b - 1}" for p, (a, b) in sorted(self.offsets.items())
        )
        return f"query {self.query_id} committed {ranges} in snapshot {self.snapshot_id}"


@dataclass(frozen=True)
class Appended:
    records: int
    files: int
    bytes: int


class BatchTableWriter:
    """Writes one table for one streaming query."""

    def __init__(self, spark: SparkSession, identifier: str, query_id: str) -> None:
        self.spark = spark
        self.identifier = identifier
        self.query_id = query_id
        self._last_committed: int | None = None
        # Looked up once by its full name: `_jvm.org.apache...` would look up each package on the way, and
        # every miss searches the whole class path.
        self._spark3util = getattr(spark._jvm, "org.apache.iceberg.spark.Spark3Util")

    def _snapshot_summaries(self, batch_id: int | None = None) -> list[dict[str, str]]:
        """The summaries of this query's appends in the table's current history: an append rolled back
        since is not in the table."""
        condition = f"s.summary['{QUERY_ID}'] = '{self.query_id}'"
        if batch_id is not None:
            condition += f" AND s.summary['{BATCH_ID}'] = '{batch_id}'"
        rows = self.spark.sql(
            f"SELECT s.summary FROM {self.identifier}.snapshots s JOIN {self.identifier}.history h "
            f"ON s.snapshot_id = h.snapshot_id WHERE h.is_current_ancestor AND {condition}"
        ).collect()
        return [dict(row.summary) for row in rows]

    def _appended_summary(self, batch_id: int) -> dict[str, str] | None:
        """The summary of the snapshot that appended `batch_id`, found from the newest snapshot back.

        Reading the table's snapshots through Spark SQL costs a job per batch and grows with the history;
        the append is the newest snapshot, or a few behind it when maintenance committed meanwhile.
        """
        table = self._spark3util.loadIcebergTable(self.spark._jsparkSession, self.identifier)
        snapshot = table.currentSnapshot()
        for _ in range(_NEWEST_SNAPSHOTS):
            if snapshot is None:
                return None
            # Key by key: iterating a Java map from Python ends in an exception that PySpark converts at
            # the cost of dozens of class look-ups.
            summary = snapshot.summary()
            if summary.get(QUERY_ID) == self.query_id and summary.get(BATCH_ID) is not None:
                # An earlier batch of this query: the append committed nothing (it had no rows).
                if int(summary.get(BATCH_ID)) != batch_id:
                    return None
                return {key: str(summary.get(key) or 0) for key in _ADDED}
            parent = snapshot.parentId()
            snapshot = table.snapshot(parent) if parent is not None else None
        summaries = self._snapshot_summaries(batch_id)
        return summaries[0] if summaries else None

    def overlapping(self, origin: Origin, covered: BatchRange, batch_id: int | None = None) -> list[Overlap]:
        """Router commits of `origin`'s topic and cluster by another query, among the snapshots since this
        query's newest commit (at most _NEWEST_SNAPSHOTS of them), that cover offsets `covered` covers too:
        another router writing the same topic into the table. With `batch_id`, once this query committed
        that batch: the snapshots since its commit before it, its own commit of `batch_id` passed over."""
        table = self._spark3util.loadIcebergTable(self.spark._jsparkSession, self.identifier)
        snapshot = table.currentSnapshot()
        found = []
        for _ in range(_NEWEST_SNAPSHOTS):
            if snapshot is None:
                break
            summary = snapshot.summary()
            query_id = summary.get(QUERY_ID)
            if query_id == self.query_id:
                if batch_id is None or summary.get(BATCH_ID) != str(batch_id):
                    break
            elif query_id is not None:
                recorded = {key: summary.get(key) for key in (TOPIC, CLUSTER, BATCH_START, NEXT_OFFSETS)}
                theirs = BatchRange.recorded(
                    {k: v for k, v in recorded.items() if v is not None}, origin.topic, origin.cluster
                )
                shared = {} if theirs is None else covered.overlap(theirs)
                if shared:
                    found.append(Overlap(int(snapshot.snapshotId()), str(query_id), shared))
            parent = snapshot.parentId()
            snapshot = table.snapshot(parent) if parent is not None else None
        return found

    @property
    def last_committed(self) -> int:
        """The newest batch of this query committed to the table; -1 when none."""
        if self._last_committed is None:
            batches = [int(summary[BATCH_ID]) for summary in self._snapshot_summaries()]
            self._last_committed = max(batches, default=-1)
        return self._last_committed

    def committed(self, batch_id: int | None) -> None:
        """Batch `batch_id` was committed to the table by another writer of this query; None: what was
        committed is not known (read the table's snapshots again)."""
        self._last_committed = batch_id

    def append(
        self, rows: DataFrame, batch_id: int, properties: dict[str, str] | None = None
    ) -> Appended | None:
        """Append `rows` as batch `batch_id`, with `properties` in the snapshot's summary too; None when that
        batch is already in the table."""
        if batch_id <= self.last_committed:
            return None
        try:
            writer = (
                rows.writeTo(self.identifier)
                .option(f"snapshot-property.{QUERY_ID}", self.query_id)
                .option(f"snapshot-property.{BATCH_ID}", str(batch_id))
            )
            for key, value in (properties or {}).items():
                writer = writer.option(f"snapshot-property.{key}", value)
            writer.append()
        except Exception:
            # A commit can land and still report an error (the catalog went away before answering): the
            # next attempt reads the table's snapshots again instead of trusting what it knew.
            self._last_committed = None
            raise
        self._last_committed = batch_id
        summary = self._appended_summary(batch_id)
        if summary is None:  # an empty append commits no snapshot
            return Appended(records=0, files=0, bytes=0)
        return Appended(
            records=int(summary.get("added-records", 0)),
            files=int(summary.get("added-data-files", 0)),
            bytes=int(summary.get("added-files-size", 0)),
        )
