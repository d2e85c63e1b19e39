"""The order, completeness and alignment guarantees of backfill planning, over generated file layouts.

Pure logic, no Spark: archives are generated as files of row timestamps (overlapping files, files spanning
many epochs, skewed sources, empty hours, identical timestamps, compacted and uncompacted hours, loose
bounds), planned, and read the way every reader reads them: epoch after epoch, each epoch's rows in any
order (a random interleaving stands for parallel readers).
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bergstream.backfill.read.order import (
    BoundedOrder,
    Epoch,
    OrderingPolicy,
    StrictOrder,
    Unordered,
    Window,
    ordering,
    selected,
)
from bergstream.backfill.read.split import HOUR, Split

MINUTE = 60_000_000
DAY_START = 1_795_305_600_000_000  # 2026-11-22T00:00:00Z


@dataclass(frozen=True)
class Row:
    table: str
    file: str
    ts: int
    seq: int  # tells apart rows with identical timestamps


@dataclass(frozen=True)
class Archive:
    rows: dict[str, list[Row]]  # per file path
    splits: list[Split]


@st.composite
def archives(draw: st.DrawFn, exact_bounds: bool = False) -> Archive:
    """1 to 3 tables, each a few hours of files: per-batch files, compacted hours, stragglers, gaps; with
    `exact_bounds`, every file's bounds from its statistics, none from its hour partition."""
    tables = draw(st.integers(1, 3))
    hours = draw(st.integers(1, 6))
    rows: dict[str, list[Row]] = {}
    splits: list[Split] = []
    seq = 0
    for t in range(tables):
        table = f"cat.archive.t{t}"
        # Skew: one table may have many times the rows of another.
        density = draw(st.sampled_from([1, 3, 10, 30]))
        for hour in range(hours):
            if draw(st.booleans()) and draw(st.booleans()):
                continue  # an empty hour
            compacted = draw(st.booleans())
            base = DAY_START + hour * HOUR
            files = 1 if compacted else draw(st.integers(1, 5))
            for f in range(files):
                count = draw(st.integers(1, density * 4))
                if compacted:
                    offsets = draw(st.lists(st.integers(0, HOUR - 1), min_size=count, max_size=count))
                else:
                    # A micro-batch file covers a short stretch, sometimes with late stragglers.
                    begin = draw(st.integers(0, HOUR - 1))
                    width = draw(st.sampled_from([1, MINUTE, 10 * MINUTE, HOUR]))
                    offsets = draw(
                        st.lists(
                            st.integers(begin, min(begin + width, HOUR - 1)), min_size=count, max_size=count
                        )
                    )
                if draw(st.booleans()):  # identical timestamps
                    offsets = offsets + offsets[: draw(st.integers(0, len(offsets)))]
                path = f"{table}/h{hour}/f{f}.parquet"
                file_rows = []
                for offset in offsets:
                    file_rows.append(Row(table, path, base + offset, seq))
                    seq += 1
                rows[path] = file_rows
                low, high = min(r.ts for r in file_rows), max(r.ts for r in file_rows)
                bounds = draw(
                    st.sampled_from(["manifest", "footer"] + ([] if exact_bounds else ["partition"]))
                )
                if bounds == "partition":  # no statistics: the whole hour
                    low, high = base, base + HOUR - 1
                splits.append(Split(table, path, low, high, len(file_rows), 100 * len(file_rows), bounds))
    return Archive(rows, splits)


@st.composite
def windows(draw: st.DrawFn) -> Window:
    """Edges anywhere: on hour boundaries, inside files, before and after the data."""
    start = DAY_START + draw(st.integers(-HOUR, 6 * HOUR))
    end = start + draw(st.integers(1, 8 * HOUR))
    return Window(start, end)


bounds = st.sampled_from([timedelta(seconds=90), timedelta(minutes=5),
                          timedelta(minutes=15), timedelta(minutes=7, seconds=3), timedelta(hours=1),
                          timedelta(hours=5)])  # fmt: skip


def read(archive: Archive, epochs: list[Epoch], window: Window, rng: random.Random) -> list[list[Row]]:
    """What readers emit, epoch by epoch: each split of an epoch filtered to it, in any order."""
    emitted = []
    for epoch in epochs:
        rows = [
            row
            for split in epoch.splits
            for row in archive.rows[split.path]
            if selected(row.ts, epoch, window)
        ]
        rng.shuffle(rows)
        emitted.append(rows)
    return emitted


