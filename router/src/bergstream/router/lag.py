"""How far behind Kafka the archive is, in records and in time, refreshed every few seconds by the router."""

from __future__ import annotations

import logging
import time

from bergstream.kafka_source import READ_COMMITTED
from bergstream.router.consumer_group import GroupCommitter, LogBounds
from bergstream.router.metrics import RouterMetrics
from bergstream.router.offsets import LogEndSamples, lag, time_lag

log = logging.getLogger(__name__)


class LagReporter:
    """Reads each partition's log end, keeps when it was seen where (LogEndSamples), and sets the lag metrics
    from the offsets the archive holds: records behind, seconds behind, and the age of the newest archived
    record, which grows on a quiet topic even when nothing is behind.

    The log end is what the router can read: under read_committed (the default), the last stable offset.
    Records of a transaction still open are not lag, since no reader of committed records may read them;
    they are counted apart (`bergstream_router_unstable_offsets`), with the last stable offset itself, so
    that a transaction left open (which holds back every record after it) shows, and alerts.

    The lag series carry the consumer group and the cluster's name as kafka-lag-exporter labels its own
    (`group`, `cluster_name`), so dashboards and alerts built on it join them."""

    def __init__(self, topic: str, cluster: str, kafka: GroupCommitter, metrics: RouterMetrics) -> None:
        self.topic = topic
        self.cluster = cluster
        self._kafka = kafka
        self._metrics = metrics
        self._samples: dict[int, LogEndSamples] = {}
        # {partition: (offset, its record's Kafka timestamp)}, read once for a backlog older than the samples;
        # None when the record could not be read.
        self._timestamps: dict[int, tuple[int, float | None]] = {}

    def refresh(
        self, archived: dict[int, int], newest_ingestion: float | None, bounds: LogBounds | None = None
    ) -> None:
        """`archived`: the next offset to archive per partition; `newest_ingestion`: the newest Kafka
        timestamp archived, in seconds; `bounds`: the topic's log bounds, read with other topics' (None:
        read here)."""
        if bounds is None:
            try:
                watermarks = self._kafka.watermarks()
            except Exception as error:  # Kafka unreachable for a moment: keep the last values
                log.debug("refreshing the lag of %s failed: %s", self.topic, error)
                return
            start = {p: low for p, (low, _) in watermarks.items()}
            bounds = LogBounds(start, {p: high for p, (_, high) in watermarks.items()})
        now = time.time()
        log_start, log_end = bounds.start, bounds.end
        if self._kafka.isolation_level == READ_COMMITTED:
            self._unstable(log_end, bounds.high)
        for partition, end in log_end.items():
            self._samples.setdefault(partition, LogEndSamples()).observe(end, now)
        next_offsets = {p: max(archived.get(p, log_start[p]), log_start[p]) for p in log_end}
        timestamps = self._record_timestamps(
            {
                p: offset
                for p, offset in next_offsets.items()
                if offset < log_end[p] and self._samples[p].produced_at(offset) is None
            }
        )
        metrics, topic = self._metrics, self.topic
        for partition, behind in lag(archived, log_start, log_end).items():
            samples, offset = self._samples[partition], next_offsets[partition]
            label = str(partition)
            lag_labels = (topic, label, self._kafka.group, self.cluster)
            metrics.lag_offsets.labels(*lag_labels).set(behind)
            seconds = time_lag(offset, log_end[partition], samples, timestamps.get(partition), now)
            metrics.lag_seconds.labels(*lag_labels).set(seconds)
            # Every partition's read counter exists from the start, at 0: "nothing read lately" is then a
            # query over a series rather than over an absent one.
            metrics.records_read.labels(topic, label)
            samples.forget_before(offset)
        if newest_ingestion is not None:
            metrics.newest_archived_age.labels(topic).set(max(0.0, now - newest_ingestion))

    def _unstable(self, stable: dict[int, int], high: dict[int, int] | None) -> None:
        """Set each partition's last stable offset (`stable`, the router's log end), and the records past
        it, up to the high watermark (`high`; None: read here)."""
        if high is None:
            try:
                high = self._kafka.high_watermarks(sorted(stable))
            except Exception as error:
                log.debug("reading the high watermarks of %s failed: %s", self.topic, error)
                return
        for partition, offset in stable.items():
            label = (self.topic, str(partition))
            self._metrics.last_stable_offset.labels(*label).set(offset)
            self._metrics.unstable_offsets.labels(*label).set(max(0, high.get(partition, offset) - offset))

    def _record_timestamps(self, positions: dict[int, int]) -> dict[int, float | None]:
        """The Kafka timestamps of the records at `positions`, each read from Kafka once."""
        cached = self._timestamps
        for partition in [p for p in cached if cached[p][0] != positions.get(p)]:
            del cached[partition]
        wanted = {p: offset for p, offset in positions.items() if p not in cached}
        if wanted:
            try:
                found = self._kafka.record_timestamps(wanted)
            except Exception as error:
                log.debug("reading record timestamps of %s failed: %s", self.topic, error)
                found = {}
            for partition, offset in wanted.items():
                cached[partition] = (offset, found.get(partition))
        return {p: timestamp for p, (_, timestamp) in cached.items()}
