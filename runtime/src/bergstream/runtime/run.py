"""`bergstream backfill run` and `bergstream app run`: an application's query, its progress and its report.

The report of a backfill says what was delivered, never more: the part of the window covered by batches
Spark committed, how many rows each source read over every run of the same request (kept beside the
checkpoint, so that a resumed run counts the rows of the runs before it), and where in Kafka the archive
it read ends (the hand-over positions its router recorded). The rows are counted twice, from the query's
progress and from the archive itself. A window not covered, or rows that disagree with the archive, make
the report incomplete, and the command exit non-zero. A complete backfill releases the snapshots it held
(runtime/pins.py); so does a bootstrap once it has switched to Kafka.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bergstream.backfill.errors import BackfillError
from bergstream.backfill.read.handover import Handover, recorded_handover
from bergstream.backfill.read.planner import BackfillPlan, from_micros, to_micros
from bergstream.progress_lines import ProgressLines
from bergstream.query import QueryRunner, progress_events, query_failure
from bergstream.runtime.app import output_identifier, query_name, start_query
from bergstream.runtime.checkpoint import CheckpointFiles
from bergstream.runtime.pins import release
from bergstream.runtime.settings import AppSettings
from bergstream.runtime.sources import PLAN_DIR, Sources
from bergstream.schemas.archive import INGESTION_TS_COLUMN, METADATA
from bergstream.signals import on_stop_signals
from bergstream.timeparse import format_duration, format_instant

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("bergstream.backfill")


@dataclass
class Position:
    """Where a run is, from the progress of its micro-batches."""

    batches: int = 0
    rows: dict[str, int] = field(default_factory=dict)  # per source name
    epoch: int = 0
    epochs: int | None = None
    watermark: datetime | None = None  # every row ingested before it has been read
    kafka_end_offsets: dict[str, dict[int, int]] = field(default_factory=dict)  # live: next offset to read
    # A bootstrap: "archive", then "kafka" once its sources have switched (the batch of the switch on).
    phase: str | None = None
    switched_at_batch: int | None = None

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


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


class RowLedger:
    """The rows each committed micro-batch of a backfill read, per source, in a file beside its checkpoint:
    a resumed run counts the rows of the runs before it, and a replayed batch once."""

    def __init__(self, files: CheckpointFiles, path: str) -> None:
        self.files = files
        self.path = path
        self.batches: dict[int, dict[str, int]] = {}
        if files.exists(path):
            loaded = json.loads(files.read_text(path))
            self.batches = {int(batch): dict(rows) for batch, rows in loaded.items()}

    def record(self, batch_id: int, rows: dict[str, int]) -> None:
        self.batches[batch_id] = rows
        counted = {str(batch): counted for batch, counted in sorted(self.batches.items())}
        self.files.write_text(self.path, json.dumps(counted))

    def totals(self, sources: list[str]) -> dict[str, int]:
        return {source: sum(rows.get(source, 0) for rows in self.batches.values()) for source in sources}


class _Progress:
    """Follows the query's progress events; `position` is read by the display and the report."""

    def __init__(self, settings: AppSettings, ledger: RowLedger | None = None) -> None:
        # How each named source shows in a progress event's description, whatever order the plan has.
        self.markers = {
            name: (f"[{name}:", f"Subscribe[{source.topic}]") for name, source in settings.sources.items()
        }
        self.position = Position(rows=dict.fromkeys(settings.sources, 0))
        self.lock = threading.Lock()
        self.ledger = ledger

    def _name(self, description: str) -> str:
        for name, markers in self.markers.items():
            if any(marker in description for marker in markers):
                return name
        return description

    def on_progress(self, progress: Any) -> None:
        with self.lock:
            position = self.position
            position.batches += 1
            batch_rows: dict[str, int] = {}
            for source in progress.sources:
                name = self._name(str(source.description))
                batch_rows[name] = batch_rows.get(name, 0) + int(source.numInputRows)
                position.rows[name] = position.rows.get(name, 0) + int(source.numInputRows)
                end = _offset_json(source.endOffset)
                if isinstance(end, dict) and end.get("phase") == "kafka":
                    if position.phase != "kafka":
                        position.phase = "kafka"
                        position.switched_at_batch = int(progress.batchId)
                        log.info("%s: switched to Kafka in batch %d", name, progress.batchId)
                    position.epoch = int(end.get("epochs", position.epoch))
                    for topic, partitions in end.get("kafka", {}).items():
                        position.kafka_end_offsets[topic] = {int(p): int(o) for p, o in partitions.items()}
                elif isinstance(end, dict) and "epoch" in end:
                    if end.get("phase") == "archive":
                        position.phase = position.phase or "archive"
                    position.epoch = int(end["epoch"])
                    position.epochs = int(end.get("epochs", 0)) or position.epochs
                    if end.get("watermark"):
                        position.watermark = datetime.fromisoformat(end["watermark"].replace("Z", "+00:00"))
                elif isinstance(end, dict):
                    for topic, partitions in end.items():
                        position.kafka_end_offsets[topic] = {int(p): int(o) for p, o in partitions.items()}
            if self.ledger is not None:
                self.ledger.record(int(progress.batchId), batch_rows)


