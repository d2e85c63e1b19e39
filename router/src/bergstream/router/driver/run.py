"""A driver: one SparkSession running the queries of its topics (driver/query.py), each on a thread of its
own in a FAIR scheduling pool of its own, with one maintenance thread for every topic's tables. The driver
owns the signals: SIGTERM and SIGINT stop every query after its current batch.

A query that fails stops alone: the failure is logged naming its topics, `bergstream_router_topic_up` of
each drops to 0, and with `restart` it is started again after an exponential backoff (its checkpoint and the
tables' recorded positions make that exact) while the other queries go on; without (`router run --topic T`,
whose driver whatever runs it restarts), its failure ends the driver with the query's own error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import SparkSession

from bergstream.errors import BergstreamError, ConfigError
from bergstream.query import query_failure
from bergstream.router.accounting import RouterTotals
from bergstream.router.config import RouterConfig
from bergstream.router.driver.named import RestartSettings
from bergstream.router.driver.query import POOL_PROPERTY, TopicsQuery, pool_name
from bergstream.router.driver.settings import DriverSettings
from bergstream.router.errors import RouterStopped
from bergstream.router.metrics import RouterMetrics
from bergstream.router.retry import java_causes
from bergstream.router.schedule import RotatingMaintenance
from bergstream.router.together import failure_reason
from bergstream.schemas.schema_registry import RegistryStopped
from bergstream.signals import on_stop_signals

log = logging.getLogger("bergstream.router.driver")


@dataclass
class TopicOutcome:
    topic: str
    totals: RouterTotals
    restarts: int = 0
    error: str | None = None  # the last failure, when the topic did not end cleanly

    def summary(self) -> str:
        if self.error is not None:
            restarts = f" after {self.restarts} restarts" if self.restarts else ""
            return f"{self.topic}: FAILED{restarts}: {self.error}"
        restarted = f", {self.restarts} restarts" if self.restarts else ""
        return self.totals.summary(self.topic) + restarted


class Driver:
    """Runs `queries` on `spark`; `load(topic)` reads a topic's settings (again whenever its query starts
    again); `strict`: topics named one by one, each of which must load and exist at start."""

    def __init__(
        self,
        queries: list[DriverSettings],
        load: Callable[[str], RouterConfig],
        spark: SparkSession,
        metrics: RouterMetrics,
        restart: RestartSettings | None,
        strict: bool,
        prepare: Callable[[RouterConfig], None] | None = None,
    ) -> None:
        self.settings = queries
        self.spark = spark
        self.metrics = metrics
        self.restart = restart
        self._load = load
        self._strict = strict
        self._prepare = prepare
        self._stop = threading.Event()
        self._lock = threading.RLock()  # stop() may run in a signal handler while stop() holds it
        self._queries: dict[str, TopicsQuery] = {}
        self._lost_driver: str | None = None
        self._failure: Exception | None = None
        self._outcomes: dict[str, TopicOutcome] = {}
        self._owner: dict[str, str] = {}  # topic: the name of the query that reads it
        for settings in queries:
            for topic in settings.topics or ():
                self._known(topic, settings.name)

    def run(self, available_now: bool = False) -> list[TopicOutcome]:
        """Until stopped (or, with `available_now`, until every query archived what it reads, or failed)."""
        maintenance = None
        if not available_now:  # maintenance belongs to a driver that keeps running, not to one draining
            maintenance = RotatingMaintenance(self.spark, self.metrics, self._archived_settings)
            maintenance.start()
        threads = [
            threading.Thread(
                target=self._supervise,
                args=(settings, available_now),
                name=f"bergstream-query-{settings.name}",
            )
            for settings in self.settings
        ]
        with on_stop_signals(self.stop):
            try:
                for thread in threads:
                    thread.start()
                for thread in threads:
                    while thread.is_alive():  # a join with a timeout lets the main thread take signals
                        thread.join(1.0)
            finally:
                self.stop()
                for thread in threads:
                    thread.join()
                if maintenance is not None:
                    maintenance.stop()
        if self._failure is not None:
            raise self._failure
        if self._lost_driver is not None:
            raise BergstreamError(f"the driver's Spark session is gone: {self._lost_driver}")
        return [self._outcomes[topic] for topic in sorted(self._outcomes)]

    def stop(self) -> None:
        """Every query stops after its current batch; none is started again."""
        with self._lock:
            self._stop.set()
            for query in self._queries.values():
                query.stop()

    def _known(self, topic: str, query: str) -> None:
        """The topic's outcome and metrics, when its query reads it first."""
        if topic in self._outcomes:
            return
        self._outcomes[topic] = TopicOutcome(topic, RouterTotals())
        self._owner[topic] = query
        # Read when scraped: a listener would cost every batch of every topic dozens of JVM calls.
        self.metrics.topic_up.labels(topic).set_function(lambda: self._up(topic))
        self.metrics.topic_restarts.labels(topic)

    def _up(self, topic: str) -> float:
        query = self._queries.get(self._owner.get(topic, ""))
        return 0.0 if query is None else query.up(topic)

    def _archived_settings(self) -> list[RouterConfig]:
        return [
            config for query in list(self._queries.values()) for config in query.members.archived_settings()
        ]

    def _supervise(self, settings: DriverSettings, available_now: bool) -> None:
        # Local to this thread and inherited by the query's: every job of the query runs in its pool.
        self.spark.sparkContext.setLocalProperty(POOL_PROPERTY, pool_name(settings.name))
        failures = 0
        attempt = 0
        while not self._stop.is_set():
            attempt += 1
            started = time.monotonic()
            stage = "start"
            query = None
            try:
                if self._prepare is not None:
                    for config in self._loading(settings.topics or ()):
                        self._checked(config)
                query = TopicsQuery(settings, self._load, self.spark, self.metrics, self._stop, self._strict,
                                    on_added=lambda topic: self._known(topic, settings.name))  # fmt: skip
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._queries[settings.name] = query
                stage = "query"
                self._ended(query, query.run(available_now=available_now))
                return
            except RegistryStopped:
                return  # stopped, as asked, before its query started
            except Exception as error:
                if query is not None:
                    self._ended(query, {topic: w.totals for topic, w in query.topics.items()})
                reason = failure_reason(error)
                if isinstance(error, StreamingQueryException):
                    reason = query_failure(error)
                    error = RouterStopped(f"the router of {settings.subscription} stopped: {reason}")
                for topic in self._topics_of(settings, query):
                    self._outcomes[topic].error = reason
                    self.metrics.topic_failures.labels(topic, stage).inc()
                if self.restart is None:
                    with self._lock:
                        self._failure = self._failure or error
                    self.stop()
                    return
                # Spark's and bergstream's errors say what failed in their message; others are bugs.
                expected = isinstance(error, BergstreamError | PySparkException) or bool(java_causes(error))
                if not self._driver_alive():
                    self._lost_driver = reason
                    log.error("the driver's Spark session is gone (%s): stopping every query", reason)
                    self.stop()
                    return
                if self._stop.is_set() or available_now:
                    log.error("the router of %s failed (%s): %s", settings.subscription, stage, reason,
                              exc_info=not expected)  # fmt: skip
                    return
                failures = (
                    1 if time.monotonic() - started > self.restart.max_backoff_seconds else failures + 1
                )
                delay = self.restart.delay(failures)
                log.error(
                    "the router of %s failed (%s, attempt %d): %s; starting it again in %.0fs",
                    settings.subscription, stage, attempt, reason, delay, exc_info=not expected,
                )  # fmt: skip
                if self._stop.wait(delay):
                    return
                for topic in self._topics_of(settings, query):
                    self._outcomes[topic].restarts += 1
                    self.metrics.topic_restarts.labels(topic).inc()
            finally:
                with self._lock:
                    self._queries.pop(settings.name, None)

    def _checked(self, config: RouterConfig) -> None:
        """Check what must hold before the topic's query starts (access to Kafka): a strict driver refuses
        a topic that fails; otherwise (`--all`) the topic is read once it exists, and the others start."""
        assert self._prepare is not None
        try:
            self._prepare(config)
        except ConfigError as error:
            if self._strict:
                raise
            log.warning("topic %s: %s; its query reads it once that is mended", config.settings.topic, error)

    def _loading(self, topics: tuple[str, ...]) -> list[RouterConfig]:
        """The settings of `topics` that load; those that do not are refused by a strict driver, else
        dead-lettered whole by their query."""
        loaded = []
        for topic in topics:
            try:
                loaded.append(self._load(topic))
            except ConfigError:
                if self._strict:
                    raise
        return loaded

    def _ended(self, query: TopicsQuery, totals: dict[str, RouterTotals]) -> None:
        """Add what `query` archived to its topics' outcomes; a topic it dead-lettered whole is failed."""
        for topic, worker in query.topics.items():
            self._known(topic, query.settings.name)
            outcome = self._outcomes[topic]
            outcome.totals.add(totals[topic])
            outcome.error = None if worker.refusal is None else f"dead-lettered whole: {worker.refusal}"
            if topic in query.still_behind:
                outcome.error = query.still_behind[topic]

    def _topics_of(self, settings: DriverSettings, query: TopicsQuery | None) -> list[str]:
        named = list(settings.topics or ())
        met = list(query.topics) if query is not None else []
        return [topic for topic in dict.fromkeys(named + met) if topic in self._outcomes]

    def _driver_alive(self) -> bool:
        """Whether the JVM still answers and its SparkContext runs: no query can run once it does not."""
        try:
            context = self.spark.sparkContext._jsc
            return context is not None and not context.sc().isStopped()
        except Exception:
            return False
