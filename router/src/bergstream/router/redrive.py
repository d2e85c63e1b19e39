"""`bergstream router redrive`: dead letters that parse now go into the archive table, exactly once.

After a fix to a topic's schema or parser settings, the dead letters of the topic are parsed again by the
router's own parser (`RecordSplitter`). Those that parse now are appended to the archive table with their
original `__metadata__`, so that they land in the hour they were ingested in and a backfill finds them
there; `router_write_ts` says when the redrive wrote them. They are then marked in the dead-letter table
(`redriven_at`, `redrive_id`), and a redrive never examines a marked row again. Rows that still fail stay,
with the reason the parser gives now.

Two commits, each atomic, and the first is named in the second:
1. the archive append carries the redrive's id, the dead-letter snapshot it read and its counts as
   snapshot properties;
2. one MERGE into the dead-letter table marks the rows and updates the reasons, with the same properties.
A redrive killed between the two leaves an archive snapshot whose id no dead-letter snapshot carries: the
next redrive first marks the rows that snapshot added, without appending them again. Killed during either
commit, Iceberg has committed all of it or nothing. A pending dead letter whose record the archive already
holds (its marking lost with an expired snapshot) is marked and not appended. Redrives of one topic run one
at a time.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from bergstream.errors import BergstreamError
from bergstream.router.config import RouterConfig
from bergstream.router.evolve import evolve_table, plan_evolution
from bergstream.router.registry_topic import topic_parser
from bergstream.router.retry import java_causes
from bergstream.router.transform import RecordSplitter
from bergstream.schemas.archive import (
    DEAD_LETTER_TYPE,
    INGESTION_TS,
    METADATA,
    REDRIVE_ID,
    REDRIVEN_AT,
    ArchiveLayout,
)
from bergstream.schemas.spark_types import ddl_type

log = logging.getLogger("bergstream.router.redrive")

PROPERTY_PREFIX = "bergstream.redrive."
ID_PROPERTY = f"{PROPERTY_PREFIX}id"
DEAD_LETTER_SNAPSHOT_PROPERTY = f"{PROPERTY_PREFIX}dead-letter-snapshot-id"
ARCHIVE_SNAPSHOT_PROPERTY = f"{PROPERTY_PREFIX}archive-snapshot-id"
REASON_FILTER_PROPERTY = f"{PROPERTY_PREFIX}reason-filter"
FINISHED_LATER_PROPERTY = f"{PROPERTY_PREFIX}finished-after-interruption"
REASONS_PROPERTY = f"{PROPERTY_PREFIX}reasons"
# The reasons kept in the snapshot summary, largest first; the others are summed into one entry.
MAX_REASONS = 20
MAX_REASON_CHARS = 200

# What became of an examined dead letter.
REDRIVEN = "redriven"
ALREADY_ARCHIVED = "already archived"
STILL_FAILING = "still failing"
OUTCOMES = (REDRIVEN, ALREADY_ARCHIVED, STILL_FAILING)

# A dead letter and its archive row are the same Kafka record: these columns of the Kafka-shaped rows.
KEY_COLUMNS = ("topic", "partition", "offset", "timestamp")
_PREVIOUS_REASON = "_redrive_previous_reason"
_ORIGINAL_METADATA = "_redrive_metadata"
_IN_ARCHIVE = "_redrive_in_archive"
_OUTCOME = "_redrive_outcome"
_REASON = "_redrive_reason"
_SESSION_SNAPSHOT_PROPERTY = "spark.sql.iceberg.snapshot-property."
# A MERGE loses to a concurrent commit into the same files (the router appending dead letters of the
# same hour, maintenance compacting them): it is tried again on the new snapshot.
_CONFLICTS = (
    "org.apache.iceberg.exceptions.ValidationException",
    "org.apache.iceberg.exceptions.CommitFailedException",
)
_MERGE_ATTEMPTS = 5
# Up to this many dead letters, their keys are broadcast to find those the archive already holds.
_BROADCAST_KEYS = 1_000_000


class RedriveError(BergstreamError):
    """A redrive cannot start or finish; the message names the table."""


@dataclass(frozen=True)
class ReasonCounts:
    """The dead letters of one reason (as the dead-letter table gave it) and what became of them."""

    reason: str
    redriven: int = 0
    already_archived: int = 0
    still_failing: int = 0

    @property
    def examined(self) -> int:
        return self.redriven + self.already_archived + self.still_failing


@dataclass(frozen=True)
class RedriveCounts:
    reasons: tuple[ReasonCounts, ...] = ()
    # Of the rows still failing, those whose reason the parser now gives differently.
    reason_changed: int = 0

    @classmethod
    def tally(cls, rows: Iterable[tuple[str | None, str, bool, int]]) -> RedriveCounts:
        """From (previous reason, outcome, reason changed, rows) groups; reasons with most rows first."""
        by_reason: dict[str, dict[str, int]] = {}
        changed = 0
        for reason, outcome, reason_changed, count in rows:
            if outcome not in OUTCOMES:
                raise ValueError(f"unknown redrive outcome {outcome!r}")
            counts = by_reason.setdefault(reason or "", dict.fromkeys(OUTCOMES, 0))
            counts[outcome] += count
            if outcome == STILL_FAILING and reason_changed:
                changed += count
        reasons = [
            ReasonCounts(reason, c[REDRIVEN], c[ALREADY_ARCHIVED], c[STILL_FAILING])
            for reason, c in by_reason.items()
        ]
        reasons.sort(key=lambda r: (-r.examined, r.reason))
        return cls(tuple(reasons), changed)

    @property
    def examined(self) -> int:
        return sum(r.examined for r in self.reasons)

    @property
    def redriven(self) -> int:
        return sum(r.redriven for r in self.reasons)

    @property
    def already_archived(self) -> int:
        return sum(r.already_archived for r in self.reasons)

    @property
    def still_failing(self) -> int:
        return sum(r.still_failing for r in self.reasons)

    def top_reasons(self, limit: int = MAX_REASONS) -> list[ReasonCounts]:
        """The `limit` reasons with most rows, then the others summed into one."""
        kept = list(self.reasons[:limit])
        rest = self.reasons[limit:]
        if rest:
            kept.append(
                ReasonCounts(
                    f"({len(rest)} other reasons)",
                    sum(r.redriven for r in rest),
                    sum(r.already_archived for r in rest),
                    sum(r.still_failing for r in rest),
                )
            )
        return kept

    def properties(self) -> dict[str, str]:
        """The counts as snapshot properties: totals, and the reasons with most rows as JSON."""
        reasons = [
            {
                "reason": r.reason[:MAX_REASON_CHARS],
                "examined": r.examined,
                REDRIVEN: r.redriven,
                ALREADY_ARCHIVED: r.already_archived,
                STILL_FAILING: r.still_failing,
            }
            for r in self.top_reasons()
        ]
        return {
            f"{PROPERTY_PREFIX}examined": str(self.examined),
            f"{PROPERTY_PREFIX}redriven": str(self.redriven),
            f"{PROPERTY_PREFIX}already-archived": str(self.already_archived),
            f"{PROPERTY_PREFIX}still-failing": str(self.still_failing),
            f"{PROPERTY_PREFIX}reason-changed": str(self.reason_changed),
            REASONS_PROPERTY: json.dumps(reasons, separators=(",", ":")),
        }

    def table(self, width: int = 60) -> list[str]:
        """The counts by reason as text lines, with a total line."""
        header = ("reason", "examined", REDRIVEN, ALREADY_ARCHIVED, STILL_FAILING)
        rows = [
            (_shortened(r.reason, width), r.examined, r.redriven, r.already_archived, r.still_failing)
            for r in self.top_reasons()
        ]
        rows.append(("total", self.examined, self.redriven, self.already_archived, self.still_failing))
        first = max(len(header[0]), *(len(row[0]) for row in rows))
        widths = [max(len(header[i]), *(len(f"{row[i]:,}") for row in rows)) for i in range(1, 5)]

        def line(cells: tuple[str, ...]) -> str:
            numbers = "  ".join(f"{cell:>{w}}" for cell, w in zip(cells[1:], widths, strict=True))
            return f"  {cells[0]:<{first}}  {numbers}"

        return [line(header), *(line((row[0], *(f"{n:,}" for n in row[1:]))) for row in rows)]


def _shortened(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def new_redrive_id(now: datetime | None = None) -> str:
    """Sortable by time, unique: 20261122T101500Z-3f2a9c1b."""
    return f"{(now or datetime.now(UTC)).astimezone(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class RedriveSnapshot:
    """An archive or dead-letter snapshot that a redrive committed."""

    snapshot_id: int
    parent_id: int | None
    committed_micros: int
    summary: dict[str, str]

    @property
    def redrive_id(self) -> str:
        return self.summary[ID_PROPERTY]


def unfinished(archived: Iterable[RedriveSnapshot], marked: Iterable[str]) -> list[RedriveSnapshot]:
    """The redrives whose archive append committed and whose dead-letter marking did not, oldest first."""
    done = set(marked)
    return sorted((s for s in archived if s.redrive_id not in done), key=lambda s: s.committed_micros)


@dataclass(frozen=True)
class FinishedRedrive:
    """An interrupted redrive whose rows were marked by this one."""

    redrive_id: str
    archive_snapshot: int
    rows: int
    dead_letter_snapshot: int | None


@dataclass
class RedriveReport:
    topic: str
    redrive_id: str
    dead_letter_table: str
    archive_table: str
    dry_run: bool
    reason_filter: str | None
    dead_letter_snapshot: int | None = None
    counts: RedriveCounts = field(default_factory=RedriveCounts)
    finished: list[FinishedRedrive] = field(default_factory=list)
    archive_snapshot: int | None = None
    marking_snapshot: int | None = None
    seconds: float = 0.0

    def lines(self) -> list[str]:
        lines = []
        for done in self.finished:
            verb = "would mark" if self.dry_run else "marked"
            lines.append(
                f"redrive {done.redrive_id} was interrupted after its archive commit (snapshot "
                f"{done.archive_snapshot}): {verb} its {done.rows:,} rows in {self.dead_letter_table}"
                + (f" (snapshot {done.dead_letter_snapshot})" if done.dead_letter_snapshot else "")
            )
        scope = f", reason containing {self.reason_filter!r}" if self.reason_filter is not None else ""
        counts = self.counts
        if self.dead_letter_snapshot is None or not counts.examined:
            lines.append(f"{self.topic}: no dead letters waiting in {self.dead_letter_table}{scope}")
            return lines
        lines.append(
            f"redrive {self.redrive_id} of {self.topic}{' (dry run)' if self.dry_run else ''}: "
            f"{counts.examined:,} dead letters examined in {self.dead_letter_table} "
            f"(snapshot {self.dead_letter_snapshot}{scope}), {self.seconds:.1f}s"
        )
        lines += counts.table()
        changed = f", the reason of {counts.reason_changed:,} still failing changed"
        marks = counts.redriven + counts.already_archived
        if self.dry_run:
            lines.append(
                f"dry run, nothing written: would append {counts.redriven:,} rows to {self.archive_table} "
                f"and mark {marks:,} dead letters{changed if counts.reason_changed else ''}"
            )
            return lines
        if self.archive_snapshot is not None:
            lines.append(
                f"{self.archive_table}: appended {counts.redriven:,} rows (snapshot {self.archive_snapshot})"
            )
        if self.marking_snapshot is not None:
            lines.append(
                f"{self.dead_letter_table}: marked {marks:,} dead letters redriven"
                f"{changed if counts.reason_changed else ''} (snapshot {self.marking_snapshot})"
            )
        return lines


class _Tables:
    """The archive table of a topic and its dead-letter table, in one Spark session."""

    def __init__(self, session: SparkSession, config: RouterConfig, layout: ArchiveLayout) -> None:
        self.session = session
        self.archive = config.catalog.table_identifier(layout.table)
        self.dead_letters = config.catalog.table_identifier(layout.dead_letter_table)
        for identifier in (self.archive, self.dead_letters):
            if not session.catalog.tableExists(identifier):
                raise RedriveError(
                    f"topic {config.topic}: table {identifier} does not exist; "
                    f"`bergstream router run --topic {config.topic}` creates it"
                )

    def current_snapshot(self, identifier: str) -> int | None:
        row = self.session.sql(f"SELECT snapshot_id FROM {identifier}.refs WHERE name = 'main'").first()
        return int(row.snapshot_id) if row is not None else None

    def redrive_snapshots(self, identifier: str, redrive_id: str | None = None) -> list[RedriveSnapshot]:
        condition = f"summary['{ID_PROPERTY}'] IS NOT NULL"
        if redrive_id is not None:
            condition = f"summary['{ID_PROPERTY}'] = '{redrive_id}'"
        rows = self.session.sql(
            f"SELECT snapshot_id, parent_id, unix_micros(committed_at) AS committed, summary "
            f"FROM {identifier}.snapshots WHERE {condition}"
        ).collect()
        return [
            RedriveSnapshot(
                int(row.snapshot_id),
                int(row.parent_id) if row.parent_id is not None else None,
                int(row.committed),
                {str(k): str(v) for k, v in row.summary.items()},
            )
            for row in rows
        ]

    def snapshot_ids(self, identifier: str) -> set[int]:
        rows = self.session.sql(f"SELECT snapshot_id FROM {identifier}.snapshots").collect()
        return {int(row.snapshot_id) for row in rows}


def redrive(
    spark: SparkSession,
    config: RouterConfig,
    reason: str | None = None,
    dry_run: bool = False,
    show_progress: bool = False,
) -> RedriveReport:
    """Archive the dead letters of `config.topic` that parse now (those whose reason contains `reason`),
    exactly once, and mark them; with `dry_run`, only say what would happen."""
    started = time.monotonic()
    # A session of its own: the snapshot properties of the MERGE are set in its configuration, where no
    # other write of the caller's session (a router in the same driver) can pick them up.
    session = spark.newSession()
    layout, splitter, _ = topic_parser(config)
    tables = _Tables(session, config, layout)
    report = RedriveReport(
        topic=config.topic,
        redrive_id=new_redrive_id(),
        dead_letter_table=tables.dead_letters,
        archive_table=tables.archive,
        dry_run=dry_run,
        reason_filter=reason,
    )
    with _Progress(session, show_progress) as progress:
        if not dry_run:
            # The fixed schema may have new optional fields; an older dead-letter table lacks the marks.
            evolve_table(session, tables.archive, layout)
            _add_redrive_columns(session, tables.dead_letters)
        earlier = tables.redrive_snapshots(tables.archive)
        done = [s.redrive_id for s in tables.redrive_snapshots(tables.dead_letters)] if earlier else []
        for interrupted in unfinished(earlier, done):
            with progress.phase(f"finishing redrive {interrupted.redrive_id}"):
                report.finished.append(_finish(tables, interrupted, dry_run))
        report.dead_letter_snapshot = tables.current_snapshot(tables.dead_letters)
        if report.dead_letter_snapshot is None:
            return report
        with progress.phase("reading dead letters"):
            pending = _pending(tables, report.dead_letter_snapshot, reason)
            bounds = pending.agg(
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
            report.redrive_id, bounds.rows, config.topic, _instant(lower), _instant(upper),
        )  # fmt: skip
        classified = _classify(tables, splitter, pending, bounds.rows, lower, upper).persist()
        try:
            with progress.phase(f"parsing {bounds.rows:,} dead letters"):
                groups = (
                    classified.groupBy(
                        _PREVIOUS_REASON,
                        _OUTCOME,
                        F.coalesce(F.col(_REASON) != F.col(_PREVIOUS_REASON), F.lit(False)),
                    )
                    .count()
                    .collect()
                )
            report.counts = RedriveCounts.tally((row[0], row[1], bool(row[2]), int(row[3])) for row in groups)
            report.seconds = time.monotonic() - started
            if dry_run:
                return report
            properties = {
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
                    appended = _append(tables, splitter, classified, properties)
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
                marks = classified.where(
                    (F.col(_OUTCOME) != STILL_FAILING) | (F.col(_REASON) != F.col(_PREVIOUS_REASON))
                ).select(
                    *KEY_COLUMNS,
                    F.when(F.col(_OUTCOME) != STILL_FAILING, F.lit(report.redrive_id)).alias(REDRIVE_ID),
                    F.when(F.col(_OUTCOME) != STILL_FAILING, redriven_at).alias(REDRIVEN_AT),
                    F.col(_REASON).alias("reason"),
                )
                with progress.phase(f"marking dead letters in {tables.dead_letters}"):
                    marked = _mark(tables, marks, lower, upper, properties)
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


def _pending(tables: _Tables, snapshot: int, reason: str | None) -> DataFrame:
    """The dead letters of `snapshot` not redriven yet, whose reason contains `reason`."""
    rows = tables.session.sql(f"SELECT * FROM {tables.dead_letters} VERSION AS OF {snapshot}")
    # A snapshot taken before the table gained the marks reads with its own columns: nothing is marked.
    if REDRIVE_ID in rows.columns:
        rows = rows.where(F.col(REDRIVE_ID).isNull())
    if reason is not None:
        rows = rows.where(F.col("error").contains(reason))
    return rows


def _kafka_records(dead_letters: DataFrame) -> DataFrame:
    """Dead letters as the rows of Spark's Kafka source that they were read from, with their reason and
    their `__metadata__` alongside."""
    metadata = F.col(METADATA)
    return dead_letters.select(
        F.col("raw_key").alias("key"),
        F.col("raw_value").alias("value"),
        metadata["topic"].alias("topic"),
        metadata["partition"].alias("partition"),
        metadata["offset"].alias("offset"),
        metadata[INGESTION_TS].alias("timestamp"),
        F.when(metadata["timestamp_type"] == "LogAppendTime", 1).otherwise(0).alias("timestampType"),
        metadata["headers"].alias("headers"),
        F.col("error").alias(_PREVIOUS_REASON),
        metadata.alias(_ORIGINAL_METADATA),
    )


def _classify(
    tables: _Tables, splitter: RecordSplitter, pending: DataFrame, rows: int, lower: int, upper: int
) -> DataFrame:
    """The pending dead letters parsed as the router parses, with their outcome and their reason now.

    The Kafka source's columns rebuilt from a dead letter stamp the same `__metadata__` again; the router's
    write time is the redrive's, and the cluster and timestamp type stay those the dead letter has."""
    metadata = F.col(METADATA)
    original = F.col(_ORIGINAL_METADATA)
    stamped = splitter.stamp(_kafka_records(pending)).withColumn(
        METADATA,
        metadata.withField("cluster", original["cluster"]).withField(
            "timestamp_type", original["timestamp_type"]
        ),
    )
    # The archive's rows of the dead letters' hours are streamed past the dead letters' keys, which are
    # sent to every task while there are not too many: the archive is never shuffled.
    keys = stamped.select(*KEY_COLUMNS)
    ingested = metadata[INGESTION_TS]
    archived = (
        tables.session.table(tables.archive)
        .where(ingested.between(F.timestamp_micros(F.lit(lower)), F.timestamp_micros(F.lit(upper))))
        .select(*_keys(metadata))
        .join(F.broadcast(keys) if rows <= _BROADCAST_KEYS else keys, list(KEY_COLUMNS), "left_semi")
        .distinct()
        .withColumn(_IN_ARCHIVE, F.lit(True))
    )
    joined = stamped.join(archived, list(KEY_COLUMNS), "left")
    outcome = (
        F.when(F.col(_IN_ARCHIVE).isNotNull(), F.lit(ALREADY_ARCHIVED))
        .when(splitter.valid, F.lit(REDRIVEN))
        .otherwise(F.lit(STILL_FAILING))
    )
    return joined.withColumn(_OUTCOME, outcome).withColumn(
        _REASON, F.when(F.col(_OUTCOME) == STILL_FAILING, splitter.reason)
    )


