"""Following the router's query: where Spark has checkpointed it to, told to the consumer group
`bergstream-router.<topic>` and to the lag metrics, after each batch and on a timer."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

from pyspark.sql.streaming.query import StreamingQuery

from bergstream.router.consumer_group import GroupCommitter, LogBounds
from bergstream.router.expired import ExpiredOffsets
from bergstream.router.lag import LagReporter
from bergstream.router.metrics import RouterMetrics
from bergstream.router.offsets import parse_spark_offsets


class ProgressFollower:
    """Commits the checkpointed offsets to the consumer group and keeps the lag metrics fresh."""

    def __init__(
        self,
        topic: str,
        kafka: GroupCommitter,
        metrics: RouterMetrics,
        expired: ExpiredOffsets,
        newest_ingestion: Callable[[], float | None],
        refresh_seconds: float,
        cluster: str,
    ) -> None:
        self.topic = topic
        self.expired = expired
        self._kafka = kafka
        self._lag = LagReporter(topic, cluster, kafka, metrics)
        self._newest_ingestion = newest_ingestion
        self._refresh_seconds = refresh_seconds
        # Where the archive is, as Spark checkpointed it; and where the consumer group was told it is.
        self._archived: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._followed_batch: int | None = None
        # Reading lag moves the client: the lag thread and the loop that follows the query take turns.
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def start(self, refresh: bool = True) -> None:
        """Begin where the consumer group is, and (with `refresh`) refresh lag every `refresh_seconds` until
        `stop`; without, whoever follows many topics calls `refresh` itself."""
        self._committed = self._kafka.committed()
        self._archived = dict(self._committed)
        self.expired.left_off(self._committed)
        self._stop.clear()
        if refresh:
            threading.Thread(target=self._refresh_forever, name="bergstream-lag", daemon=True).start()

    def stop(self, query: StreamingQuery | None) -> None:
        """Follow the last progress of `query`, and stop refreshing."""
        self._stop.set()
        if query is not None:
            self.follow(query)
        self.refresh()

    def follow(self, query: StreamingQuery) -> None:
        """Where Spark has checkpointed the query to, from its last progress: once a second, by the loop
        that waits for the query. Read as one JSON document; a listener would cost dozens of calls into
        the JVM for every batch."""
        progress = query.lastProgress
        if progress is None or not progress.sources or progress.batchId == self._followed_batch:
            return
        self._followed_batch = progress.batchId
        end_offsets = json.loads(progress.sources[0].json).get("endOffset")
        self.on_progress(json.dumps(end_offsets) if end_offsets else None)

    def on_progress(self, end_offsets_json: str | None, measure: bool = True) -> None:
        """Spark checkpointed a batch: the world's view of the router moves forward; `measure`, the lag
        too (else at the next `refresh`)."""
        end_offsets = parse_spark_offsets(end_offsets_json, self.topic)
        if end_offsets:
            self._archived = end_offsets
            self.expired.left_off(end_offsets)
        self.refresh(measure)

    def refresh(self, measure: bool = True, bounds: LogBounds | None = None) -> None:
        """Tell the consumer group where the archive is (a refused commit is tried again next time), and
        measure the lag (from `bounds` when they were read with other topics')."""
        with self._lock:
            archived = self._archived
            if archived and archived != self._committed and self._kafka.commit(archived):
                self._committed = archived
            if measure:
                self._lag.refresh(archived, self._newest_ingestion(), bounds)

    def _refresh_forever(self) -> None:
        while not self._stop.wait(self._refresh_seconds):
            self.refresh()
