"""A streaming query run to its end: started, watched, stopped on request, and started again after the
known failure of a batch replayed from the offset log.

Spark 4.1's Kafka source fails the progress report of a batch replayed from the offset log after a crash
(SPARK-55271, a null Option in KafkaMicroBatchStream.metrics) once the batch itself has run and been
committed. Starting the query again resumes normally from its checkpoint; a few such restarts in a row are
allowed. The router and an application's runtime both run their queries here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from bergstream.errors import first_line

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("bergstream.query")

REPLAYED_BATCH_FAILURE = 'because the return value of "scala.Option.get()" is null'
REPLAY_RESTARTS = 3


def _ignore(query: StreamingQuery) -> None:
    pass


class QueryRunner:
    """Runs the query that `start` starts until it ends, or until `stopping` is set."""

    def __init__(self, name: str, start: Callable[[], StreamingQuery], stopping: threading.Event) -> None:
        self.name = name
        self._start = start
        self.stopping = stopping
        # The query running now, or the last one; None before the first has started.
        self.query: StreamingQuery | None = None
        # Kept in Python, not asked of the JVM: the metrics that read it are served while the JVM is stuck.
        self._running = False

    def run(self, watch: Callable[[StreamingQuery], None] = _ignore) -> None:
        """Start the query and call `watch` once a second while it runs; start it again after a replayed
        batch failed its progress report. Raises the query's error, unless it was being stopped."""
        from pyspark.errors import StreamingQueryException

        for restart in range(REPLAY_RESTARTS + 1):
            if self.stopping.is_set():
                return
            query = self._start()
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
                if REPLAYED_BATCH_FAILURE not in str(error) or restart == REPLAY_RESTARTS:
                    raise
                log.warning("%s: starting the query again after a replayed batch (SPARK-55271)", self.name)
            finally:
                self._running = False

    @property
    def running(self) -> bool:
        """Whether a query has started and not ended."""
        return self._running