def _keys(metadata: Column) -> list[Column]:
    """KEY_COLUMNS from an archive row's `__metadata__`."""
    return [
        metadata["topic"].alias("topic"),
        metadata["partition"].alias("partition"),
        metadata["offset"].alias("offset"),
        metadata[INGESTION_TS].alias("timestamp"),
    ]


def _append(
    tables: _Tables, splitter: RecordSplitter, classified: DataFrame, properties: dict[str, str]
) -> RedriveSnapshot:
    rows = (
        classified.where(F.col(_OUTCOME) == REDRIVEN)
        .dropDuplicates(list(KEY_COLUMNS))
        .select(*splitter.archive_columns)
    )
    writer = rows.writeTo(tables.archive)
    for key, value in properties.items():
        writer = writer.option(f"snapshot-property.{key}", value)
    writer.append()
    committed = tables.redrive_snapshots(tables.archive, properties[ID_PROPERTY])
    if not committed:
        raise RedriveError(
            f"redrive {properties[ID_PROPERTY]}: the append to {tables.archive} committed nothing"
        )
    return committed[0]


def _mark(
    tables: _Tables, marks: DataFrame, lower: int, upper: int, properties: dict[str, str]
) -> RedriveSnapshot:
    """One MERGE into the dead-letter table: `marks` (KEY_COLUMNS, redrive_id, redriven_at, reason) set the
    marks of the pending rows they name, or their reason. The commit carries `properties`."""
    session = tables.session
    view = f"bergstream_redrive_marks_{uuid.uuid4().hex}"
    # Computed here, once: Spark cannot plan a MERGE whose source still reads an Iceberg table.
    marks.dropDuplicates(list(KEY_COLUMNS)).localCheckpoint().createOrReplaceTempView(view)
    ingested = f"t.`{METADATA}`.`{INGESTION_TS}`"
    statement = f"""
        MERGE INTO {tables.dead_letters} t USING {view} s
        ON t.`{METADATA}`.`topic` = s.`topic` AND t.`{METADATA}`.`partition` = s.`partition`
            AND t.`{METADATA}`.`offset` = s.`offset` AND {ingested} = s.`timestamp`
            AND {ingested} BETWEEN timestamp_micros({lower}) AND timestamp_micros({upper})
            AND t.`{REDRIVE_ID}` IS NULL
        WHEN MATCHED AND s.`{REDRIVE_ID}` IS NOT NULL THEN
            UPDATE SET `{REDRIVE_ID}` = s.`{REDRIVE_ID}`, `{REDRIVEN_AT}` = s.`{REDRIVEN_AT}`
        WHEN MATCHED AND s.reason IS NOT NULL AND s.reason <> t.error THEN UPDATE SET error = s.reason
    """
    redrive_id = properties[ID_PROPERTY]
    for key, value in properties.items():
        session.conf.set(f"{_SESSION_SNAPSHOT_PROPERTY}{key}", value)
    try:
        for attempt in range(1, _MERGE_ATTEMPTS + 1):
            try:
                session.sql(statement)
                break
            except Exception as error:
                # A commit may land and still report an error: then it is not made again.
                if tables.redrive_snapshots(tables.dead_letters, redrive_id):
                    break
                conflict = [c.line for c in java_causes(error) if any(n in c.classes for n in _CONFLICTS)]
                if not conflict or attempt == _MERGE_ATTEMPTS:
                    raise
                log.warning(
                    "redrive %s: marking %s lost to a concurrent commit (%s); trying again (attempt %d)",
                    redrive_id, tables.dead_letters, conflict[0], attempt + 1,
                )  # fmt: skip
                time.sleep(attempt)
    finally:
        for key in properties:
            session.conf.unset(f"{_SESSION_SNAPSHOT_PROPERTY}{key}")
        session.catalog.dropTempView(view)
    committed = tables.redrive_snapshots(tables.dead_letters, redrive_id)
    if not committed:
        raise RedriveError(f"redrive {redrive_id}: the MERGE into {tables.dead_letters} committed nothing")
    return max(committed, key=lambda s: s.committed_micros)


