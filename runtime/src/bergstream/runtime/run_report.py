"""What an application's run delivered: its report.

The report of a backfill says what was delivered, never more: the part of the window covered by batches
Spark committed, how many rows each source read over every run of the same request (kept beside the
checkpoint, so that a resumed run counts the rows of the runs before it), and where in Kafka the archive
it read ends (the hand-over positions its router recorded). The rows are counted twice, from the query's
progress and from the archive itself. A window not covered, or rows that disagree with the archive, make
the report incomplete, and the command exit non-zero. A complete backfill releases the snapshots it held
(pins.py); so does a bootstrap once it has switched to Kafka.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bergstream.backfill.read.handover import Handover, recorded_handover
from bergstream.backfill.read.planner import BackfillPlan, from_micros
from bergstream.runtime.checkpoint import (
    CheckpointFiles,
    RowLedger,
    committed_batches,
    committed_epoch,
    logged_epoch,
)
from bergstream.runtime.pins import release_plan
from bergstream.runtime.settings import AppSettings
from bergstream.runtime.tracker import Position
from bergstream.schemas.archive import INGESTION_TS_COLUMN, METADATA
from bergstream.timeparse import format_duration, format_instant

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("bergstream.backfill")


@dataclass(frozen=True)
class RunReport:
    app: str
    mode: str
    output: str
    seconds: float
    position: Position
    window: tuple[datetime, datetime] | None
    bound: str | None
    # Per source: the rows read over every run of this request, and the rows the archive holds in the window.
    rows_read: dict[str, int] = field(default_factory=dict)
    rows_in_archive: dict[str, int] = field(default_factory=dict)
    # Per source: where the archive it read ends in Kafka, as its router recorded it.
    handovers: dict[str, Handover] = field(default_factory=dict)
    # What keeps a backfill from being complete; None for a live run, which has no end to reach.
    problems: list[str] | None = None

    @property
    def complete(self) -> bool | None:
        return None if self.problems is None else not self.problems

    def lines(self) -> list[str]:
        rate = self.position.total_rows / self.seconds if self.seconds else 0.0
        head = f"{self.mode} of {self.app}"
        if self.window is not None:
            first, last = (format_instant(t) for t in self.window)
            covered = format_instant(self.position.watermark) if self.position.watermark else first
            head += f": window {first} to {last}, covered to {covered}, B {self.bound or 'none (unordered)'}"
        lines = [
            head,
            f"  {self.position.batches} micro-batches, {self.position.total_rows:,} rows in "
            f"{self.seconds:.1f}s ({rate:,.0f} rows/s), output appended to {self.output}",
        ]
        for source, rows in sorted((self.rows_read or self.position.rows).items()):
            archived = self.rows_in_archive.get(source)
            check = "" if archived is None else f" (the archive holds {archived:,} in the window)"
            runs = " over every run" if self.rows_read else ""
            lines.append(f"  {source}: {rows:,} rows read{runs}{check}")
        if self.handovers:
            lines.append("  the archive read ends in Kafka at (`app run --from` hands over there):")
            for source, handover in sorted(self.handovers.items()):
                lines.append(f"    {source}: {handover.describe()}")
        for topic, offsets in sorted(self.position.kafka_end_offsets.items()):
            listed = ", ".join(f"p{p}: {o}" for p, o in sorted(offsets.items()))
            lines.append(f"  {topic}: next offsets {listed}")
        for problem in self.problems or []:
            lines.append(f"  incomplete: {problem}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "mode": self.mode,
            "complete": self.complete,
            "problems": self.problems,
            "output": self.output,
            "seconds": self.seconds,
            "batches": self.position.batches,
            "rows": self.rows_read or self.position.rows,
            "rows_in_archive": self.rows_in_archive,
            "window": [format_instant(t) for t in self.window] if self.window else None,
            "watermark": format_instant(self.position.watermark) if self.position.watermark else None,
            "max_misalignment": self.bound,
            "handovers": {source: handover.to_json() for source, handover in self.handovers.items()},
            "kafka_end_offsets": self.position.kafka_end_offsets,
        }


def backfill_report(
    spark: SparkSession,
    settings: AppSettings,
    plan: BackfillPlan,
    ledger: RowLedger,
    report: RunReport,
    files: CheckpointFiles,
) -> RunReport:
    """What a backfill delivered over all its runs: the window covered by committed batches, the rows read
    against the archive's, and where the archive it read ends in Kafka."""
    window = (from_micros(plan.window.start), from_micros(plan.window.end))
    bound = format_duration(plan.policy.bound) if plan.policy.bound is not None else None
    position = report.position
    committed = committed_epoch(files)
    if committed is not None:
        position.epoch = max(position.epoch, committed)
    done = position.epoch >= len(plan.epochs)
    # Past the last epoch there is nothing more in the window to read: the whole window is covered.
    position.watermark = (
        window[1]
        if done
        else from_micros(plan.epochs[position.epoch - 1].upper if position.epoch else plan.window.start)
    )
    rows_in_archive = count_in_archive(spark, settings, plan, [(plan.window.start, plan.window.end)])
    sources = list(settings.sources)
    rows_read = ledger.totals(sources)
    unreported = [batch for batch in committed_batches(files) if batch not in ledger.batches]
    if unreported:
        # A run killed after Spark committed a batch and before its progress reached bergstream.
        ranges = [
            (plan.epochs[epoch].lower, plan.epochs[epoch].upper)
            for batch in unreported
            for epoch in range(logged_epoch(files, batch - 1) or 0, logged_epoch(files, batch) or 0)
        ]  # fmt: skip
        log.warning("%s: batches %s of an earlier run stopped before their progress was recorded: their "
                    "rows are counted from the archive", settings.app, unreported)  # fmt: skip
        for name, rows in count_in_archive(spark, settings, plan, ranges).items():
            rows_read[name] += rows
    problems = []
    if not done:
        problems.append(
            f"covered to {format_instant(position.watermark)} of a window ending {format_instant(window[1])} "
            f"({position.epoch} of {len(plan.epochs)} epochs): run the same command again to resume"
        )
    else:
        for name in sources:
            if rows_read[name] != rows_in_archive.get(name, 0):
                problems.append(
                    f"source {name} read {rows_read[name]:,} rows but the archive holds "
                    f"{rows_in_archive.get(name, 0):,} in the window"
                )
    for problem in problems:
        log.error("%s: %s", settings.app, problem)
    if not problems:
        release_plan(settings, plan)
    return replace(
        report, window=window, bound=bound, rows_read=rows_read, rows_in_archive=rows_in_archive,
        handovers=handovers_read(settings, plan), problems=problems,
    )  # fmt: skip


