"""Where an archive ends in Kafka: the snapshot summary properties each router commit writes, and their
reading, shared by the router (which writes them and resumes from them) and the backfill (which hands an
application over to Kafka at them).

A router commit records where its rows come from (`Origin`: the topic, the cluster it was read from, the
Kafka isolation level it was read with, and the topic's Kafka id where known), and the micro-batch's range as
Spark's offset log has it: the offset each partition started at (`bergstream.kafka.batch-start`, or
`earliest`) and the next offset of every partition after it (`bergstream.kafka.next-offsets`,
`{"0":1174,"1":800}`). Every record below the next offsets that a consumer of that isolation level reads is
in the archive table or its dead-letter table, once. Under read_committed, offsets are not all records:
aborted records and transactions' markers leave gaps, which the archive does not fill.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from bergstream.kafka_source import READ_COMMITTED, READ_UNCOMMITTED

TOPIC = "bergstream.kafka.topic"
CLUSTER = "bergstream.kafka.cluster"
BATCH_START = "bergstream.kafka.batch-start"
NEXT_OFFSETS = "bergstream.kafka.next-offsets"
ISOLATION_LEVEL = "bergstream.kafka.isolation-level"
TOPIC_ID = "bergstream.kafka.topic-id"
# Spark's startingOffsets for a partition that has no recorded position.
EARLIEST = -2


@dataclass(frozen=True)
class Origin:
    """Where a table's rows are read from: a topic of a cluster, read at an isolation level; the topic's Kafka
    id, where known, tells it from a topic of the same name deleted and created again."""

    topic: str
    cluster: str
    isolation_level: str = READ_COMMITTED
    topic_id: str | None = None

    def properties(self) -> dict[str, str]:
        recorded = {TOPIC: self.topic, CLUSTER: self.cluster, ISOLATION_LEVEL: self.isolation_level}
        return recorded if self.topic_id is None else {**recorded, TOPIC_ID: self.topic_id}

    @classmethod
    def recorded(cls, summary: Mapping[str, str]) -> Origin | None:
        """The origin a snapshot's summary records; None when it records none. Commits written before the
        isolation level was recorded were read with read_uncommitted, Spark's default then; their topic id is
        unknown (None)."""
        if summary.get(TOPIC) is None or summary.get(CLUSTER) is None:
            return None
        return cls(
            summary[TOPIC],
            summary[CLUSTER],
            summary.get(ISOLATION_LEVEL, READ_UNCOMMITTED),
            summary.get(TOPIC_ID),
        )


@dataclass(frozen=True)
class BatchRange:
    """A micro-batch's offsets: where each partition started (or `earliest`), and the next offset after it."""

    start: dict[int, int] | str
    end: dict[int, int]

    def properties(self, origin: Origin) -> dict[str, str]:
        """The snapshot properties that record the range and where it was read."""
        start = self.start if isinstance(self.start, str) else offsets_json(self.start)
        return {**origin.properties(), BATCH_START: start, NEXT_OFFSETS: offsets_json(self.end)}

    def raised_to(self, floor: Mapping[int, int]) -> BatchRange:
        """This range with no partition below `floor`: every record below a floor is archived already, so
        its start and its end (the position it records) are raised to it."""
        start = {p: max(self._start_of(p, end), floor.get(p, 0)) for p, end in self.end.items()}
        return BatchRange(start, {p: max(end, floor.get(p, end)) for p, end in self.end.items()})

    def after(self, earlier: BatchRange) -> BatchRange:
        """From `earlier`'s start to this range's end: the ranges of batches that follow each other, committed
        as one."""
        if isinstance(earlier.start, str):
            start: dict[int, int] | str = earlier.start
        else:
            start = {**{p: self._start_of(p, end) for p, end in self.end.items()}, **earlier.start}
        return BatchRange(start, {**earlier.end, **self.end})

    def overlap(self, other: BatchRange) -> dict[int, tuple[int, int]]:
        """Per partition, the offsets [first, end) both ranges cover; a start by name counts as `earliest`
        (0), except `latest`, whose start is not known here and is taken as the range's end."""
        overlaps = {}
        for partition, end in self.end.items():
            other_end = other.end.get(partition)
            if other_end is None:
                continue
            first = max(self._start_of(partition, end), other._start_of(partition, other_end))
            last = min(end, other_end)
            if first < last:
                overlaps[partition] = (first, last)
        return overlaps

    def _start_of(self, partition: int, end: int) -> int:
        if isinstance(self.start, str):
            return end if self.start == "latest" else 0
        return self.start.get(partition, 0)

    def starting_offsets(self, topic: str) -> str:
        """The range's start as Spark's Kafka source takes it."""
        return self.start if isinstance(self.start, str) else spark_offsets(topic, self.start)

    @classmethod
    def recorded(cls, summary: Mapping[str, str], topic: str, cluster: str) -> BatchRange | None:
        """The range a snapshot's summary records for `topic` read from `cluster`; None when it records
        none (not a router commit, or another topic's or cluster's)."""
        if (
            summary.get(NEXT_OFFSETS) is None
            or summary.get(TOPIC) != topic
            or summary.get(CLUSTER) != cluster
        ):
            return None
        start_text = summary.get(BATCH_START, "earliest")
        start: dict[int, int] | str = parse_offsets(start_text) if start_text.startswith("{") else start_text
        return cls(start, parse_offsets(summary[NEXT_OFFSETS]))


def parse_offsets(text: str) -> dict[int, int]:
    """`{"0": 42}` as {0: 42}."""
    return {int(partition): int(offset) for partition, offset in json.loads(text).items()}


def offsets_json(offsets: Mapping[int, int]) -> str:
    """{0: 42} as `{"0":42}`, partitions in order."""
    return json.dumps(_keyed(offsets), separators=(",", ":"))


def spark_offsets(topic: str, offsets: Mapping[int, int]) -> str:
    """Spark's Kafka offsets JSON of one topic: `{"topic": {"0": 42}}`."""
    return json.dumps({topic: _keyed(offsets)})


def _keyed(offsets: Mapping[int, int]) -> dict[str, int]:
    return {str(partition): offset for partition, offset in sorted(offsets.items())}
