"""Each micro-batch of a correction's backfill, written once; its rows of the window copied into the branch
once the run completes.

Spark's streaming writer of an Iceberg table looks for a batch already committed on main, not on a branch;
so each batch is appended through foreachBatch, its query's id and batch's id in the snapshot's summary, and
a batch written already (a batch run again after a kill) is not written twice. The batches go to the run's
own table beside the output (`<output>__correction_<branch>`, unpartitioned: one file a task, whatever
hours its rows fall in), every row the run computes: those of the window, and beside it the warm-up's and
the settle's, that the spans across the window's edges need (edges.py). As the run completes, its rows of
the window are appended to the branch in one commit, marked with the run; the table is dropped by the
correction's release. A run's table that holds batches of another query (a checkpoint lost or
replaced) is refused: rows of two queries never meet in it.
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
# The snapshot summary key of the branch's commit of the run's rows of the window: the run's name.
COPIED = "bergstream.correction.copied-run"


class BranchWriter:
    """foreachBatch's function: batch `batch_id`'s rows appended to the run's table, once."""

    def __init__(self, spark: SparkSession, identifier: str, correction: Correction, checkpoint: str) -> None:
        self.spark = spark
        self.identifier = identifier
        self.correction = correction
        self.staging = staging_identifier(identifier, correction.branch)
        self.files = CheckpointFiles(spark, checkpoint)
        self._query_id: str | None = None
        self._last: int | None = None

    @property
    def query_id(self) -> str:
        """The query's id, kept in its checkpoint: the same across restarts, another for a new checkpoint."""
        if self._query_id is None:
            self._query_id = str(json.loads(self.files.read_text("metadata"))["id"])
        return self._query_id

    def last_committed(self) -> int:
        """The newest batch of this query the run's table holds; -1 when none. A batch of another query in
        it is refused: this query would write its rows a second time."""
        if self._last is None:
            if not self.spark.catalog.tableExists(self.staging):
                self._last = -1
                return self._last
            table = IcebergTable(self.spark, self.staging)
            current = table.table.currentSnapshot()
            found = []
            for snapshot in table.ancestors(int(current.snapshotId()) if current is not None else None):
                summary = snapshot.summary()
                if summary.get(QUERY_ID) is not None:
                    found.append((str(summary.get(QUERY_ID)), int(summary.get(BATCH_ID))))
            others = sorted({query for query, _ in found if query != self.query_id})
            if others:
                raise BackfillError(
                    f"{self.identifier}: the correction in branch {self.correction.branch} holds batches of "
                    f"query {', '.join(others)} in {self.staging}, not of this run's query {self.query_id} "
                    f"(checkpoint {self.files.location}): that checkpoint was removed or replaced, and its "
                    "rows would be written twice. Nothing was written; correct the window again with "
                    f"`backfill run --branch {self.correction.branch} --start-over`"
                )
            self._last = max((batch for _, batch in found), default=-1)
        return self._last

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        if batch_id <= self.last_committed():
            # Run through all the same, written nowhere: the application's state is committed with the batch.
            log.info("%s: %s holds batch %d already", self.identifier, self.staging, batch_id)
            frame.write.format("noop").mode("overwrite").save()
            return
        if self._last == -1 and not self.spark.catalog.tableExists(self.staging):
            frame.limit(0).writeTo(self.staging).using("iceberg").create()
        (
            frame.writeTo(self.staging)
            .option(f"snapshot-property.{QUERY_ID}", self.query_id)
            .option(f"snapshot-property.{BATCH_ID}", str(batch_id))
            .append()
        )
        self._last = batch_id


def copy_window(spark: SparkSession, table: IcebergTable, correction: Correction) -> None:
    """The run's rows of the window appended to the branch in one commit, marked with the run: once, a run
    killed after it and run again finds the mark."""
    run = correction.identity.run if correction.identity is not None else "unnamed"
    for snapshot in table.ancestors(table.branch_head(correction.branch), correction.base):
        if snapshot.summary().get(COPIED) == run:
            return
    staging = staging_identifier(table.identifier, correction.branch)
    if not spark.catalog.tableExists(staging):
        return  # no batch: the run read nothing
    (
        spark.table(staging)
        .where(correction.window_sql())
        .writeTo(f"{table.identifier}.branch_{correction.branch}")
        .option(f"snapshot-property.{COPIED}", run)
        .append()
    )
    table.refresh()
    log.info("%s: the run's rows of %s copied into branch %s", table.identifier, correction.window,
             correction.branch)  # fmt: skip
