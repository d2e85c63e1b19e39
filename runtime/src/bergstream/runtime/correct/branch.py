"""The branch a correction's backfill writes: made from main's current snapshot with main's rows of the window
removed, in a transaction that records the correction in the table's properties (state.py)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bergstream.runtime.correct.state import Correction, property_name
from bergstream.runtime.settings import AppSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("bergstream.correct")
# Every snapshot of a correction's branch is kept while the branch lives: its publish applies their changes.
_KEEP_ALL = 2**31 - 1


class IcebergTable:
    """An Iceberg table through Spark's JVM: its properties, refs and snapshots, and the commits a correction
    makes with Iceberg's own API."""

    def __init__(self, spark: SparkSession, identifier: str) -> None:
        self.spark = spark
        self.identifier = identifier
        jvm: Any = spark._jvm
        self._util = getattr(jvm, "org.apache.iceberg.spark.Spark3Util")
        self.expressions = getattr(jvm, "org.apache.iceberg.expressions.Expressions")
        self.table = self._util.loadIcebergTable(spark._jsparkSession, identifier)

    def refresh(self) -> None:
        self.table.refresh()

    def property(self, name: str) -> str | None:
        value = self.table.properties().get(name)
        return None if value is None else str(value)

    def correction(self, branch: str) -> Correction | None:
        text = self.property(property_name(branch))
        return Correction.loads(text) if text is not None else None

    def save(self, correction: Correction) -> None:
        self.table.updateProperties().set(property_name(correction.branch), correction.dumps()).commit()

    def branch_head(self, branch: str) -> int | None:
        ref = self.table.refs().get(branch)
        return None if ref is None or not ref.isBranch() else int(ref.snapshotId())

    def ancestors(self, head: int | None, until: int | None = None) -> list[Any]:
        """The snapshots from `head` back to `until` (not included), newest first."""
        found = []
        snapshot = self.table.snapshot(head) if head is not None else None
        while snapshot is not None and int(snapshot.snapshotId()) != until:
            found.append(snapshot)
            parent = snapshot.parentId()
            snapshot = self.table.snapshot(parent) if parent is not None else None
        return found

    def window(self, correction: Correction) -> Any:
        """The Iceberg expression of a row in the correction's window, by its time column."""
        from bergstream.backfill.read.planner import to_micros

        both = getattr(self.expressions, "and")
        return both(
            self.expressions.greaterThanOrEqual(correction.time_column, to_micros(correction.start)),
            self.expressions.lessThan(correction.time_column, to_micros(correction.end)),
        )


def prepare_branch(spark: SparkSession, settings: AppSettings, identifier: str) -> Correction:
    """The correction's branch, made from main when new (in one commit with its record), then cleared of
    main's rows of the window once, before the query starts: a resumed backfill finds it as it left it.
    (Cleared beside the query's start instead, the clearing's tasks slow the first batches by more than it
    takes: bench/README.md.)"""
    table = IcebergTable(spark, identifier)
    correction = make_branch(table, settings)
    if correction.cleared:
        log.info(
            "%s: resuming the correction of %s in branch %s", identifier, correction.window, correction.branch
        )
        return correction
    return clear_branch(table, correction)


def make_branch(table: IcebergTable, settings: AppSettings) -> Correction:
    """The correction's record; its branch made from main's current snapshot, in one commit with the record,
    when it has none yet."""
    correct = settings.backfill.correct
    output = settings.output
    assert correct is not None and output.time_column is not None and output.key is not None
    correction = table.correction(correct.branch)
    if correction is not None:
        return correction
    base = table.table.currentSnapshot()
    assert base is not None, "checked before Spark started"
    correction = Correction(
        app=settings.app, branch=correct.branch, time_column=output.time_column, key=tuple(output.key),
        start=correct.start, end=correct.end, base=int(base.snapshotId()),
    )  # fmt: skip
    transaction = table.table.newTransaction()
    (
        transaction.manageSnapshots()
        .createBranch(correct.branch, correction.base)
        .setMinSnapshotsToKeep(correct.branch, _KEEP_ALL)
        .commit()
    )
    transaction.updateProperties().set(property_name(correct.branch), correction.dumps()).commit()
    transaction.commitTransaction()
    log.info("%s: branch %s made from main's snapshot %d to correct %s", table.identifier, correct.branch,
             correction.base, correction.window)  # fmt: skip
    return correction


def clear_branch(table: IcebergTable, correction: Correction) -> Correction:
    """Main's rows of the window removed from the branch, before any of the backfill's: the files that hold
    rows on both sides of the window are rewritten. Recorded, so that it is done once."""
    table.spark.sql(
        f"DELETE FROM {table.identifier}.branch_{correction.branch} WHERE {correction.window_sql()}"
    )
    table.refresh()
    correction = correction.but(cleared=True)
    table.save(correction)
    log.info(
        "%s: branch %s holds none of main's rows of %s",
        table.identifier,
        correction.branch,
        correction.window,
    )
    return correction


def mark_complete(spark: SparkSession, identifier: str, branch: str, watermark: datetime | None) -> None:
    """The backfill into `branch` covered its window, the application's event-time watermark at its end
    `watermark`: the correction may be published if that passed the window's end (checks.py)."""
    table = IcebergTable(spark, identifier)
    correction = table.correction(branch)
    if correction is None:
        return
    # A run that found nothing left to read (run again once complete) reports no watermark: the last stays.
    watermark = watermark or correction.watermark
    if not correction.complete or correction.watermark != watermark:
        table.save(correction.but(complete=True, watermark=watermark))
