"""Each micro-batch of a correction's backfill, written once into its branch.

Spark's streaming writer of an Iceberg table looks for a batch already committed on main, not on a branch;
so the batch is appended through foreachBatch, its query's id and batch's id in the snapshot's summary, and
a batch the branch holds already (a batch run again after a kill) is not written twice. Only the rows of the
correction's window are written to the branch; those outside it (the warm-up's, the settle's) go to the
correction's table of rows beside the window, the same way once, for the spans that cross its edges
(edges.py).
A branch that holds batches of another query (a checkpoint lost or replaced) is refused: rows of two
queries never meet in it.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from bergstream.backfill.errors import BackfillError
from bergstream.runtime.checkpoint import CheckpointFiles
from bergstream.runtime.correct.branch import IcebergTable
from bergstream.runtime.correct.edges import staging_identifier
from bergstream.runtime.correct.state import BATCH_ID, QUERY_ID, Correction

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("bergstream.correct")


class BranchWriter:
    """foreachBatch's function: batch `batch_id`'s rows of the window appended to the branch, once."""

    def __init__(self, spark: SparkSession, identifier: str, correction: Correction, checkpoint: str) -> None:
        self.spark = spark
        self.identifier = identifier
        self.correction = correction
        self.files = CheckpointFiles(spark, checkpoint)
        self._query_id: str | None = None
        self._last: int | None = None
        self._staged: int | None = None

    @property
    def query_id(self) -> str:
        """The query's id, kept in its checkpoint: the same across restarts, another for a new checkpoint."""
        if self._query_id is None:
            self._query_id = str(json.loads(self.files.read_text("metadata"))["id"])
        return self._query_id

    def last_committed(self) -> int:
        """The newest batch of this query the branch holds; -1 when none. A batch of another query in the
        branch is refused: this query would write its rows a second time."""
        if self._last is None:
            table = IcebergTable(self.spark, self.identifier)
            found = []
            for snapshot in table.ancestors(table.branch_head(self.correction.branch), self.correction.base):
                summary = snapshot.summary()
                if summary.get(QUERY_ID) is not None:
                    found.append((str(summary.get(QUERY_ID)), int(summary.get(BATCH_ID))))
            others = sorted({query for query, _ in found if query != self.query_id})
            if others:
                raise BackfillError(
                    f"{self.identifier}: branch {self.correction.branch} holds batches of query "
                    f"{', '.join(others)}, not of this run's query {self.query_id} (checkpoint "
                    f"{self.files.location}): that checkpoint was removed or replaced, and its rows would be "
                    f"written twice. Nothing was written; correct the window again with `backfill run "
                    f"--branch {self.correction.branch} --start-over`"
                )
            self._last = max((batch for _, batch in found), default=-1)
        return self._last

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        if batch_id <= self.last_committed():
            # Run through all the same, written nowhere: the application's state is committed with the batch.
            log.info(
                "%s: branch %s holds batch %d already", self.identifier, self.correction.branch, batch_id
            )
            frame.write.format("noop").mode("overwrite").save()
            return
        if self.correction.end_column is None:
            self._append(frame.where(self.correction.window_sql()), batch_id)
            return
        frame.persist()
        try:
            self._stage(frame.where(f"NOT {self.correction.window_sql()}"), batch_id)
            self._append(frame.where(self.correction.window_sql()), batch_id)
        finally:
            frame.unpersist()

    def _append(self, rows: DataFrame, batch_id: int) -> None:
        (
            rows.writeTo(f"{self.identifier}.branch_{self.correction.branch}")
            .option(f"snapshot-property.{QUERY_ID}", self.query_id)
            .option(f"snapshot-property.{BATCH_ID}", str(batch_id))
            .append()
        )
        self._last = batch_id

    def _stage(self, rows: DataFrame, batch_id: int) -> None:
        """The batch's rows outside the window kept, once: a batch the table holds already is not."""
        staging = staging_identifier(self.identifier, self.correction.branch)
        if self._staged is None:
            if not self.spark.catalog.tableExists(staging):
                rows.limit(0).writeTo(staging).using("iceberg").create()
            snapshot = IcebergTable(self.spark, staging).table.currentSnapshot()
            summary = snapshot.summary() if snapshot is not None else None
            found = summary.get(BATCH_ID) if summary is not None else None
            self._staged = int(found) if found is not None else -1
        if batch_id <= self._staged or not rows.take(1):
            return
        (
            rows.writeTo(staging)
            .option(f"snapshot-property.{QUERY_ID}", self.query_id)
            .option(f"snapshot-property.{BATCH_ID}", str(batch_id))
            .append()
        )
        self._staged = batch_id
