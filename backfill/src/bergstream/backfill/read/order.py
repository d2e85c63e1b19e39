"""Ordering policies: which rows each epoch (one micro-batch) emits, and in what order epochs come.

The guarantee, for a bound B (`max_misalignment`): for every emitted record r,

    (largest ingestion time emitted before r) - (ingestion time of r) <= B

Epochs are half-open ranges of ingestion time, read one after another; every row of the window falls in
exactly one of them. An epoch is at most B wide, so every row emitted before or beside r lies below the
upper end of r's epoch, at most B above r. Inside an epoch, rows come in any order and in parallel.

The epochs of every table of one backfill come from one grid, so that several sources advance on one
ingestion watermark: when an epoch is done, every source has emitted exactly the rows below its upper end
and none above it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from bergstream.backfill.read.split import Micros, Split

MICROSECOND = timedelta(microseconds=1)
# More epochs than this means a bound far too small for the window: each epoch is a micro-batch.
MAX_EPOCHS = 1_000_000


@dataclass(frozen=True)
class Window:
    """The half-open range [start, end) of ingestion times a backfill covers."""

    start: Micros
    end: Micros

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"the window ends ({self.end}) at or before it starts ({self.start})")

    def __contains__(self, ts: Micros) -> bool:
        return self.start <= ts < self.end


@dataclass(frozen=True)
class Epoch:
    """One micro-batch: the rows of `splits` whose ingestion time is in [lower, upper)."""

    index: int
    lower: Micros
    upper: Micros
    splits: tuple[Split, ...] = field(repr=False)

    @property
    def estimated_rows(self) -> float:
        return sum(split.records * split.share(self.lower, self.upper) for split in self.splits)

    @property
    def estimated_bytes(self) -> float:
        return sum(split.size_bytes * split.share(self.lower, self.upper) for split in self.splits)

    def tables(self) -> set[str]:
        return {split.table for split in self.splits}


class OrderingPolicy(ABC):
    """How a window and its splits become epochs."""

    name: str
    # One reader merging an epoch's rows in ingestion-time order, instead of every split in parallel.
    single_reader: bool = False

    @abstractmethod
    def boundaries(self, window: Window, splits: Sequence[Split]) -> list[tuple[Micros, Micros]]:
        """The epochs' [lower, upper) ranges, ascending; together they cover every row of the window."""

    @property
    def bound(self) -> timedelta | None:
        """B: how much later than a row the rows emitted before it may be; None for no bound."""
        return None

    def epochs(self, window: Window, splits: Sequence[Split]) -> list[Epoch]:
        """The epochs that hold rows, each with the splits it reads; empty epochs are left out."""
        ranges = self.boundaries(window, splits)
        by_lower = sorted(splits, key=lambda split: split.lower)
        epochs: list[Epoch] = []
        active: list[Split] = []
        next_split = 0
        for lower, upper in ranges:
            # Splits are taken in order of their lower bound and dropped once they end below the epoch.
            while next_split < len(by_lower) and by_lower[next_split].lower < upper:
                active.append(by_lower[next_split])
                next_split += 1
            active = [split for split in active if split.upper >= lower]
            reading = tuple(split for split in active if split.overlaps(lower, upper))
            if reading:
                epochs.append(Epoch(len(epochs), lower, upper, reading))
        return epochs


class BoundedOrder(OrderingPolicy):
    """Epochs of width B on a grid of whole multiples of B since the Unix epoch, clipped to the window.

    A grid of round times (B = 15 minutes gives :00, :15, :30, :45) lines epochs up with the archive's
    hour partitions, so that a compacted hour is read by whole epochs."""

    name = "bounded"

    def __init__(self, max_misalignment: timedelta) -> None:
        if max_misalignment < MICROSECOND:
            raise ValueError(f"max_misalignment must be at least 1 microsecond, not {max_misalignment}")
        self.max_misalignment = max_misalignment
        self.width: Micros = max_misalignment // MICROSECOND

    @property
    def bound(self) -> timedelta:
        return self.max_misalignment

    def boundaries(self, window: Window, splits: Sequence[Split]) -> list[tuple[Micros, Micros]]:
        # Only the grid cells that some split may reach: a window of years over a sparse archive costs
        # as many epochs as there are cells with data, not as many as the window holds.
        runs: list[tuple[int, int]] = []  # first and last cell of each run of cells that splits reach
        clipped = sorted(
            (max(split.lower, window.start), min(split.upper, window.end - 1)) for split in splits
        )
        for low, high in clipped:
            if low > high:
                continue
            first, last = low // self.width, high // self.width
            if runs and first <= runs[-1][1] + 1:
                runs[-1] = (runs[-1][0], max(runs[-1][1], last))
            else:
                runs.append((first, last))
        count = sum(last - first + 1 for first, last in runs)
        if count > MAX_EPOCHS:
            raise ValueError(
                f"a bound of {self.max_misalignment} cuts this window into {count:,} epochs, over the "
                f"limit of {MAX_EPOCHS:,}: each epoch is a micro-batch; choose a larger bound"
            )
        return [
            (max(cell * self.width, window.start), min((cell + 1) * self.width, window.end))
            for first, last in runs
            for cell in range(first, last + 1)
        ]


class Unordered(OrderingPolicy):
    """The whole window as one epoch: the fastest read, with no order at all."""

    name = "unordered"

    def boundaries(self, window: Window, splits: Sequence[Split]) -> list[tuple[Micros, Micros]]:
        return [(window.start, window.end)]


# A strict epoch: one task sorts each table's rows of it in memory, so its width bounds that memory (about
# 1/12 of an hour's rows of the table), at a micro-batch per epoch.
STRICT_EPOCH = timedelta(minutes=5)


class StrictOrder(BoundedOrder):
    """Exact ingestion-time order: one reader sorts each epoch's rows by ingestion time (B = 0).

    The epoch width here only sizes the unit of work and the rows held to sort; the order is exact."""

    name = "strict"
    single_reader = True

    def __init__(self, epoch_width: timedelta = STRICT_EPOCH) -> None:
        super().__init__(epoch_width)

    @property
    def bound(self) -> timedelta:
        return timedelta(0)


def ordering(max_misalignment: timedelta | None, strict: bool = False) -> OrderingPolicy:
    """The policy for a bound: none reads unordered, a bound reads bounded, `strict` reads in exact order."""
    if strict:
        return StrictOrder()
    if max_misalignment is None:
        return Unordered()
    return BoundedOrder(max_misalignment)


def selected(ts: Micros, epoch: Epoch, window: Window) -> bool:
    """Whether a row with ingestion time `ts` belongs to `epoch` of `window`: the reader's one filter."""
    return epoch.lower <= ts < epoch.upper and ts in window
