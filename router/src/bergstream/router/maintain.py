"""`bergstream router maintain`: compact closed hours, expire old snapshots, remove orphan files.

Safe while the router runs: compaction rewrites only hours that closed a grace period ago, Iceberg retries
commits that lose a race with the router's appends, and orphan removal spares files younger than its
retention, which covers any file an in-flight batch has written but not committed yet.

Safe for the router's exactly-once too. A router that stops after committing a batch to the table and
before checkpointing it runs that batch again when it restarts, and skips it only if it finds the batch
among the table's snapshots (router/write.py). However long it stayed down, expiry never takes that
snapshot: before expiring, the newest snapshot the router appended is tagged (NEWEST_APPEND_TAG), and
Iceberg keeps tagged snapshots. Only the newest matters: batches run in order, and a query that appends
after another has replaced its checkpoint.

Expiry keeps, too, the snapshots that backfills hold with their own tags until they complete (a backfill
stopped days ago resumes on the snapshot it planned). Those older than the retention are reported, each
with the application and checkpoint of its backfill: one given up holds its snapshot until released.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from pyspark.sql import Row, SparkSession

from bergstream.router.config import RouterConfig
from bergstream.router.retry import Backoff, java_causes
from bergstream.router.write import QUERY_ID
from bergstream.schemas.archive import (
    BACKFILL_PROPERTY_PREFIX,
    BACKFILL_TAG_PREFIX,
    DEAD_LETTER_SUFFIX,
    INGESTION_TS_COLUMN,
)

log = logging.getLogger(__name__)
# Rewrites of the closed hours in one maintenance run, while some files are left by lost commits.
_COMPACTION_ATTEMPTS = 3
NEWEST_APPEND_TAG = "bergstream-router-newest-append"
# A maintenance commit made on metadata that the router's appends have since replaced fails; Iceberg's own
# retries (four, within a second or two) are not enough on a busy table on a busy machine, an append a
# second. Such a step is made again on fresh metadata, after a wait, a few times.
_LOST_RACE_ATTEMPTS = 8
_LOST_RACE_BACKOFF = Backoff(initial_backoff_seconds=0.5, max_backoff_seconds=8.0)
_COMMIT_FAILED = "org.apache.iceberg.exceptions.CommitFailedException"
T = TypeVar("T")


@dataclass(frozen=True)
class MaintenanceResult:
    table: str
    rewritten_files: int
    added_files: int
    rewritten_bytes: int
    expired_snapshots: int
    orphan_files: int
    seconds: float
    # Snapshots older than the retention that backfills still hold.
    held: tuple[BackfillPin, ...] = ()

    def summary(self) -> str:
        held = f", kept {len(self.held)} held by backfills" if self.held else ""
        return (
            f"{self.table}: compacted {self.rewritten_files} files into {self.added_files} "
            f"({self.rewritten_bytes / 1e6:.1f} MB), expired {self.expired_snapshots} snapshots{held}, "
            f"removed {self.orphan_files} orphan files in {self.seconds:.1f}s"
        )


@dataclass(frozen=True)
class BackfillPin:
    """A snapshot a backfill holds with its tag, and whose backfill it is (the table property of its id)."""

    tag: str
    snapshot_id: int
    committed_at: datetime
    app: str | None
    checkpoint: str | None

    def describe(self, table: str, now: datetime) -> str:
        age = (now - self.committed_at).total_seconds() / 3600
        owner = (
            f"the backfill of {self.app} at checkpoint {self.checkpoint}"
            if self.checkpoint
            else "a backfill whose checkpoint is not recorded"
        )
        release = (
            f"--checkpoint {self.checkpoint}" if self.checkpoint else f"(or ALTER TABLE {table} DROP TAG)"
        )
        return (
            f"{table}: snapshot {self.snapshot_id} ({age:.1f}h old) is held by {owner} (tag {self.tag}) "
            f"until it completes; if it was given up: bergstream backfill release {release}"
        )


def backfill_pins(spark: SparkSession, identifier: str) -> list[BackfillPin]:
    """The snapshots of `identifier` that backfills hold, oldest first."""
    tags = spark.sql(
        f"SELECT r.name, r.snapshot_id, unix_micros(s.committed_at) AS committed_us "
        f"FROM {identifier}.refs r JOIN {identifier}.snapshots s ON r.snapshot_id = s.snapshot_id "
        f"WHERE r.type = 'TAG' AND startswith(r.name, '{BACKFILL_TAG_PREFIX}')"
    ).collect()
    if not tags:
        return []
    properties = {row.key: row.value for row in spark.sql(f"SHOW TBLPROPERTIES {identifier}").collect()}
    pins = []
    for tag in tags:
        owner = properties.get(BACKFILL_PROPERTY_PREFIX + tag.name.removeprefix(BACKFILL_TAG_PREFIX))
        try:
            described = json.loads(owner) if owner else {}
        except ValueError:
            described = {}
        committed_at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(tag.committed_us))
        pins.append(BackfillPin(tag.name, int(tag.snapshot_id), committed_at, described.get("app"),
                                described.get("checkpoint")))  # fmt: skip
    return sorted(pins, key=lambda pin: pin.committed_at)


def closed_before(now: datetime, grace: timedelta) -> datetime:
    """Hours that ended at least `grace` ago are closed: the start of the hour `grace` before now."""
    boundary = now.astimezone(UTC) - grace
    return boundary.replace(minute=0, second=0, microsecond=0)


def maintain(
    spark: SparkSession, config: RouterConfig, now: datetime | None = None
) -> list[MaintenanceResult]:
    now = now or datetime.now(UTC)
    settings = config.settings.maintenance
    catalog = config.query.catalog
    closed = closed_before(now, timedelta(minutes=settings.compaction_grace_minutes))
    results = []
    for table in (config.settings.table, f"{config.settings.table}{DEAD_LETTER_SUFFIX}"):
        identifier = catalog.table_identifier(table)
        started = time.monotonic()
        compact = partial(_compact, spark, config, identifier, closed)
        compacted = until_committed(spark, identifier, "compaction", compact)
        until_committed(
            spark, identifier, "the newest append's tag", partial(keep_newest_append, spark, identifier)
        )
        older_than = now - timedelta(hours=config.snapshot_retention_hours)
        held = tuple(pin for pin in backfill_pins(spark, identifier) if pin.committed_at < older_than)
        for pin in held:
            log.warning(pin.describe(identifier, now))
        expire = (
            f"CALL {catalog.name}.system.expire_snapshots(table => '{identifier}', "
            f"older_than => TIMESTAMP '{older_than:%Y-%m-%d %H:%M:%S}+00:00', "
            f"retain_last => {settings.retain_last_snapshots})"
        )
        expired = until_committed(spark, identifier, "snapshot expiry", partial(_first_row, spark, expire))
        orphans_before = now - timedelta(hours=settings.orphan_retention_hours)
        # An object store is listed through the table's FileIO: Hadoop has no file system for s3://.
        prefix_listing = ", prefix_listing => true" if catalog.object_storage else ""
        orphans = spark.sql(
            f"CALL {catalog.name}.system.remove_orphan_files(table => '{identifier}', "
            f"older_than => TIMESTAMP '{orphans_before:%Y-%m-%d %H:%M:%S}+00:00'{prefix_listing})"
        ).count()
        result = MaintenanceResult(
            table=identifier,
            rewritten_files=int(compacted.rewritten_data_files_count) if compacted else 0,
            added_files=int(compacted.added_data_files_count) if compacted else 0,
            rewritten_bytes=int(compacted.rewritten_bytes_count) if compacted else 0,
            expired_snapshots=int(expired.deleted_manifest_lists_count) if expired else 0,
            orphan_files=orphans,
            seconds=time.monotonic() - started,
            held=held,
        )
        log.info(result.summary())
        results.append(result)
    return results


def until_committed(spark: SparkSession, identifier: str, what: str, step: Callable[[], T]) -> T:
    """`step`'s result; a step whose commit lost to another commit of `identifier` is made again on the
    table's fresh metadata, at most _LOST_RACE_ATTEMPTS times in all. Any other error is raised at once."""
    delays = _LOST_RACE_BACKOFF.delays()
    for attempt in range(1, _LOST_RACE_ATTEMPTS + 1):
        try:
            return step()
        except Exception as error:
            lost = any(_COMMIT_FAILED in cause.classes for cause in java_causes(error))
            if not lost or attempt == _LOST_RACE_ATTEMPTS:
                raise
            delay = next(delays)
            log.warning("%s: %s lost its commit to another (attempt %d of %d); again in %.1f s",
                        identifier, what, attempt, _LOST_RACE_ATTEMPTS, delay)  # fmt: skip
            time.sleep(delay)
            spark.sql(f"REFRESH TABLE {identifier}")
    raise AssertionError("unreachable")


