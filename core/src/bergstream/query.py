"""A streaming query run to its end: started, watched, stopped on request, and started again after the
known failure of a batch replayed from the offset log, or after a failure its owner knows how to mend.

Spark 4.1's Kafka source fails the progress report of a batch replayed from the offset log after a crash
(SPARK-55271, a null Option in KafkaMicroBatchStream.metrics) once the batch itself has run and been
committed. Starting the query again resumes normally from its checkpoint; a few such restarts in a row are
allowed. An owner's `recover` mends a failure of its own before the query starts again (an application's
live source fetching a schema id its query did not know); each such restart is followed by that of the
batch it replays. The router and an application's runtime both run their queries here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from bergstream.errors import first_line

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("bergstream.query")

REPLAYED_BATCH_FAILURE = 'because the return value of "scala.Option.get()" is null'
REPLAY_RESTARTS = 3


def _ignore(query: StreamingQuery) -> None:
    pass


def _cannot_recover(error: Exception) -> bool:
    return False


class QueryRunner:
    """Runs the query that `start` starts until it ends, or until `stopping` is set."""

    def __init__(
        self,
        name: str,
        start: Callable[[], StreamingQuery],
        stopping: threading.Event,
        recover: Callable[[Exception], bool] = _cannot_recover,
    ) -> None:
        self.name = name
        self._start = start
        self.stopping = stopping
        # Mends the failure of a query, if it can, and says whether the query may start again.
        self._recover = recover
        # The query running now, or the last one; None before the first has started.
        self.query: StreamingQuery | None = None
        # Kept in Python, not asked of the JVM: the metrics that read it are served while the JVM is stuck.
        self._running = False

    def run(self, watch: Callable[[StreamingQuery], None] = _ignore) -> None:
        """Start the query and call `watch` once a second while it runs; start it again after a replayed
        batch failed its progress report, or after `recover` mended its failure. Raises the query's error,
        unless it was being stopped."""
        from pyspark.errors import StreamingQueryException

        replays = 0
        while not self.stopping.is_set():
            try:
                query = self._start()
            except Exception as error:
                if self.stopping.is_set():
                    log.warning("%s stopped while starting: %s", self.name, first_line(error))
                    return
                raise
            self.query = query
            self._running = True
            log.info("%s started: query %s", self.name, query.id)
            try:
                while not query.awaitTermination(1):
                    watch(query)
                    if self.stopping.is_set():
                        log.info("%s: stopping after its current batch", self.name)
                        query.stop()
                return
            except StreamingQueryException as error:
                if self.stopping.is_set():
                    log.warning("%s stopped: %s", self.name, first_line(error))
                    return
                if REPLAYED_BATCH_FAILURE in str(error) and replays < REPLAY_RESTARTS:
                    replays += 1
                    log.warning(
                        "%s: starting the query again after a replayed batch (SPARK-55271)", self.name
                    )
                elif self._recover(error):
                    replays = 0
                else:
                    raise
            finally:
                self._running = False

    @property
    def running(self) -> bool:
        """Whether a query has started and not ended."""
        return self._running


@contextmanager
def progress_events(spark: SparkSession, on_progress: Callable[[Any], None]) -> Iterator[None]:
    """`on_progress` called with the progress of each micro-batch of the session's queries, in the block.

    Progress events come through Spark's listener bus after their batch; the block's end waits for the
    bus to deliver those already posted."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            on_progress(event.progress)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    listener = Listener()
    spark.streams.addListener(listener)
    try:
        yield
    finally:
        with suppress(Exception):
            spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
        spark.streams.removeListener(listener)
