"""`bergstream backfill run` and `bergstream app run`: an application's query, its progress and its report.

The report of a backfill says which part of the window was covered, how many rows each source read, and,
per Kafka partition, the last archived offset read: where a live run takes over. The rows are counted
twice, from the query's progress and from the archive itself, and a difference is reported as an error.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bergstream.backfill.errors import BackfillError
from bergstream.backfill.read.planner import BackfillPlan, from_micros, to_micros
from bergstream.backfill.runtime.app import output_identifier, query_name, start_query
from bergstream.backfill.runtime.settings import AppSettings
from bergstream.backfill.runtime.sources import Sources
from bergstream.errors import first_line
from bergstream.progress import ProgressLines
from bergstream.query import QueryRunner
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
class EndOffset:
    topic: str
    partition: int
    last_offset: int
    rows: int


@dataclass(frozen=True)
class RunReport:
    app: str
    mode: str
    output: str
    seconds: float
    position: Position
    window: tuple[datetime, datetime] | None
    bound: str | None
    end_offsets: list[EndOffset]
    rows_in_archive: dict[str, int]

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
        for source, rows in sorted(self.position.rows.items()):
            archived = self.rows_in_archive.get(source)
            check = "" if archived is None else f" (the archive holds {archived:,} in the window)"
            lines.append(f"  {source}: {rows:,} rows read{check}")
        if self.end_offsets:
            lines.append("  last archived offset read per partition (a live run takes over after it):")
            for end in self.end_offsets:
                lines.append(
                    f"    {end.topic} partition {end.partition}: offset {end.last_offset} ({end.rows:,} rows)"
                )
        for topic, offsets in sorted(self.position.kafka_end_offsets.items()):
            listed = ", ".join(f"p{p}: {o}" for p, o in sorted(offsets.items()))
            lines.append(f"  {topic}: next offsets {listed}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "mode": self.mode,
            "output": self.output,
            "seconds": self.seconds,
            "batches": self.position.batches,
            "rows": self.position.rows,
            "rows_in_archive": self.rows_in_archive,
            "window": [format_instant(t) for t in self.window] if self.window else None,
            "watermark": format_instant(self.position.watermark) if self.position.watermark else None,
            "max_misalignment": self.bound,
            "end_offsets": [end.__dict__ for end in self.end_offsets],
            "kafka_end_offsets": self.position.kafka_end_offsets,
        }


class _Progress:
    """Follows the query's progress events; `position` is read by the display and the report."""

    def __init__(self, settings: AppSettings) -> None:
        # How each named source shows in a progress event's description, whatever order the plan has.
        self.markers = {
            name: (f"[{name}:", f"Subscribe[{source.topic}]") for name, source in settings.sources.items()
        }
        self.position = Position(rows=dict.fromkeys(settings.sources, 0))
        self.lock = threading.Lock()

    def _name(self, description: str) -> str:
        for name, markers in self.markers.items():
            if any(marker in description for marker in markers):
                return name
        return description

    def on_progress(self, progress: Any) -> None:
        with self.lock:
            position = self.position
            position.batches += 1
            for source in progress.sources:
                name = self._name(str(source.description))
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
    from pyspark.sql.streaming.listener import StreamingQueryListener

    started = time.monotonic()
    tracker = _Progress(settings)

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            tracker.on_progress(event.progress)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    listener = Listener()
    spark.streams.addListener(listener)
    stopping = threading.Event()
    query = _AppQuery(spark, settings, available_now, stopping)
    runner = QueryRunner(query_name(settings), query.start, stopping, query.sources.recover)
    try:
        with on_stop_signals(runner.stopping.set):
            _follow(runner, tracker, query, show_progress)
    except StreamingQueryException as error:
        raise BackfillError(f"{settings.app}: the query stopped: {first_line(error)}") from error
    finally:
        spark.streams.removeListener(listener)
    if runner.stopping.is_set():
        log.warning("%s: stopped; run the same command again to resume from the checkpoint", settings.app)
    plan = query.plan
    seconds = time.monotonic() - started
    end_offsets: list[EndOffset] = []
    rows_in_archive: dict[str, int] = {}
    window = None
    bound = None
    if plan is not None and settings.mode == "bootstrap":
        window = (from_micros(plan.window.start), from_micros(plan.window.end))
        bound = format_duration(plan.policy.bound) if plan.policy.bound is not None else None
    elif plan is not None:
        checkpointed = checkpointed_watermark(settings.checkpoint_location)
        position = tracker.position
        if checkpointed is not None and (position.watermark is None or checkpointed > position.watermark):
            position.watermark = checkpointed
        window = (from_micros(plan.window.start), from_micros(plan.window.end))
        bound = format_duration(plan.policy.bound) if plan.policy.bound is not None else None
        end_offsets, rows_in_archive = archive_positions(spark, settings, plan)
        position = tracker.position
        for name, expected in rows_in_archive.items():
            if position.watermark is not None and position.watermark >= window[1]:
                read = position.rows.get(name, 0)
                if read != expected:
                    log.error("%s: source %s read %d rows but the archive holds %d in the window",
                              settings.app, name, read, expected)  # fmt: skip
    return RunReport(
        app=settings.app, mode=settings.mode, output=output_identifier(settings), seconds=seconds,
        position=tracker.position, window=window, bound=bound, end_offsets=end_offsets,
        rows_in_archive=rows_in_archive,
    )  # fmt: skip


