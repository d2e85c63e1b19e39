"""The `maintenance:` block of a topic's settings: how `bergstream router maintain` treats the topic's tables
(compaction, snapshot expiry, orphan files), and how often the router runs it itself."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bergstream.errors import ConfigError
from bergstream.timeparse import format_duration, parse_duration

MIN_MAINTENANCE_INTERVAL = timedelta(seconds=1)
DEFAULT_MAINTENANCE_INTERVAL = "1h"
# What turns maintenance inside the router off.
NEVER = frozenset({"never", "off", "none", "no"})
DEFAULT_SNAPSHOT_RETENTION_HOURS = 72.0
# A retention that keeps more snapshots than this makes every commit rewrite a long list: metadata.json
# holds about 1 KB per retained snapshot, written whole by every commit (bench/commits).
MANY_SNAPSHOTS = 10_000


def duration_at_least(text: str, what: str, least: timedelta, examples: str, otherwise: str) -> str:
    """`text` when it is a duration of at least `least`; else the ValueError a settings field gives, with
    `examples` of one and what else the field takes (`otherwise`)."""
    try:
        span = parse_duration(text, what)
    except ConfigError as error:
        raise ValueError(f"{error}; {otherwise}") from error
    if span < least:
        least_text = format_duration(least)
        raise ValueError(f"{text!r}: give a duration of at least {least_text}, {examples}; {otherwise}")
    return text


class MaintenanceSettings(BaseModel):
    """How `bergstream router maintain` treats the topic's tables, and how often the router runs it itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # An hour is compacted once it ended this long ago: later records of it are rare by then.
    compaction_grace_minutes: int = Field(default=15, ge=0)
    # Snapshots younger than this are kept for time travel. Every commit rewrites the list of retained
    # snapshots, so unset it is 72 hours, or less where the trigger would commit more than MANY_SNAPSHOTS
    # snapshots in 72 hours (RouterConfig.snapshot_retention_hours).
    snapshot_retention_hours: float | None = Field(default=None, gt=0)
    retain_last_snapshots: int = Field(default=100, gt=0)
    # Files younger than this are never orphans: a batch may have written them and not committed yet.
    orphan_retention_hours: int = Field(default=72, ge=1)
    # `router run` maintains the tables itself this often (`1h`, `30m`), so that snapshots, manifests and
    # small files stay bounded without another job; `never` (or null) leaves it to `router maintain`.
    every: str | None = DEFAULT_MAINTENANCE_INTERVAL

    @field_validator("every", mode="before")
    @classmethod
    def _every(cls, every: object) -> str | None:
        # YAML reads a bare `off` or `no` as false.
        if every is None or every is False or (isinstance(every, str) and every.strip().lower() in NEVER):
            return None
        if not isinstance(every, str):
            raise ValueError(f"{every!r}: give a duration such as 1h or 30m, or never")
        return duration_at_least(
            every, "maintenance every", MIN_MAINTENANCE_INTERVAL, "such as 1h or 30m",
            "or never, to leave maintenance to `router maintain`",
        )  # fmt: skip

    @property
    def every_seconds(self) -> float | None:
        return None if self.every is None else parse_duration(self.every).total_seconds()
