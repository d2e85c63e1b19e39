"""Each micro-batch of a correction's backfill, written once into its branch.

Spark's streaming writer of an Iceberg table looks for a batch already committed on main, not on a branch;
so the batch is appended through foreachBatch, its query's id and batch's id in the snapshot's summary, and
a batch the branch holds already (a batch run again after a kill) is not written twice. Only the rows of the
correction's window are written: the warm-up's rows and those the read's end leaves incomplete are not.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from bergstream.runtime.checkpoint import CheckpointFiles
from bergstream.runtime.correct.branch import IcebergTable
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
        self.checkpoint = checkpoint
        self._query_id: str | None = None
        self._last: int | None = None

    @property
    def query_id(self) -> str:
        """The query's id, kept in its checkpoint: the same across restarts, another for a new checkpoint."""
        if self._query_id is None:
            metadata = CheckpointFiles(self.spark, self.checkpoint).read_text("metadata")
            self._query_id = str(json.loads(metadata)["id"])
        return self._query_id

    def last_committed(self) -> int:
        """The newest batch of this query the branch holds; -1 when none."""
        if self._last is None:
            table = IcebergTable(self.spark, self.identifier)
            self._last = -1
            for snapshot in table.ancestors(table.branch_head(self.correction.branch), self.correction.base):
                summary = snapshot.summary()
                if summary.get(QUERY_ID) == self.query_id:
                    self._last = int(summary.get(BATCH_ID))
                    break
        return self._last

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        if batch_id <= self.last_committed():
            # Run through all the same, written nowhere: the application's state is committed with the batch.
            log.info(
                "%s: branch %s holds batch %d already", self.identifier, self.correction.branch, batch_id
            )
            frame.write.format("noop").mode("overwrite").save()
            return
        rows = frame.where(self.correction.window_sql())
        (
            rows.writeTo(f"{self.identifier}.branch_{self.correction.branch}")
            .option(f"snapshot-property.{QUERY_ID}", self.query_id)
            .option(f"snapshot-property.{BATCH_ID}", str(batch_id))
            .append()
        )
        self._last = batch_id