def handovers_read(settings: AppSettings, plan: BackfillPlan) -> dict[str, Handover]:
    """Per source, where the archive it read ends in Kafka: the newest router commit of its topic and
    cluster at or before the snapshot the backfill pinned."""
    from bergstream.backfill.read.planner import table_ref

    handovers = {}
    for name, source in settings.sources.items():
        scan = plan.scan_of(table_ref(source.table_or_topic, settings.catalog).identifier)
        if scan.snapshot_id is None:
            continue
        handover = recorded_handover(
            settings.catalog, scan.table, source.topic, source.cluster, scan.snapshot_id
        )
        if handover is not None:
            handovers[name] = handover
    return handovers


def count_in_archive(
    spark: SparkSession, settings: AppSettings, plan: BackfillPlan, ranges: list[tuple[int, int]]
) -> dict[str, int]:
    """Per source, the rows ingested in `ranges` ([lower, upper) in microseconds) in the snapshot the
    backfill pinned, regions applied."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    from bergstream.backfill.read.planner import table_ref

    rows: dict[str, int] = {}
    ts = F.col(INGESTION_TS_COLUMN)
    within: Column | None = None
    for lower, upper in ranges:
        start, end = (format_instant(from_micros(t)) for t in (lower, upper))
        one = (ts >= F.lit(start).cast("timestamp")) & (ts < F.lit(end).cast("timestamp"))
        within = one if within is None else within | one
    for name, source in settings.sources.items():
        scan = plan.scan_of(table_ref(source.table_or_topic, settings.catalog).identifier)
        if scan.snapshot_id is None or within is None:
            rows[name] = 0
            continue
        selected = (
            spark.read.option("versionAsOf", str(scan.snapshot_id)).table(scan.table.identifier).where(within)
        )
        if plan.regions is not None:
            selected = selected.where(F.col(f"{METADATA}.cluster").isin(list(plan.regions)))
        rows[name] = selected.count()
    return rows