def _finish(tables: _Tables, interrupted: RedriveSnapshot, dry_run: bool) -> FinishedRedrive:
    """Mark the rows that an interrupted redrive appended to the archive, as that redrive."""
    session = tables.session
    snapshot = interrupted.snapshot_id
    reader = session.read.format("iceberg")
    parent = interrupted.parent_id
    if parent is None:  # the table's first snapshot: it added every row
        added = reader.option("snapshot-id", str(snapshot)).load(tables.archive)
    elif parent in tables.snapshot_ids(tables.archive):
        added = (
            reader.option("start-snapshot-id", str(parent))
            .option("end-snapshot-id", str(snapshot))
            .load(tables.archive)
        )
    else:  # the parent expired: the snapshot's whole table, narrowed below to the pending dead letters
        added = reader.option("snapshot-id", str(snapshot)).load(tables.archive)
    keys = added.select(*_keys(F.col(METADATA)))
    current = tables.current_snapshot(tables.dead_letters)
    if current is None:
        raise RedriveError(
            f"table {tables.dead_letters} has no snapshot, yet redrive {interrupted.redrive_id} read from it"
        )
    pending = _kafka_records(_pending(tables, current, None))
    marks = (
        pending.select(*KEY_COLUMNS)
        .join(keys, list(KEY_COLUMNS), "left_semi")
        .select(
            *KEY_COLUMNS,
            F.lit(interrupted.redrive_id).alias(REDRIVE_ID),
            F.timestamp_micros(F.lit(interrupted.committed_micros)).alias(REDRIVEN_AT),
            F.lit(None).cast("string").alias("reason"),
        )
        .localCheckpoint()
    )
    bounds = marks.agg(
        F.count(F.lit(1)).alias("rows"),
        F.min(F.unix_micros("timestamp")).alias("lower"),
        F.max(F.unix_micros("timestamp")).alias("upper"),
    ).first()
    assert bounds is not None
    rows = int(bounds.rows)
    if dry_run:
        return FinishedRedrive(interrupted.redrive_id, snapshot, rows, None)
    properties = {
        **{k: v for k, v in interrupted.summary.items() if k.startswith(PROPERTY_PREFIX)},
        ARCHIVE_SNAPSHOT_PROPERTY: str(snapshot),
        FINISHED_LATER_PROPERTY: "true",
    }
    # With nothing left to mark, the MERGE still commits: its snapshot records the redrive as finished.
    lower, upper = (int(bounds.lower), int(bounds.upper)) if rows else (0, 0)
    marked = _mark(tables, marks, lower, upper, properties)
    log.info(
        "redrive %s, interrupted after its archive commit, finished: %d rows marked in %s",
        interrupted.redrive_id, rows, tables.dead_letters,
    )  # fmt: skip
    return FinishedRedrive(interrupted.redrive_id, snapshot, rows, marked.snapshot_id)


