"""Offset arithmetic: consumer lag, and ranges that expired from Kafka before the router read them."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ExpiredRange:
    partition: int
    start: int  # the first offset lost
    end: int  # the first offset still there (exclusive end)

    @property
    def count(self) -> int:
        return self.end - self.start


def expired_ranges(
    expected_start: dict[int, int], first_read: dict[int, int], log_start: dict[int, int]
) -> list[ExpiredRange]:
    """Offsets the router should have read next but Kafka had already deleted.

    `expected_start` is where each partition was left, `first_read` the first offset this batch read,
    `log_start` the oldest offset Kafka still has. A gap is expiry only when Kafka's log starts past the
    expected offset: other gaps (transaction markers, compaction) are normal.
    """
    ranges = []
    for partition, expected in sorted(expected_start.items()):
        earliest = log_start.get(partition)
        if earliest is None or earliest <= expected:
            continue
        read = first_read.get(partition)
        end = earliest if read is None else min(earliest, read)
        if end > expected:
            ranges.append(ExpiredRange(partition, expected, end))
    return ranges


def lag(committed: dict[int, int], log_start: dict[int, int], log_end: dict[int, int]) -> dict[int, int]:
    """Records each partition holds beyond what the router committed (all of them where it committed none)."""
    return {
        partition: max(
            0, end - max(committed.get(partition, log_start.get(partition, 0)), log_start.get(partition, 0))
        )
        for partition, end in log_end.items()
    }


def parse_spark_offsets(offsets_json: str | None, topic: str) -> dict[int, int]:
    """Spark's Kafka source offsets, `{"topic": {"0": 42}}`, as {partition: offset} for one topic."""
    if not offsets_json:
        return {}
    per_topic = json.loads(offsets_json).get(topic, {})
    return {int(partition): int(offset) for partition, offset in per_topic.items()}
