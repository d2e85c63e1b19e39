"""What a unit of backfill work is: one data file of an archive table, with its ingestion-time bounds.

Times are integers of microseconds since the Unix epoch, as Iceberg stores `timestamptz` values; they
become `datetime`s only at the edges (the command line, JSON, progress).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Micros = int
HOUR: Micros = 3_600_000_000

# Where a split's bounds came from, best first: the manifest's column statistics (the router's writer
# records them), the Parquet footer's statistics, or the hour partition the file belongs to.
BoundsSource = Literal["manifest", "footer", "partition"]

# A Parquet row group of a file: the byte offset by which Iceberg's Parquet reader gives it to a split (the
# split whose byte range holds its midpoint), and its inclusive ingestion-time bounds.
RowGroup = tuple[int, "Micros", "Micros"]


@dataclass(frozen=True, order=True)
class Split:
    """One data file to read, and the inclusive range of ingestion times its rows may have."""

    table: str  # catalog.namespace.table
    path: str
    lower: Micros
    upper: Micros
    records: int
    size_bytes: int
    bounds_from: BoundsSource = "manifest"
    # Of a file with several row groups, each group's bounds: an epoch's reader skips the groups outside it.
    row_groups: tuple[RowGroup, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.upper < self.lower:
            raise ValueError(f"{self.path}: upper bound {self.upper} is below lower bound {self.lower}")

    def overlaps(self, lower: Micros, upper: Micros) -> bool:
        """Whether the split may hold rows in the half-open range [lower, upper)."""
        return self.lower < upper and self.upper >= lower

    def share(self, lower: Micros, upper: Micros) -> float:
        """The fraction of the split's rows expected in [lower, upper), as if they were spread evenly."""
        if not self.overlaps(lower, upper):
            return 0.0
        span = self.upper - self.lower + 1
        inside = min(self.upper + 1, upper) - max(self.lower, lower)
        return inside / span
