"""Where an archive ends in Kafka: the snapshot summary properties each router commit writes, and their
reading, shared by the router (which writes them and resumes from them) and the backfill (which hands an
application over to Kafka at them).

A router commit records the topic, the cluster it was read from, and the micro-batch's range as Spark's
offset log has it: the offset each partition started at (`bergstream.kafka.batch-start`, or `earliest`)
and the next offset of every partition after it (`bergstream.kafka.next-offsets`, `{"0":1174,"1":800}`).
Every offset below the next offsets is in the archive table or its dead-letter table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

TOPIC = "bergstream.kafka.topic"
CLUSTER = "bergstream.kafka.cluster"
BATCH_START = "bergstream.kafka.batch-start"
NEXT_OFFSETS = "bergstream.kafka.next-offsets"
# Spark's startingOffsets for a partition that has no recorded position.
EARLIEST = -2


@dataclass(frozen=True)
class BatchRange:
    """A micro-batch's offsets: where each partition started (or `earliest`), and the next offset after it."""

    start: dict[int, int] | str
    end: dict[int, int]

    def properties(self, topic: str, cluster: str) -> dict[str, str]:
        """The snapshot properties that record the range."""
        start = self.start if isinstance(self.start, str) else offsets_json(self.start)
        return {TOPIC: topic, CLUSTER: cluster, BATCH_START: start, NEXT_OFFSETS: offsets_json(self.end)}

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