def misalignment(order: list[Row]) -> int:
    """The largest (largest ingestion time emitted before r) - (ingestion time of r) over all rows r."""
    worst, newest = 0, None
    for row in order:
        if newest is not None:
            worst = max(worst, newest - row.ts)
        newest = row.ts if newest is None else max(newest, row.ts)
    return worst


def expected(archive: Archive, window: Window) -> Counter[Row]:
    return Counter(row for rows in archive.rows.values() for row in rows if row.ts in window)


def check_complete(emitted: list[list[Row]], archive: Archive, window: Window) -> None:
    got = Counter(row for batch in emitted for row in batch)
    assert all(n == 1 for n in got.values()), "a row was emitted twice"
    assert got == expected(archive, window), "the rows of the window, each once, and nothing else"


PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(archives(), windows(), bounds, st.randoms(use_true_random=False))
def test_bounded_order_emits_each_row_of_the_window_once_within_the_bound(
    archive: Archive, window: Window, bound: timedelta, rng: random.Random
) -> None:
    policy = BoundedOrder(bound)
    epochs = policy.epochs(window, archive.splits)
    emitted = read(archive, epochs, window, rng)
    check_complete(emitted, archive, window)
    order = [row for batch in emitted for row in batch]
    assert misalignment(order) <= bound // timedelta(microseconds=1)
    for epoch in epochs:
        assert epoch.upper - epoch.lower <= bound // timedelta(microseconds=1)
        assert window.start <= epoch.lower < epoch.upper <= window.end
    assert all(a.upper <= b.lower for a, b in itertools.pairwise(epochs)), "ascending, disjoint"
    assert [e.index for e in epochs] == list(range(len(epochs)))


@PROPERTY
@given(archives(), windows(), bounds, st.randoms(use_true_random=False))
def test_sources_advance_on_one_watermark(
    archive: Archive, window: Window, bound: timedelta, rng: random.Random
) -> None:
    """At every epoch boundary, no source has emitted a row more than B later than a row another source
    has yet to emit: a skewed source cannot run ahead of the others."""
    limit = bound // timedelta(microseconds=1)
    epochs = BoundedOrder(bound).epochs(window, archive.splits)
    emitted = read(archive, epochs, window, rng)
    pending = {row for rows in archive.rows.values() for row in rows if row.ts in window}
    newest: dict[str, int] = {}
    for epoch, batch in zip(epochs, emitted, strict=True):
        for row in batch:
            newest[row.table] = max(newest.get(row.table, row.ts), row.ts)
            pending.discard(row)
        # Every source's emitted rows end below the epoch's upper end; every pending row is at or above it.
        for table, ts in newest.items():
            assert ts < epoch.upper
            assert all(ts - row.ts <= limit for row in pending), f"{table} ran ahead of another source"
        assert all(row.ts >= epoch.upper for row in pending)


@PROPERTY
@given(archives(), windows(), st.randoms(use_true_random=False))
def test_strict_order_merges_each_epoch_into_exact_ingestion_order(
    archive: Archive, window: Window, rng: random.Random
) -> None:
    policy = StrictOrder()
    assert policy.single_reader
    epochs = policy.epochs(window, archive.splits)
    emitted = [sorted(batch, key=lambda row: row.ts) for batch in read(archive, epochs, window, rng)]
    check_complete(emitted, archive, window)
    assert misalignment([row for batch in emitted for row in batch]) == 0


@PROPERTY
@given(archives(), windows(), st.randoms(use_true_random=False))
def test_unordered_is_one_epoch_with_every_row_of_the_window(
    archive: Archive, window: Window, rng: random.Random
) -> None:
    epochs = Unordered().epochs(window, archive.splits)
    assert len(epochs) <= 1
    check_complete(read(archive, epochs, window, rng), archive, window)


@PROPERTY
@given(archives(), windows(), bounds)
def test_epochs_read_only_splits_that_reach_them_and_skip_empty_cells(
    archive: Archive, window: Window, bound: timedelta
) -> None:
    epochs = BoundedOrder(bound).epochs(window, archive.splits)
    for epoch in epochs:
        assert epoch.splits, "an epoch without splits is left out"
        assert all(split.overlaps(epoch.lower, epoch.upper) for split in epoch.splits)
    # A split is read in every epoch its bounds reach inside the window, never in another.
    for split in archive.splits:
        reached = [e for e in epochs if split in e.splits]
        cells = [e for e in epochs if split.overlaps(e.lower, e.upper)]
        assert reached == cells