def archive_positions(
    spark: SparkSession, settings: AppSettings, plan: BackfillPlan
) -> tuple[list[EndOffset], dict[str, int]]:
    """Per Kafka partition, the last offset of the window in each source's archive; rows per source."""
    from pyspark.sql import functions as F

    from bergstream.backfill.read.planner import table_ref

    ends: list[EndOffset] = []
    rows: dict[str, int] = {}
    start, end = (format_instant(from_micros(t)) for t in (plan.window.start, plan.window.end))
    for name, source in settings.sources.items():
        scan = plan.scan_of(table_ref(source.table_or_topic, settings.catalog).identifier)
        if scan.snapshot_id is None:
            rows[name] = 0
            continue
        table = spark.read.option("versionAsOf", str(scan.snapshot_id)).table(scan.table.identifier)
        ts = F.col(INGESTION_TS_COLUMN)
        selected = table.where((ts >= F.lit(start).cast("timestamp")) & (ts < F.lit(end).cast("timestamp")))
        if plan.regions is not None:
            selected = selected.where(F.col(f"{METADATA}.cluster").isin(list(plan.regions)))
        counted = selected.groupBy(F.col(f"{METADATA}.topic").alias("topic"),
                                   F.col(f"{METADATA}.partition").alias("partition")).agg(
            F.max(f"{METADATA}.offset").alias("last_offset"), F.count("*").alias("rows")
        )  # fmt: skip
        found = counted.orderBy("topic", "partition").collect()
        ends += [EndOffset(r.topic, int(r.partition), int(r.last_offset), int(r.rows)) for r in found]
        rows[name] = sum(int(r.rows) for r in found)
    return ends, rows


def checkpointed_watermark(checkpoint: str) -> datetime | None:
    """The backfill watermark of the newest micro-batch in the query's offset log, where one ran before."""
    offsets = Path(checkpoint) / "offsets"
    logged = (
        sorted((int(p.name), p) for p in offsets.glob("*") if p.name.isdigit()) if offsets.is_dir() else []
    )
    if not logged:
        return None
    marks = []
    for line in logged[-1][1].read_text().splitlines()[2:]:
        offset = _offset_json(line)
        if isinstance(offset, dict) and offset.get("watermark"):
            marks.append(datetime.fromisoformat(str(offset["watermark"]).replace("Z", "+00:00")))
    return min(marks) if marks else None


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
