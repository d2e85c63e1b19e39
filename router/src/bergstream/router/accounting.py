"""What the router has done, batch by batch: its totals and its Prometheus metrics."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from bergstream.router.batch_counts import BatchCounts
from bergstream.router.expired import ExpiredOffsets
from bergstream.router.metrics import RouterMetrics
from bergstream.router.write import Appended, BatchTableWriter

log = logging.getLogger("bergstream.router")


@dataclass
class RouterTotals:
    batches: int = 0
    replayed_batches: int = 0
    read: int = 0
    archived: int = 0
    dead_lettered: int = 0
    files: int = 0
    bytes: int = 0
    expired: int = 0
    per_partition: dict[int, int] = field(default_factory=dict)

    def add(self, other: RouterTotals) -> None:
        """Count `other`'s batches and records in these totals too."""
        for name in ("batches", "replayed_batches", "read", "archived", "dead_lettered", "files", "bytes",
                     "expired"):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for partition, read in other.per_partition.items():
            self.per_partition[partition] = self.per_partition.get(partition, 0) + read

    def summary(self, topic: str) -> str:
        return (
            f"{topic}: {self.batches} batches ({self.replayed_batches} replayed), read {self.read:,}, "
            f"archived {self.archived:,}, dead-lettered {self.dead_lettered:,}, {self.files} files, "
            f"{self.bytes / 1e6:.1f} MB, {self.expired:,} offsets expired before they were read"
        )


class BatchAccounting:
    """Counts each archived batch into the totals and the metrics, and logs it."""

    def __init__(self, topic: str, metrics: RouterMetrics, expired: ExpiredOffsets) -> None:
        self.topic = topic
        self.metrics = metrics
        self.expired = expired
        self.totals = RouterTotals()
        # The ingestion time of the newest record archived, in seconds since the epoch.
        self.newest_ingestion: float | None = None

    def account(
        self,
        batch_id: int,
        counts: BatchCounts | None,
        appended: list[tuple[BatchTableWriter, Appended | None]],
        seconds: float,
        phases: dict[str, float],
    ) -> None:
        """Batch `batch_id` took `seconds`; `counts` is None for a replayed batch, committed before."""
        topic, metrics, totals = self.topic, self.metrics, self.totals
        metrics.batches.labels(topic, "replayed" if counts is None else "written").inc()
        metrics.batch_duration.labels(topic).observe(seconds)
        metrics.last_batch.labels(topic).set(batch_id)
        totals.batches += 1
        timings = ", ".join(f"{phase} {took:.1f}s" for phase, took in phases.items())
        if counts is None:
            totals.replayed_batches += 1
            log.info(
                "%s batch %d (replayed, already committed) in %.1fs (%s)", topic, batch_id, seconds, timings
            )
            return
        totals.expired += self.expired.read(counts)
        for read in counts.partitions:
            totals.per_partition[read.partition] = totals.per_partition.get(read.partition, 0) + read.read
            metrics.records_read.labels(topic, str(read.partition)).inc(read.read)
        if counts.newest is not None:
            self.committed_newest(counts.newest.timestamp())
        written = [(writer, result) for writer, result in appended if result is not None]
        for writer, result in written:
            metrics.files_written.labels(topic, writer.identifier).inc(result.files)
            metrics.bytes_written.labels(topic, writer.identifier).inc(result.bytes)
        files = sum(result.files for _, result in written)
        size = sum(result.bytes for _, result in written)
        metrics.records_archived.labels(topic).inc(counts.archived)
        metrics.records_dead_lettered.labels(topic).inc(counts.dead_lettered)
        totals.read += counts.read
        totals.archived += counts.archived
        totals.dead_lettered += counts.dead_lettered
        totals.files += files
        totals.bytes += size
        log.info(
            "%s batch %d: read %d, archived %d, dead-lettered %d, %d files, %.1f MB in %.1fs (%s)",
            topic, batch_id, counts.read, counts.archived, counts.dead_lettered, files, size / 1e6, seconds,
            timings,
        )  # fmt: skip

    def committed_newest(self, newest: float | None) -> None:
        """Records ingested up to `newest` (seconds since the epoch) are in the archive now."""
        if newest is None:
            return
        self.newest_ingestion = max(self.newest_ingestion or newest, newest)
        self.metrics.newest_ingestion.labels(self.topic).set(self.newest_ingestion)
