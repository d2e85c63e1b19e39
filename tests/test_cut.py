"""The cut of a bootstrap (`app run --from`), over generated topics and router histories, without Spark: every
record of the topic is read exactly once, from the archive if the pinned snapshot holds it and it is in the
window, else from Kafka; none twice, none lost.

A topic's partitions (some added while the router ran, some after it, some without an archived row) are read
by a router in micro-batches whose commits record their Kafka range in the snapshot summary
(`BatchRange.properties`), as the router writes it. Between them come commits that change no rows, batches of
dead letters alone that commit nothing to the archive, compactions without a position, and another cluster's
router. Kafka timestamps go backwards inside partitions, some hours away from their neighbours. The cut is
then made with bergstream's own functions: the newest router commit in the history (`newest_handover`), the
hand-over as the plan file carries it, the archive window (`archive_window`), the epochs and the readers'
filter (`selected`); Kafka is read from the hand-over offsets, a partition the hand-over lacks from its start.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from bergstream.backfill.read.handover import Handover, archive_window, newest_handover
from bergstream.backfill.read.order import BoundedOrder, selected
from bergstream.backfill.read.split import HOUR, Split
from bergstream.schemas.batch_range import BatchRange, Origin

TABLE = "bergstream.archive.plays"
TOPIC = "plays"
CLUSTER = "us-east-1"
OTHER_CLUSTER = "eu-west-1"
MINUTE = 60_000_000
DAY_START = 1_795_305_600_000_000  # 2026-11-22T00:00:00Z


@dataclass(frozen=True)
class Record:
    cluster: str
    partition: int
    offset: int
    ts: int  # the Kafka timestamp, in microseconds
    dead: bool  # the router dead-letters it, and a live parse leaves it out


@dataclass(frozen=True)
class File:
    path: str
    rows: tuple[Record, ...]

    @property
    def split(self) -> Split:
        times = [row.ts for row in self.rows]
        return Split(TABLE, self.path, min(times), max(times), len(self.rows), 100 * len(self.rows))


@dataclass(frozen=True)
class Snapshot:
    snapshot_id: int
    summary: dict[str, str]
    files: tuple[File, ...]  # the table's data files at this snapshot


@dataclass(frozen=True)
class World:
    kafka: dict[int, list[Record]]  # the topic in the cluster bootstrapped from, by partition: offset = index
    history: list[Snapshot]  # the archive table's current history, oldest first
    start: int  # --from
    bound: timedelta


class _Table:
    """The archive table as its commits make it: files appended, an hour's files compacted into one."""

    def __init__(self) -> None:
        self.files: tuple[File, ...] = ()
        self.history: list[Snapshot] = []

    def commit(self, summary: dict[str, str], files: tuple[File, ...]) -> None:
        self.files = files
        self.history.append(Snapshot(len(self.history) + 1, summary, files))

    def append(self, rows: list[Record], summary: dict[str, str]) -> None:
        """One file per hour of the rows, as the router's writer partitions them."""
        by_hour: dict[int, list[Record]] = {}
        for row in rows:
            by_hour.setdefault(row.ts // HOUR, []).append(row)
        added = tuple(
            File(f"s{len(self.history) + 1}/h{hour}.parquet", tuple(hour_rows))
            for hour, hour_rows in sorted(by_hour.items())
        )
        self.commit(summary, self.files + added)

    def compact(self, hour: int) -> None:
        """Every file of one hour rewritten as one, whichever cluster its rows came from: no position."""
        merged = [f for f in self.files if all(row.ts // HOUR == hour for row in f.rows)]
        if len(merged) < 2:
            return
        kept = tuple(f for f in self.files if f not in merged)
        rows = tuple(row for f in merged for row in f.rows)
        summary = {"operation": "replace"}
        self.commit(summary, (*kept, File(f"s{len(self.history) + 1}/compacted-h{hour}.parquet", rows)))


@st.composite
def worlds(draw: st.DrawFn) -> World:
    kafka: dict[int, list[Record]] = {p: [] for p in range(draw(st.integers(1, 3)))}
    table = _Table()
    clock = DAY_START

    def stamp() -> int:
        """Around the clock, often minutes back, sometimes hours away from the neighbours."""
        kind = draw(st.sampled_from(["now", "back", "back", "far"]))
        if kind == "now":
            return clock
        if kind == "back":
            return clock - draw(st.integers(0, 20 * MINUTE))
        return clock + draw(st.sampled_from([-1, 1])) * draw(st.integers(1, 5)) * HOUR

    def send(partition: int, count: int, dead: float) -> None:
        for _ in range(count):
            is_dead = dead == 1.0 or (dead > 0 and draw(st.floats(0, 1)) < dead)
            kafka[partition].append(Record(CLUSTER, partition, len(kafka[partition]), stamp(), is_dead))

    position: dict[int, int] | str = "earliest"
    other_position = 0  # another cluster's router, on a topic of the same name there
    for _ in range(draw(st.integers(1, 6))):
        clock += draw(st.integers(1, 40)) * MINUTE
        if draw(st.integers(0, 5)) == 0:  # a partition added while the router runs
            kafka[len(kafka)] = []
        dead = draw(st.sampled_from([0.0, 0.2, 1.0]))
        for partition in kafka:
            send(partition, draw(st.integers(0, 4)), dead)
        # The router's micro-batch: up to some point of every partition, the range recorded with its commit.
        begin = {p: position.get(p, 0) if isinstance(position, dict) else 0 for p in kafka}
        end = {p: draw(st.integers(begin[p], len(records))) for p, records in kafka.items()}
        rows = [r for p in kafka for r in kafka[p][begin[p] : end[p]] if not r.dead]
        summary = {"operation": "append", **BatchRange(position, end).properties(Origin(TOPIC, CLUSTER))}
        if rows:
            table.append(rows, summary)
        elif draw(st.booleans()):
            table.commit(summary, table.files)  # a commit that changed no rows
        # else: a batch of dead letters alone, or of nothing, commits nothing to the archive table
        position = end
        if draw(st.integers(0, 3)) == 0:
            count = draw(st.integers(1, 3))
            others = [Record(OTHER_CLUSTER, 0, other_position + i, stamp(), False) for i in range(count)]
            recorded = BatchRange({0: other_position}, {0: other_position + count})
            table.append(others, recorded.properties(Origin(TOPIC, OTHER_CLUSTER)))
            other_position += count
        hours = sorted({row.ts // HOUR for f in table.files for row in f.rows})
        if hours and draw(st.integers(0, 3)) == 0:
            table.compact(draw(st.sampled_from(hours)))
    # Kafka goes on after the archive, and partitions are added that the router never saw.
    for _ in range(draw(st.integers(0, 2))):
        kafka[len(kafka)] = []
    clock += draw(st.integers(1, 40)) * MINUTE
    for partition in kafka:
        send(partition, draw(st.integers(0, 4)), 0.1)
    times = [r.ts for records in kafka.values() for r in records] or [clock]
    start = draw(st.sampled_from([min(times), DAY_START])) + draw(st.sampled_from([0, 0, 1, 7 * MINUTE]))
    bound = draw(
        st.sampled_from([timedelta(minutes=15), timedelta(minutes=7, seconds=3), timedelta(hours=1)])
    )
    return World(kafka, table.history, start, bound)


def cut(world: World) -> tuple[Counter[tuple[int, int]], Counter[tuple[int, int]], Handover] | None:
    """What a bootstrap of `world` reads from the archive and from Kafka, by (partition, offset); None when
    the history holds no router commit of the cluster (a bootstrap is then refused)."""
    history = [(snapshot.snapshot_id, snapshot.summary) for snapshot in reversed(world.history)]
    pinned = newest_handover(history, TABLE, TOPIC, CLUSTER)
    if pinned is None:
        return None
    handover = Handover.from_json(TABLE, json.loads(json.dumps(pinned.to_json())))  # as the plan file has it
    snapshot = next(s for s in world.history if s.snapshot_id == handover.snapshot_id)
    files = {f.path: f for f in snapshot.files}
    # Iceberg's planning leaves out the files wholly before the window.
    splits = [f.split for f in snapshot.files if f.split.upper >= world.start]
    window = archive_window(world.start, splits)
    archive: Counter[tuple[int, int]] = Counter()
    for epoch in BoundedOrder(world.bound).epochs(window, splits):
        for split in epoch.splits:
            for row in files[split.path].rows:
                # The readers' filter, and the hand-over's cluster alone (the plan's regions).
                if selected(row.ts, epoch, window) and row.cluster == handover.cluster:
                    archive[(row.partition, row.offset)] += 1
    kafka: Counter[tuple[int, int]] = Counter()
    for partition, records in world.kafka.items():
        for record in records[handover.offsets.get(partition, 0) :]:
            if not record.dead:  # parsed as the router parses: what it would dead-letter is left out
                kafka[(partition, record.offset)] += 1
    return archive, kafka, handover


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_every_record_is_read_once_from_the_archive_or_from_kafka(world: World) -> None:
    made = cut(world)
    if made is None:
        assert not any(s.summary.get("bergstream.kafka.cluster") == CLUSTER for s in world.history)
        return
    archive, kafka, handover = made
    assert not set(archive) & set(kafka), "read from both"
    assert max([*archive.values(), *kafka.values()], default=1) == 1, "read twice"
    for partition, records in world.kafka.items():
        archived_below = handover.offsets.get(partition, 0)
        for record in records:
            key = (partition, record.offset)
            if record.dead:
                assert key not in archive and key not in kafka
            elif record.offset < archived_below:
                assert (key in archive) == (record.ts >= world.start), (key, record.ts, world.start)
                assert key not in kafka
            else:
                assert key in kafka, key
    assert set(archive) | set(kafka) <= {(p, r.offset) for p, rs in world.kafka.items() for r in rs}
