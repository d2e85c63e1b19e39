"""What a redrive did, or would do in a dry run, as lines for the terminal and as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from bergstream.router.redrive.outcomes import RedriveCounts


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

    def to_json(self) -> dict[str, Any]:
        counts = self.counts
        return {
            "topic": self.topic,
            "redrive_id": self.redrive_id,
            "dry_run": self.dry_run,
            "reason_filter": self.reason_filter,
            "dead_letter_table": self.dead_letter_table,
            "archive_table": self.archive_table,
            "dead_letter_snapshot": self.dead_letter_snapshot,
            "examined": counts.examined,
            "redriven": counts.redriven,
            "already_archived": counts.already_archived,
            "still_failing": counts.examined - counts.redriven - counts.already_archived,
            "reason_changed": counts.reason_changed,
            "reasons": [asdict(reason) for reason in counts.reasons],
            "archive_snapshot": self.archive_snapshot,
            "marking_snapshot": self.marking_snapshot,
            "finished": [asdict(done) for done in self.finished],
            "seconds": self.seconds,
        }

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
