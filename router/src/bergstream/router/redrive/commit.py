"""The two commits of a redrive, the archive append and the dead-letter MERGE, and the MERGE that finishes
a redrive interrupted between them."""

from __future__ import annotations

import logging
import time
import uuid

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from bergstream.router.redrive.classify import KEY_COLUMNS, archive_keys, kafka_records, pending
from bergstream.router.redrive.report import FinishedRedrive
from bergstream.router.redrive.snapshots import (
    ARCHIVE_SNAPSHOT_PROPERTY,
    FINISHED_LATER_PROPERTY,
    ID_PROPERTY,
    PROPERTY_PREFIX,
    RedriveError,
    RedriveSnapshot,
    RedriveTables,
)
from bergstream.router.retry import java_causes
from bergstream.schemas.archive import INGESTION_TS, METADATA, REDRIVE_ID, REDRIVEN_AT

log = logging.getLogger("bergstream.router.redrive")

_SESSION_SNAPSHOT_PROPERTY = "spark.sql.iceberg.snapshot-property."
# A MERGE loses to a concurrent commit into the same files (the router appending dead letters of the
# same hour, maintenance compacting them): it is tried again on the new snapshot.
_CONFLICTS = (
    "org.apache.iceberg.exceptions.ValidationException",
    "org.apache.iceberg.exceptions.CommitFailedException",
)
_MERGE_ATTEMPTS = 5


def append(tables: RedriveTables, rows: DataFrame, properties: dict[str, str]) -> RedriveSnapshot:
    """Append archive `rows` in one commit that carries `properties`."""
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


def mark(
    tables: RedriveTables, marks: DataFrame, lower: int, upper: int, properties: dict[str, str]
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


def finish(tables: RedriveTables, interrupted: RedriveSnapshot, dry_run: bool) -> FinishedRedrive:
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
    keys = added.select(*archive_keys(F.col(METADATA)))
    current = tables.current_snapshot(tables.dead_letters)
    if current is None:
        raise RedriveError(
            f"table {tables.dead_letters} has no snapshot, yet redrive {interrupted.redrive_id} read from it"
        )
    waiting = kafka_records(pending(tables, current, None))
    marks = (
        waiting.select(*KEY_COLUMNS)
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
    marked = mark(tables, marks, lower, upper, properties)
    log.info(
        "redrive %s, interrupted after its archive commit, finished: %d rows marked in %s",
        interrupted.redrive_id, rows, tables.dead_letters,
    )  # fmt: skip
    return FinishedRedrive(interrupted.redrive_id, snapshot, rows, marked.snapshot_id)
