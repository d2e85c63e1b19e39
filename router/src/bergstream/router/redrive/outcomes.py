"""What became of the dead letters a redrive examined, by reason: as a table for the terminal and as the
snapshot properties of the redrive's commits."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from bergstream.router.redrive.snapshots import PROPERTY_PREFIX

REASONS_PROPERTY = f"{PROPERTY_PREFIX}reasons"
# The reasons kept in the snapshot summary, largest first; the others are summed into one entry.
MAX_REASONS = 20
MAX_REASON_CHARS = 200

# What became of an examined dead letter.
REDRIVEN = "redriven"
ALREADY_ARCHIVED = "already archived"
STILL_FAILING = "still failing"
OUTCOMES = (REDRIVEN, ALREADY_ARCHIVED, STILL_FAILING)


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
