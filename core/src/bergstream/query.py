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

import json
import logging
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, ClassVar

from bergstream.errors import BergstreamError, first_line

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("bergstream.query")

REPLAYED_BATCH_FAILURE = 'because the return value of "scala.Option.get()" is null'
REPLAY_RESTARTS = 3


def _ignore(query: StreamingQuery) -> None:
    pass


def _cannot_recover(error: Exception) -> bool:
    return False


# How py4j writes a Java exception into a Python traceback. Spark's stream thread, stopped while a
# foreachBatch function fails, matches `<this>((.|\r\n|\r|\n)*)(...InterruptedException...)` over the
# traceback py4j hands it (StreamExecution.isInterruptionException); the regular expression recurses once a
# character, so a Java stack trace of a few thousand characters overflows the thread's stack, and the query
# ends with a StackOverflowError logged and no error recorded, as though it had finished.
_PY4J_JAVA_ERROR = "Py4JJavaError: An error occurred while calling"
# The most of an error's text handed back to Spark; the whole error is logged first.
_CROSSING_LIMIT = 4000


class BatchFailed(BergstreamError):
    """A micro-batch's function failed; the message names the query, the batch and the chain of causes."""


def foreach_batch(name: str, function: Callable[[DataFrame, int], None]) -> Callable[[DataFrame, int], None]:
    """`function`, as the foreachBatch function of query `name`: an error it raises out of a Java call is
    logged whole and handed to Spark as a `BatchFailed` whose text holds the chain of causes, one line each,
    without the Java stack traces Spark's stop handling cannot read (see `_PY4J_JAVA_ERROR`)."""

    def run(records: DataFrame, batch_id: int) -> None:
        try:
            function(records, batch_id)
        except Exception as error:
            if not any(_PY4J_JAVA_ERROR in part for part in traceback.format_exception(error)):
                raise
            log.error("%s batch %d failed", name, batch_id, exc_info=error)
            raise BatchFailed(f"{name} batch {batch_id} failed: {causes_text(error)}") from None

    return run


def causes_text(error: BaseException) -> str:
    """The chain of `error`'s causes, Python's and Java's, one line each, at most `_CROSSING_LIMIT`
    characters."""
    lines: list[str] = []
    current: BaseException | None = error
    while current is not None and len(lines) < 40:
        throwable: Any = getattr(current, "java_exception", None)
        if throwable is None:
            lines.append(_shortened(f"{type(current).__name__}: {first_line(current)}", 500))
        while throwable is not None and len(lines) < 40:
            own = str(throwable.toString()).strip().splitlines()
            lines.append(_shortened(own[0] if own else str(throwable.getClass().getName()), 500))
            throwable = throwable.getCause()
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return _shortened(
        "; caused by ".join(lines).replace(_PY4J_JAVA_ERROR, "Py4JJavaError calling"), _CROSSING_LIMIT
    )


def _shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


_PYTHON_TRACEBACK = "Traceback (most recent call last):"


def query_failure(error: BaseException) -> str:
    """The line that says why a query failed: for a failure of its foreachBatch function, the line of the
    Python error it raised (the last of a chain) rather than the first line of Spark's report, which ends
    with the traceback's heading."""
    text = str(error)
    if _PYTHON_TRACEBACK not in text:
        return first_line(error)
    lines = text.rsplit(_PYTHON_TRACEBACK, 1)[1].splitlines()
    return next((line for line in lines if line.strip() and not line.startswith(" ")), first_line(error))


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
                    log.warning("%s stopped: %s", self.name, query_failure(error))
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


# The fields of a source's progress that hold its offsets: JSON documents, handed on as JSON text.
_OFFSETS = ("startOffset", "endOffset", "latestOffset")


def progress_from_json(text: str) -> Any:
    """A micro-batch's progress (PySpark's StreamingQueryProgress) from Spark's JSON of it, each source's
    offsets as JSON text, as PySpark gives them."""
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    document = json.loads(text)
    for source in document.get("sources", []):
        for key in _OFFSETS:
            if source.get(key) is not None and not isinstance(source[key], str):
                source[key] = json.dumps(source[key], separators=(",", ":"))
    return StreamingQueryProgress.fromJson(document)


class _ProgressListener:
    """Spark's listener interface for Python, implemented over py4j: each progress crosses from the JVM as
    its JSON, in one call. PySpark's own listener asks the JVM for every field of the progress, of each of
    its sources and of each state operator, one call each: 362 ms a batch against 2 ms for the JSON,
    measured on the same events of a loaded 2-core machine, time the listener's JVM thread spends searching
    jars for classes and the batches' own work waits for."""

    class Java:
        implements: ClassVar[list[str]] = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]

    def __init__(self, on_progress: Callable[[Any], None]) -> None:
        self.on_progress = on_progress

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        self.on_progress(progress_from_json(event.progress().json()))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


@contextmanager
def progress_events(spark: SparkSession, on_progress: Callable[[Any], None]) -> Iterator[None]:
    """`on_progress` called with the progress of each micro-batch of the session's queries, in the block.

    Progress events come through Spark's listener bus after their batch; the block's end waits for the
    bus to deliver those already posted."""
    from pyspark import SparkContext
    from pyspark.java_gateway import ensure_callback_server_started

    ensure_callback_server_started(SparkContext._gateway)  # type: ignore[no-untyped-call]
    jvm: Any = spark._jvm
    listener = jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper(
        _ProgressListener(on_progress)
    )
    streams: Any = spark._jsparkSession.streams()
    streams.addListener(listener)
    try:
        yield
    finally:
        with suppress(Exception):
            spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
        streams.removeListener(listener)