def _first_row(spark: SparkSession, statement: str) -> Row | None:
    return spark.sql(statement).first()


def _compact(spark: SparkSession, config: RouterConfig, identifier: str, closed: datetime) -> Any:
    """Rewrite the closed hours' files into few; the groups whose commit lost to the router's appends (they
    failed their retries, and partial progress kept the others) are rewritten again, a few times at most."""
    statement = (
        f"CALL {config.query.catalog.name}.system.rewrite_data_files("
        f"table => '{identifier}', strategy => 'sort', "
        # The order bergstream's tables declare, said here for a table made without it (made by hand).
        f"sort_order => '{INGESTION_TS_COLUMN} ASC NULLS LAST', "
        f"where => '{INGESTION_TS_COLUMN} < TIMESTAMP \\'{closed:%Y-%m-%d %H:%M:%S}+00:00\\'', "
        f"options => map('target-file-size-bytes', '{config.settings.target_file_size_bytes}', "
        f"'min-input-files', '2', 'partial-progress.enabled', 'true'))"
    )
    compacted = spark.sql(statement).first()
    for _ in range(_COMPACTION_ATTEMPTS - 1):
        failed = int((compacted.asDict() if compacted else {}).get("failed_data_files_count") or 0)
        if not failed:
            break
        log.warning("%s: %d files were not compacted (their commit lost to concurrent appends); again",
                    identifier, failed)  # fmt: skip
        again = spark.sql(statement).first()
        if again is not None and compacted is not None:
            merged = compacted.asDict()
            for key in ("rewritten_data_files_count", "added_data_files_count", "rewritten_bytes_count"):
                merged[key] = int(merged.get(key) or 0) + int(again.asDict().get(key) or 0)
            merged["failed_data_files_count"] = again.asDict().get("failed_data_files_count")
            compacted = Row(**merged)
        else:
            compacted = again
    return compacted


def keep_newest_append(spark: SparkSession, identifier: str) -> None:
    """Tag the newest snapshot the router appended to `identifier`, so that expiry keeps it."""
    newest = spark.sql(
        f"SELECT snapshot_id FROM {identifier}.snapshots WHERE summary['{QUERY_ID}'] IS NOT NULL "
        "ORDER BY committed_at DESC, snapshot_id LIMIT 1"
    ).first()
    if newest is not None:
        spark.sql(
            f"ALTER TABLE {identifier} CREATE OR REPLACE TAG `{NEWEST_APPEND_TAG}` "
            f"AS OF VERSION {int(newest.snapshot_id)}"
        )
