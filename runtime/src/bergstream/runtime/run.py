"""`bergstream backfill run` and `bergstream app run`: an application's query, run until its backfill window
ends (or, live, until stopped) with its progress shown (tracker.py), then reported (run_report.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from bergstream.backfill.errors import BackfillError
from bergstream.backfill.read.planner import BackfillPlan, from_micros
from bergstream.progress_lines import ProgressLines
from bergstream.query import QueryRunner, progress_events, query_failure
from bergstream.runtime.app import output_identifier, query_name, start_query
from bergstream.runtime.checkpoint import CheckpointFiles, RowLedger
from bergstream.runtime.correct.branch import mark_complete, prepare_branch
from bergstream.runtime.correct.state import Correction
from bergstream.runtime.pins import release_plan
from bergstream.runtime.run_report import RunReport, backfill_report
from bergstream.runtime.settings import AppSettings
from bergstream.runtime.sources import PLAN_DIR, Sources
from bergstream.runtime.tracker import RunTracker
from bergstream.signals import on_stop_signals
from bergstream.timeparse import format_duration

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("bergstream.backfill")


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
    tracker = RunTracker(settings, ledger)
    stopping = threading.Event()
    correction = None
    if settings.backfill.correct is not None:
        correction = prepare_branch(spark, settings, output_identifier(settings))
    query = _AppQuery(spark, settings, available_now, stopping, correction)
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
        app=settings.app, mode=settings.mode, seconds=seconds,
        output=output_identifier(settings) if correction is None else (
            f"branch {correction.branch} of {output_identifier(settings)} (its rows of {correction.window})"
        ),
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
    report = backfill_report(spark, settings, plan, ledger, report, files)
    if correction is not None and report.complete:
        mark_complete(spark, settings, output_identifier(settings), query.watermarked)
    return report


class _AppQuery:
    """Starts the application's query; keeps the plan its backfill sources read, for the progress shown."""

    def __init__(
        self,
        spark: SparkSession,
        settings: AppSettings,
        available_now: bool,
        stopping: threading.Event,
        correction: Correction | None = None,
    ) -> None:
        self.spark = spark
        self.correction = correction
        self.settings = settings
        self.available_now = available_now
        self.sources = Sources(spark, settings, stopping)
        self.plan: BackfillPlan | None = None
        self.released = False
        self.watermarked = True

    def switched(self) -> None:
        """A bootstrap's sources have switched to Kafka, in a batch Spark committed: the archive is not
        read again, and its snapshots need not be held."""
        if not self.released and self.plan is not None:
            release_plan(self.settings, self.plan)
            self.released = True

    def start(self) -> StreamingQuery:
        started = start_query(self.spark, self.settings, self.available_now, self.sources, self.correction)
        self.watermarked = started.watermarked
        if self.settings.mode in ("backfill", "bootstrap"):
            self.plan = self.sources.plan()
        return started.query


def _follow(runner: QueryRunner, tracker: RunTracker, query: _AppQuery, show_progress: bool) -> None:
    """Run the query to its end, showing progress: percent of the window, rows/s, watermark, ETA."""
    started = time.monotonic()
    with ProgressLines(log, show_progress, percent=True) as lines:
        task = lines.add(runner.name, "starting", percent=True)

        def show(_: StreamingQuery) -> None:
            status, percent = tracker.status(query.plan, time.monotonic() - started)
            lines.update(task, status, percent)
            if tracker.position.phase == "kafka":
                query.switched()

        try:
            runner.run(show)
        finally:
            status, percent = tracker.status(query.plan, time.monotonic() - started)
            lines.update(task, status, percent)
