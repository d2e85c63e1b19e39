"""A correction's record, kept in its output table's properties under `bergstream.correction.<branch>`: the
window it replaces, the snapshot of main its branch was made from, the run that writes the branch and what
its rows depend on (identity.py), and how far it got (cleared, complete to which watermark, published,
unpublished). Every command reads it first; each step that changes it commits the change with the step."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

from bergstream.runtime.correct.identity import Identity
from bergstream.timeparse import format_instant

PROPERTY_PREFIX = "bergstream.correction."
# Snapshot summary keys of a correction's commits: on the branch, each micro-batch's; on main, the publish's.
QUERY_ID = "bergstream.correction.query-id"
BATCH_ID = "bergstream.correction.batch-id"
PUBLISH_ID = "bergstream.correction.publish-id"
UNPUBLISH_ID = "bergstream.correction.unpublish-id"
BRANCH = "bergstream.correction.branch"
_INSTANTS = ("start", "end", "watermark", "edge_start", "edge_end")


def property_name(branch: str) -> str:
    return f"{PROPERTY_PREFIX}{branch}"


@dataclass(frozen=True)
class Correction:
    """What a branch corrects, and how far its correction went."""

    app: str
    branch: str
    time_column: str
    key: tuple[str, ...]
    start: datetime
    end: datetime
    # Main's snapshot the branch was made from.
    base: int
    # Main's rows of the window are removed from the branch: the backfill's rows may be written.
    cleared: bool = False
    # The backfill covered its whole read window: its rows of the window are complete.
    complete: bool = False
    # The application's event-time watermark that the backfill's last committed micro-batch ran with, read
    # from its checkpoint: a row is written once it passes the row's end, so rows of the window that end
    # after it were not. None: not known (the run has not completed, or the application has none).
    watermark: datetime | None = None
    # Whether the application sets an event-time watermark; without one, each row is written by the batch
    # that reads its events. Unknown (an earlier bergstream's record) counts as set.
    watermarked: bool = True
    # What the branch's rows depend on and the run that writes them; None in an earlier bergstream's record.
    identity: Identity | None = None
    # The time column is a timestamp with a zone (timestamptz); without one (timestamp), its values are the
    # window's instants as UTC wall-clock times, whatever the session's time zone.
    time_zoned: bool = True
    # The keys of the window the branch held more than once when its run completed, and the branch's head
    # then: a publish looks at main for them only, and checks the branch again only if it changed since.
    repeated_keys: int | None = None
    checked_head: int | None = None
    # Where a row's span ends: a row covers [time_column, end_column). None in an earlier bergstream's record.
    end_column: str | None = None
    # The window widened, per group of rows (the key less the time column), to whole spans of the rows that
    # cross its start or end, on either side (edges.py): what a publish replaces. Recorded with `complete`;
    # `edge_refusal` says why a publish cannot replace whole spans (a span beyond the rows read).
    edge_start: datetime | None = None
    edge_end: datetime | None = None
    edge_groups: int = 0
    edge_refusal: str | None = None
    # The last publish: its id (in its snapshot's summary on main) and the tag on main's snapshot before it.
    publish_id: str | None = None
    tag: str | None = None
    # The unpublish of that publish, once run: its id, in its snapshot's summary on main.
    unpublish_id: str | None = None

    @property
    def published(self) -> bool:
        return self.publish_id is not None and self.unpublish_id is None

    @property
    def window(self) -> str:
        return f"[{format_instant(self.start)}, {format_instant(self.end)})"

    @property
    def replaced(self) -> tuple[datetime, datetime]:
        """The times of the rows a publish replaces: the window, widened to the spans that cross its edges."""
        return (self.edge_start or self.start, self.edge_end or self.end)

    @property
    def replaced_window(self) -> str:
        start, end = self.replaced
        return f"[{format_instant(start)}, {format_instant(end)})"

    def window_sql(self, column_prefix: str = "") -> str:
        """The SQL condition of a row in the window, by its time column (half-open)."""
        return self.range_sql(self.start, self.end, column_prefix)

    def replaced_sql(self, column_prefix: str = "") -> str:
        """The SQL condition of a row in the widened window (some of whose rows a publish replaces)."""
        return self.range_sql(*self.replaced, column_prefix)

    def range_sql(self, start: datetime, end: datetime, column_prefix: str = "") -> str:
        column = f"{column_prefix}`{self.time_column}`"
        return f"({column} >= {self.literal(start)} AND {column} < {self.literal(end)})"

    def literal(self, instant: datetime) -> str:
        """An instant as a SQL literal of the time column's type."""
        if self.time_zoned:
            return f"TIMESTAMP '{instant.isoformat()}'"
        return f"TIMESTAMP_NTZ '{instant.astimezone(UTC):%Y-%m-%d %H:%M:%S.%f}'"

    def micros_sql(self, column: str) -> str:
        """A column of the time column's type as microseconds since the epoch (UTC wall-clock for no zone)."""
        if self.time_zoned:
            return f"unix_micros({column})"
        return f"timestampdiff(MICROSECOND, TIMESTAMP_NTZ '1970-01-01 00:00:00', {column})"

    def dumps(self) -> str:
        document: dict[str, Any] = asdict(self)
        document["key"] = list(self.key)
        for name in _INSTANTS:
            value = getattr(self, name)
            document[name] = value.isoformat() if value is not None else None
        document["identity"] = self.identity.to_json() if self.identity is not None else None
        return json.dumps(document, sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> Correction:
        document = json.loads(text)
        document["key"] = tuple(document["key"])
        for name in _INSTANTS:
            if document.get(name) is not None:
                document[name] = datetime.fromisoformat(document[name]).astimezone(UTC)
        if document.get("identity") is not None:
            document["identity"] = Identity.from_json(document["identity"])
        return cls(**document)

    def but(self, **changes: Any) -> Correction:
        return replace(self, **changes)


def recorded(properties: dict[str, str], branch: str) -> Correction | None:
    """The correction of `branch` the output table's `properties` record, or None."""
    text = properties.get(property_name(branch))
    return Correction.loads(text) if text is not None else None