def _offset_json(offset: Any) -> Any:
    if offset is None:
        return None
    if isinstance(offset, dict):
        return offset
    try:
        return json.loads(offset)
    except (TypeError, ValueError):
        return None


def run_app(
    spark: SparkSession, settings: AppSettings, available_now: bool = False, show_progress: bool = True
) -> RunReport:
    """Run the application until its backfill window ends (or, live, until stopped), then report."""
    from pyspark.errors import StreamingQueryException

    started = time.monotonic()
    ledger = None
    files = CheckpointFiles(spark, settings.checkpoint_location)
    if settings.mode == "backfill":
        ledger = RowLedger(files, f"{PLAN_DIR}/rows.json")
    tracker = _Progress(settings, ledger)
    stopping = threading.Event()
    query = _AppQuery(spark, settings, available_now, stopping)
    runner = QueryRunner(query_name(settings), query.start, stopping, query.sources.recover)
    try:
        with progress_events(spark, tracker.on_progress), on_stop_signals(runner.stopping.set):
            _follow(runner, tracker, query, show_progress)
    except StreamingQueryException as error:
        raise BackfillError(f"{settings.app}: the query stopped: {query_failure(error)}") from error
    if runner.stopping.is_set():
        log.warning("%s: stopped; run the same command again to resume from the checkpoint", settings.app)
    plan = query.plan
    seconds = time.monotonic() - started
    report = RunReport(
        app=settings.app, mode=settings.mode, output=output_identifier(settings), seconds=seconds,
        position=tracker.position, window=None, bound=None,
    )  # fmt: skip
    if plan is not None and settings.mode == "bootstrap":
        if tracker.position.phase == "kafka":
            query.switched()
        return replace(
            report,
            window=(from_micros(plan.window.start), from_micros(plan.window.end)),
            bound=format_duration(plan.policy.bound) if plan.policy.bound is not None else None,
            handovers=query.sources.handovers,
        )
    if plan is None or ledger is None:
        return report
    return _backfill_report(spark, settings, plan, ledger, report, files)