class _Progress:
    """What the redrive is doing and how far its Spark stages are: on the terminal, or every
    `log_every` seconds in the log when there is no terminal."""

    def __init__(self, session: SparkSession, show: bool, log_every: float = 10.0) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._tracker = session.sparkContext.statusTracker()
        self._show = show
        self._log_every = log_every
        self._bar = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            disable=not show,
            transient=False,
        )

    def __enter__(self) -> _Progress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.__exit__(*exc)

    def _status(self) -> str:
        total = done = 0
        for stage_id in self._tracker.getActiveStageIds():
            stage = self._tracker.getStageInfo(stage_id)
            if stage is not None:
                total += stage.numTasks
                done += stage.numCompletedTasks
        return f"tasks {done}/{total}" if total else ""

    @contextmanager
    def phase(self, description: str) -> Iterator[None]:
        task = self._bar.add_task(description, total=None, status="")
        stop = threading.Event()
        started = time.monotonic()

        def follow() -> None:
            last_log = started
            while not stop.wait(0.5):
                status = self._status()
                self._bar.update(task, status=status)
                if not self._show and time.monotonic() - last_log >= self._log_every:
                    log.info("%s: %.0fs, %s", description, time.monotonic() - started, status or "working")
                    last_log = time.monotonic()

        follower = threading.Thread(target=follow, name="bergstream-redrive-progress", daemon=True)
        follower.start()
        try:
            yield
        finally:
            stop.set()
            follower.join()
            self._bar.update(task, total=1, completed=1, status="done")