def test_the_checker_catches_a_reader_that_reads_whole_files_early() -> None:
    """Reading each file whole as soon as it starts breaks the bound: the checks above can fail."""
    first = Split("t", "a", DAY_START, DAY_START + 2 * HOUR, 2, 1)
    second = Split("t", "b", DAY_START + 30 * MINUTE, DAY_START + 31 * MINUTE, 1, 1)
    rows = {
        "a": [Row("t", "a", DAY_START, 0), Row("t", "a", DAY_START + 2 * HOUR, 1)],
        "b": [Row("t", "b", DAY_START + 30 * MINUTE, 2)],
    }
    whole_files = rows["a"] + rows["b"]
    assert misalignment(whole_files) == 90 * MINUTE > 15 * MINUTE
    window = Window(DAY_START, DAY_START + 3 * HOUR)
    epochs = BoundedOrder(timedelta(minutes=15)).epochs(window, [first, second])
    emitted = read(Archive(rows, [first, second]), epochs, window, random.Random(0))
    assert misalignment([row for batch in emitted for row in batch]) <= 15 * MINUTE
    # By its bounds the long file may hold rows in every epoch of its two hours and at their end: it is
    # read, filtered to the epoch, in each of those 9 epochs.
    assert [sum(s is first for s in e.splits) for e in epochs] == [1] * 9


def test_a_bound_of_one_microsecond_orders_identical_timestamps_together() -> None:
    rows = {"a": [Row("t", "a", DAY_START + i // 3, i) for i in range(30)]}
    split = Split("t", "a", DAY_START, DAY_START + 9, 30, 1)
    window = Window(DAY_START + 2, DAY_START + 8)
    epochs = BoundedOrder(timedelta(microseconds=1)).epochs(window, [split])
    assert [e.lower - DAY_START for e in epochs] == [2, 3, 4, 5, 6, 7]
    emitted = read(Archive(rows, [split]), epochs, window, random.Random(1))
    check_complete(emitted, Archive(rows, [split]), window)
    assert all(len({row.ts for row in batch}) == 1 and len(batch) == 3 for batch in emitted)


def test_a_bound_too_small_for_the_window_is_refused() -> None:
    split = Split("t", "a", DAY_START, DAY_START + 24 * HOUR, 1, 1)
    with pytest.raises(ValueError, match="choose a larger bound"):
        BoundedOrder(timedelta(microseconds=10)).epochs(Window(DAY_START, DAY_START + 24 * HOUR), [split])


def test_epochs_line_up_with_round_times_and_are_clipped_to_the_window() -> None:
    split = Split("t", "a", DAY_START, DAY_START + HOUR - 1, 10, 1)
    window = Window(DAY_START + 7 * MINUTE, DAY_START + 50 * MINUTE)
    epochs = BoundedOrder(timedelta(minutes=15)).epochs(window, [split])
    assert [(e.lower - DAY_START) // MINUTE for e in epochs] == [7, 15, 30, 45]
    assert [(e.upper - DAY_START) // MINUTE for e in epochs] == [15, 30, 45, 50]


@pytest.mark.parametrize(
    ("bound", "strict", "expected_policy"),
    [(None, False, Unordered), (timedelta(minutes=15), False, BoundedOrder), (None, True, StrictOrder)],
)
def test_ordering_picks_the_policy(
    bound: timedelta | None, strict: bool, expected_policy: type[OrderingPolicy]
) -> None:
    assert type(ordering(bound, strict)) is expected_policy


@given(archives(exact_bounds=True))
@settings(max_examples=50, deadline=None)
def test_estimates_add_up_to_the_rows_of_the_window_when_bounds_are_exact(archive: Archive) -> None:
    epochs = Unordered().epochs(Window(DAY_START - HOUR, DAY_START + 10 * HOUR), archive.splits)
    total = sum(len(rows) for rows in archive.rows.values())
    assert sum(e.estimated_rows for e in epochs) == pytest.approx(total)
