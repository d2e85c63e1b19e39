"""One redrive of a topic: finish the interrupted ones, read the pending dead letters, classify them, then
append and mark."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from bergstream.router.config import RouterConfig
from bergstream.router.evolve import evolve_table, plan_evolution
from bergstream.router.redrive.classify import classify, count_outcomes, marks, pending, redriven_rows
from bergstream.router.redrive.commit import append, finish, mark
from bergstream.router.redrive.report import RedriveReport
from bergstream.router.redrive.snapshots import (
    ARCHIVE_SNAPSHOT_PROPERTY,
    DEAD_LETTER_SNAPSHOT_PROPERTY,
    ID_PROPERTY,
    REASON_FILTER_PROPERTY,
    RedriveTables,
    new_redrive_id,
    unfinished,
)
from bergstream.router.redrive.stage_progress import RedriveProgress
from bergstream.router.registry_topic import topic_parser
from bergstream.schemas.archive import DEAD_LETTER_TYPE, INGESTION_TS, METADATA
from bergstream.schemas.spark_types import ddl_type

log = logging.getLogger("bergstream.router.redrive")


def redrive(
    spark: SparkSession,
    config: RouterConfig,
    reason: str | None = None,
    dry_run: bool = False,
    show_progress: bool = False,
) -> RedriveReport:
    """Archive the dead letters of the topic of `config` that parse now (those whose reason contains
    `reason`), exactly once, and mark them; with `dry_run`, only say what would happen."""
    started = time.monotonic()
    # A session of its own: the snapshot properties of the MERGE are set in its configuration, where no
    # other write of the caller's session (a router in the same driver) can pick them up.
    session = spark.newSession()
    layout, splitter, _ = topic_parser(config)
    tables = RedriveTables(session, config, layout)
    report = RedriveReport(
        topic=config.settings.topic,
        redrive_id=new_redrive_id(),
        dead_letter_table=tables.dead_letters,
        archive_table=tables.archive,
        dry_run=dry_run,
        reason_filter=reason,
    )
    with RedriveProgress(session, show_progress) as progress:
        if not dry_run:
            # The fixed schema may have new optional fields; an older dead-letter table lacks the marks.
            evolve_table(session, tables.archive, layout)
            _add_redrive_columns(session, tables.dead_letters)
        earlier = tables.redrive_snapshots(tables.archive)
        done = [s.redrive_id for s in tables.redrive_snapshots(tables.dead_letters)] if earlier else []
        for interrupted in unfinished(earlier, done):
            with progress.phase(f"finishing redrive {interrupted.redrive_id}"):
                report.finished.append(finish(tables, interrupted, dry_run))
        report.dead_letter_snapshot = tables.current_snapshot(tables.dead_letters)
        if report.dead_letter_snapshot is None:
            return report
        with progress.phase("reading dead letters"):
            waiting = pending(tables, report.dead_letter_snapshot, reason)
            bounds = waiting.agg(
                F.count(F.lit(1)).alias("rows"),
                F.min(F.unix_micros(F.col(METADATA)[INGESTION_TS])).alias("lower"),
                F.max(F.unix_micros(F.col(METADATA)[INGESTION_TS])).alias("upper"),
            ).first()
        assert bounds is not None
        if not bounds.rows:
            return report
        lower, upper = int(bounds.lower), int(bounds.upper)
        log.info(
            "redrive %s: parsing %d dead letters of %s ingested from %s to %s",
            report.redrive_id, bounds.rows, config.settings.topic, _instant(lower), _instant(upper),
        )  # fmt: skip
        classified = classify(tables, splitter, waiting, bounds.rows, lower, upper).persist()
        try:
            with progress.phase(f"parsing {bounds.rows:,} dead letters"):
                report.counts = count_outcomes(classified)
            report.seconds = time.monotonic() - started
            if dry_run:
                return report
            # The topic and cluster its rows come from, with no Kafka position: they lie below the
            # position of the router commit before them, where a bootstrap's archive phase reads them.
            properties = {
                **config.origin.properties(),
                ID_PROPERTY: report.redrive_id,
                DEAD_LETTER_SNAPSHOT_PROPERTY: str(report.dead_letter_snapshot),
                **({REASON_FILTER_PROPERTY: reason} if reason is not None else {}),
                **report.counts.properties(),
            }
            redriven_at: Column = F.current_timestamp()
            if report.counts.redriven:
                log.info("redrive %s: appending %d rows to %s", report.redrive_id, report.counts.redriven,
                         tables.archive)  # fmt: skip
                with progress.phase(f"appending {report.counts.redriven:,} rows to {tables.archive}"):
                    appended = append(tables, redriven_rows(classified, splitter), properties)
                report.archive_snapshot = appended.snapshot_id
                redriven_at = F.timestamp_micros(F.lit(appended.committed_micros))
                properties[ARCHIVE_SNAPSHOT_PROPERTY] = str(appended.snapshot_id)
                log.info(
                    "redrive %s: appended %d rows to %s in snapshot %d; marking them in %s",
                    report.redrive_id, report.counts.redriven, tables.archive, appended.snapshot_id,
                    tables.dead_letters,
                )  # fmt: skip
            counts = report.counts
            if counts.redriven or counts.already_archived or counts.reason_changed:
                with progress.phase(f"marking dead letters in {tables.dead_letters}"):
                    marked = mark(
                        tables, marks(classified, report.redrive_id, redriven_at), lower, upper, properties
                    )
                report.marking_snapshot = marked.snapshot_id
        finally:
            classified.unpersist()
    report.seconds = time.monotonic() - started
    return report


def _instant(micros: int) -> str:
    return datetime.fromtimestamp(micros / 1e6, UTC).isoformat(timespec="seconds")


def _add_redrive_columns(session: SparkSession, identifier: str) -> None:
    plan = plan_evolution(session.table(identifier).schema, DEAD_LETTER_TYPE)
    for column, data_type in plan.additions:
        session.sql(f"ALTER TABLE {identifier} ADD COLUMN {column} {ddl_type(data_type)}")
        log.info("table %s: added column %s %s", identifier, column, ddl_type(data_type))