def _backfill_report(
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
        _release(settings, plan)
    return replace(
        report, window=window, bound=bound, rows_read=rows_read, rows_in_archive=rows_in_archive,
        handovers=handovers_read(settings, plan), problems=problems,
    )  # fmt: skip


def _release(settings: AppSettings, plan: BackfillPlan) -> None:
    """Let expiry have the snapshots the run held: it reads them no more."""
    tables = [scan.table.identifier for scan in plan.tables]
    try:
        release(settings.catalog, tables, settings.checkpoint_location)
    except Exception as error:
        log.warning(
            "%s: the snapshots it read stay held (%s); `bergstream backfill release --checkpoint %s` lets "
            "maintenance expire them", settings.app, error, settings.checkpoint_location,
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


def committed_batches(files: CheckpointFiles) -> list[int]:
    """The micro-batches Spark committed: delivered whole."""
    return sorted(int(name) for name in files.names("commits") if name.isdigit())


def logged_epoch(files: CheckpointFiles, batch: int) -> int | None:
    """The epochs done once `batch` is, from the query's offset log; None for no such batch."""
    logged = f"offsets/{batch}"
    if batch < 0 or not files.exists(logged):
        return None
    epochs = []
    for line in files.read_text(logged).splitlines()[2:]:
        offset = _offset_json(line)
        if isinstance(offset, dict) and "epoch" in offset:
            epochs.append(int(offset["epoch"]))
    return min(epochs) if epochs else None


def committed_epoch(files: CheckpointFiles) -> int | None:
    """The epochs done by the newest micro-batch Spark committed; None before the first commit. A batch
    in the offset log but not in the commit log has not been delivered."""
    committed = committed_batches(files)
    return logged_epoch(files, committed[-1]) if committed else None


class _AppQuery:
    """Starts the application's query; keeps the plan its backfill sources read, for the progress shown."""

    def __init__(
        self, spark: SparkSession, settings: AppSettings, available_now: bool, stopping: threading.Event
    ) -> None:
        self.spark = spark
        self.settings = settings
        self.available_now = available_now
        self.sources = Sources(spark, settings, stopping)
        self.plan: BackfillPlan | None = None
        self.released = False

    def switched(self) -> None:
        """A bootstrap's sources have switched to Kafka, in a batch Spark committed: the archive is not
        read again, and its snapshots need not be held."""
        if not self.released and self.plan is not None:
            _release(self.settings, self.plan)
            self.released = True

    def start(self) -> StreamingQuery:
        query, _ = start_query(self.spark, self.settings, self.available_now, self.sources)
        if self.settings.mode in ("backfill", "bootstrap"):
            self.plan = self.sources.plan()
        return query


def _follow(runner: QueryRunner, tracker: _Progress, query: _AppQuery, show_progress: bool) -> None:
    """Run the query to its end, showing progress: percent of the window, rows/s, watermark, ETA."""
    started = time.monotonic()
    with ProgressLines(log, show_progress, percent=True) as lines:
        task = lines.add(runner.name, "starting", percent=True)

        def show(_: StreamingQuery) -> None:
            status, percent = _status(tracker, query.plan, time.monotonic() - started)
            lines.update(task, status, percent)
            if tracker.position.phase == "kafka":
                query.switched()

        try:
            runner.run(show)
        finally:
            status, percent = _status(tracker, query.plan, time.monotonic() - started)
            lines.update(task, status, percent)


def _status(tracker: _Progress, plan: BackfillPlan | None, elapsed: float) -> tuple[str, float]:
    with tracker.lock:
        position = tracker.position
        rows, watermark, epoch = position.total_rows, position.watermark, position.epoch
        position = replace(position)
    rate = rows / elapsed if elapsed > 0 else 0.0
    if position.phase == "kafka":
        return (
            f"Kafka (switched in batch {position.switched_at_batch}), {rows:,} rows, {rate:,.0f} rows/s",
            100.0,
        )
    if plan is None or watermark is None:
        return f"{rows:,} rows, {rate:,.0f} rows/s", 0.0
    window = plan.window
    done = (to_micros(watermark) - window.start) / (window.end - window.start)
    remaining = sum(e.estimated_rows for e in plan.epochs[epoch:])
    eta = f"ETA {remaining / rate:,.0f}s" if rate > 0 and remaining else "ETA -"
    status = (
        f"epoch {epoch}/{len(plan.epochs)}, watermark {format_instant(watermark)}, "
        f"{rows:,} rows, {rate:,.0f} rows/s, {eta}"
    )
    return status, 100.0 * min(max(done, 0.0), 1.0)
