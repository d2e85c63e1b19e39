"""The two tables of a redrive and the snapshots redrives committed to them, found by their properties."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from bergstream.errors import BergstreamError
from bergstream.router.config import RouterConfig
from bergstream.schemas.archive import ArchiveLayout

PROPERTY_PREFIX = "bergstream.redrive."
ID_PROPERTY = f"{PROPERTY_PREFIX}id"
DEAD_LETTER_SNAPSHOT_PROPERTY = f"{PROPERTY_PREFIX}dead-letter-snapshot-id"
ARCHIVE_SNAPSHOT_PROPERTY = f"{PROPERTY_PREFIX}archive-snapshot-id"
REASON_FILTER_PROPERTY = f"{PROPERTY_PREFIX}reason-filter"
FINISHED_LATER_PROPERTY = f"{PROPERTY_PREFIX}finished-after-interruption"


class RedriveError(BergstreamError):
    """A redrive cannot start or finish; the message names the table."""


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


class RedriveTables:
    """The archive table of a topic and its dead-letter table, in one Spark session."""

    def __init__(self, session: SparkSession, config: RouterConfig, layout: ArchiveLayout) -> None:
        self.session = session
        self.archive = config.query.catalog.table_identifier(layout.table)
        self.dead_letters = config.query.catalog.table_identifier(layout.dead_letter_table)
        for identifier in (self.archive, self.dead_letters):
            if not session.catalog.tableExists(identifier):
                raise RedriveError(
                    f"topic {config.settings.topic}: table {identifier} does not exist; "
                    f"`bergstream router run --topic {config.settings.topic}` creates it"
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
