"""Offset arithmetic: consumer lag in records and in time, and ranges that expired from Kafka before the
router read them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field


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


@dataclass
class LogEndSamples:
    """Where one partition's log end was seen, and when: (offset, seconds since the epoch), oldest first.

    kafka-lag-exporter's lookup table. A record at offset o was produced after the last sample whose log end
    is at most o and no later than the first sample whose log end is past o; in between, production is
    taken as even. The time does not come from the records, so a producer's clock or a replay's original
    timestamps do not skew it.
    """

    limit: int = 240
    samples: list[tuple[int, float]] = field(default_factory=list)

    def observe(self, log_end: int, seen_at: float) -> None:
        samples = self.samples
        if samples and log_end < samples[-1][0]:  # the partition was deleted and made again
            samples.clear()
        if len(samples) >= 2 and samples[-2][0] == samples[-1][0] == log_end:
            samples[-1] = (log_end, seen_at)  # a quiet partition: the first and the last sighting suffice
        else:
            samples.append((log_end, seen_at))
        if len(samples) > self.limit:
            # Thin the older half: it serves routers far behind, where a coarser estimate does.
            half = len(samples) // 2
            del samples[1:half:2]

    @property
    def first_seen(self) -> float | None:
        return self.samples[0][1] if self.samples else None

    def produced_at(self, offset: int) -> float | None:
        """When the record at `offset` was produced; None when it was there already at the first sample,
        or not yet at the last."""
        before = after = None
        for sample in self.samples:
            if sample[0] <= offset:
                before = sample
            else:
                after = sample
                break
        if before is None or after is None:
            return None
        (low, since), (high, until) = before, after
        return since + (until - since) * (offset + 1 - low) / (high - low)

    def forget_before(self, offset: int) -> None:
        """Drop the samples that no record at or after `offset` needs."""
        keep = 0
        for index, (log_end, _) in enumerate(self.samples):
            if log_end > offset:
                break
            keep = index
        del self.samples[:keep]


def time_lag(
    next_offset: int, log_end: int, samples: LogEndSamples, record_timestamp: float | None, now: float
) -> float:
    """Seconds the first record not yet archived, at `next_offset`, has waited; 0 when all is archived.

    A record older than the samples (a backlog the router found when it started) was produced at its Kafka
    timestamp, `record_timestamp`, and no later than the first sample; without its timestamp, the first
    sample gives the least it has waited."""
    if next_offset >= log_end:
        return 0.0
    since = samples.produced_at(next_offset)
    if since is None:
        known = [t for t in (record_timestamp, samples.first_seen) if t is not None]
        since = min(known) if known else now
    return max(0.0, now - since)
