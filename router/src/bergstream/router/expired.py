"""Offsets that expired from Kafka before the router read them: counted and reported, not hidden."""

from __future__ import annotations

import logging

from bergstream.router.batch_counts import BatchCounts
from bergstream.router.consumer_group import GroupCommitter
from bergstream.router.metrics import RouterMetrics
from bergstream.router.offsets import expired_ranges

log = logging.getLogger("bergstream.router")


class ExpiredOffsets:
    """Where the router left off in each partition, and the gaps Kafka's retention opened behind it."""

    def __init__(self, topic: str, kafka: GroupCommitter, metrics: RouterMetrics) -> None:
        self.topic = topic
        self.kafka = kafka
        self.metrics = metrics
        self._next_offsets: dict[int, int] = {}

    def left_off(self, offsets: dict[int, int]) -> None:
        """The router reached `offsets` (the next offset to read, per partition)."""
        for partition, offset in offsets.items():
            self._next_offsets[partition] = max(self._next_offsets.get(partition, 0), offset)

    def read(self, counts: BatchCounts) -> int:
        """Report the offsets between where the router left off and the first one the batch read, gone
        from Kafka meanwhile; then move past the batch. Returns how many expired."""
        first_read = {read.partition: read.first for read in counts.partitions}
        gaps = [
            p for p, first in first_read.items() if p in self._next_offsets and first > self._next_offsets[p]
        ]
        expired = 0
        if gaps:
            log_start = {p: low for p, (low, _) in self.kafka.watermarks(gaps).items()}
            for gap in expired_ranges({p: self._next_offsets[p] for p in gaps}, first_read, log_start):
                log.warning(
                    "%s partition %d: offsets %d to %d (%d records) expired from Kafka before being archived",
                    self.topic, gap.partition, gap.start, gap.end - 1, gap.count,
                )  # fmt: skip
                self.metrics.expired_offsets.labels(self.topic, str(gap.partition)).inc(gap.count)
                expired += gap.count
        self.left_off({read.partition: read.last + 1 for read in counts.partitions})
        return expired
