"""`bergstream router run --topic A --topic B` or `--all`: many topics in one driver.

One SparkSession, one streaming query per topic, each a `Router` of its own (its checkpoint, archive and
dead-letter tables, consumer group), run on a thread of its own. The fleet owns the signals: SIGTERM and
SIGINT stop every query after its current batch.

Each topic's jobs run in a FAIR scheduling pool of its own (`bergstream-router.<topic>`), so that a topic
with a large backlog does not hold back the batches of the others. The pool is a local property of the
thread that starts the query; the query's thread inherits it, and so do the jobs of its foreachBatch
function, whose calls into Spark run on the query's thread.

A topic that fails (its settings do not load, its Kafka topic is gone, the catalog refuses its table, its
query fails) stops alone: the failure is logged naming the topic, `bergstream_router_topic_up{topic}`
drops to 0, and the topic is started again after an exponential backoff, its settings read again, while
the other topics go on. A driver of one topic (`router run --topic A`) is a fleet of one that is not started
again: its failure ends the driver, with the topic's own error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import Field
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from bergstream.catalog import CatalogConfig
from bergstream.errors import BergstreamError, ConfigError, first_line
from bergstream.router.accounting import RouterTotals
from bergstream.router.app import Router
from bergstream.router.config import RouterConfig
from bergstream.router.metrics import RouterMetrics
from bergstream.router.retry import Backoff, java_causes
from bergstream.router.table import ensure_namespace
from bergstream.schemas.schema_registry import RegistryStopped
from bergstream.signals import on_stop_signals

log = logging.getLogger("bergstream.router.fleet")

POOL_PROPERTY = "spark.scheduler.pool"
FAIR_CONF = {"spark.scheduler.mode": "FAIR"}


def pool_name(topic: str) -> str:
    return f"bergstream-router.{topic}"


def fleet_app_name(topics: list[str], group: str | None = None) -> str:
    """The driver's Spark application: named after its group (as `bergstream deploy` names it), or after
    its topic when it runs one."""
    if group is None and len(topics) == 1:
        return f"bergstream-router-{topics[0]}"
    return f"bergstream-routers-{group if group is not None else f'{len(topics)}-topics'}"


def fleet_spark_conf(conf: dict[str, str]) -> dict[str, str]:
    """A driver of many topics schedules FAIR unless its settings say otherwise."""
    return {**FAIR_CONF, **conf}


class RestartSettings(Backoff):
    """How a failed topic is started again: after a backoff that doubles on each failure in a row, capped.

    A topic that ran for longer than the cap before it failed starts again from the first backoff."""

    initial_backoff_seconds: float = Field(default=5.0, gt=0)
    max_backoff_seconds: float = Field(default=300.0, gt=0)


class FleetMetrics:
    """Per topic: whether its query runs, and how often it was started again after a failure."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.topic_up = Gauge(
            "bergstream_router_topic_up",
            "1 while the topic's streaming query runs; 0 while it waits to be started again after a failure",
            ["topic"],
            registry=registry,
        )
        self.restarts = Counter(
            "bergstream_router_topic_restarts",
            "Times the topic's router was started again after a failure",
            ["topic"],
            registry=registry,
        )
        self.failures = Counter(
            "bergstream_router_topic_failures",
            "Failures of the topic's router, by what failed: settings, start or query",
            ["topic", "stage"],
            registry=registry,
        )


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


class SharedDriverMismatch(ConfigError):
    """A topic's settings ask for another Spark session than the driver's."""


def check_shared_driver(config: RouterConfig, driver: RouterConfig) -> None:
    """The topics of one driver share its SparkSession: the same catalog and the same `spark` block."""
    for key in ("catalog", "spark"):
        if getattr(config, key) != getattr(driver, key):
            raise SharedDriverMismatch(
                f"topic {config.topic}: its {key} settings differ from those of topic {driver.topic}, "
                f"whose settings started this driver; the topics of one driver share their catalog and "
                f"spark settings: make them the same, or run {config.topic} in a driver of its own"
            )


def topics_in(directory: Path) -> list[str]:
    """The topics with a settings file (<topic>.yaml) in `directory`, by name."""
    topics = sorted(path.stem for path in directory.glob("*.yaml"))
    if not topics:
        raise ConfigError(f"--all: {directory} holds no topic settings (<topic>.yaml)")
    return topics


def driver_settings(
    topics: list[str], load: Callable[[str], RouterConfig], strict: bool
) -> list[RouterConfig]:
    """The settings of the topics that load; the first one's catalog and spark block start the driver.

    `strict` (topics named one by one): every topic must load and share the driver's catalog and spark
    settings, or the driver refuses to start. Otherwise (`--all`) a topic whose settings do not load is
    reported and left to its restarts, which read its file again: the other topics start regardless.
    """
    loaded: list[RouterConfig] = []
    problems: list[str] = []
    for topic in topics:
        try:
            loaded.append(load(topic))
        except ConfigError as error:
            problems.append(str(error))
    if problems and (strict or not loaded):
        raise ConfigError("; ".join(problems))
    for problem in problems:
        log.error("%s; that topic starts once its settings load", problem)
    if strict:
        for config in loaded[1:]:
            check_shared_driver(config, loaded[0])
    return loaded


def failure_reason(error: BaseException) -> str:
    """One line: the Java exception and its deepest cause for an error from Spark, else the message."""
    causes = java_causes(error)
    if causes:
        deepest = f"; caused by {causes[-1].line}" if len(causes) > 1 else ""
        return causes[0].line + deepest
    return first_line(error)


class Fleet:
    """Runs the router of every topic in `topics` on `spark`, restarting a failed one with backoff.

    `load(topic)` reads and validates a topic's settings (again at every restart, so that a fixed file
    fixes the topic), whose catalog is `catalog`; `prepare(config)` checks what must hold before its query
    starts (access to Kafka). With no `restart`, no topic is started again: the first failure stops every
    topic and `run` raises it.
    """

    def __init__(
        self,
        topics: list[str],
        load: Callable[[str], RouterConfig],
        spark: SparkSession,
        metrics: RouterMetrics,
        restart: RestartSettings | None,
        catalog: CatalogConfig,
        prepare: Callable[[RouterConfig], None] | None = None,
    ) -> None:
        if len(set(topics)) != len(topics):
            raise ConfigError(f"a topic is named twice: {', '.join(topics)}")
        self.topics = topics
        self.spark = spark
        self.metrics = metrics
        self.fleet_metrics = FleetMetrics(metrics.registry)
        self.restart = restart
        self._load = load
        self.catalog = catalog
        self._prepare = prepare
        self._stop = threading.Event()
        self._lock = threading.RLock()  # stop() may run in a signal handler while stop() holds it
        self._routers: dict[str, Router] = {}
        self._lost_driver: str | None = None
        self._failure: Exception | None = None
        self.outcomes: dict[str, TopicOutcome] = {
            topic: TopicOutcome(topic, RouterTotals()) for topic in topics
        }
        for topic in topics:
            # Read when scraped: a listener would cost every batch of every topic dozens of JVM calls.
            self.fleet_metrics.topic_up.labels(topic).set_function(partial(self._up, topic))
            self.fleet_metrics.restarts.labels(topic)

    def run(self, available_now: bool = False) -> list[TopicOutcome]:
        """Until stopped (or, with `available_now`, until every topic archived what it holds or failed)."""
        # Made once here: topics creating their tables at once would each try to make the namespace.
        ensure_namespace(self.spark, self.catalog)
        threads = [
            threading.Thread(
                target=self._supervise, args=(topic, available_now), name=f"bergstream-router-{topic}"
            )
            for topic in self.topics
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
        if self._failure is not None:
            raise self._failure
        if self._lost_driver is not None:
            raise BergstreamError(f"the driver's Spark session is gone: {self._lost_driver}")
        return [self.outcomes[topic] for topic in self.topics]

    def stop(self) -> None:
        """Every query stops after its current batch; no topic is started again."""
        with self._lock:
            if not self._stop.is_set() and self._routers and len(self.topics) > 1:
                log.info("stopping the routers of %d topics after their current batches", len(self._routers))
            self._stop.set()
            for router in self._routers.values():
                router.stop()

    def _supervise(self, topic: str, available_now: bool) -> None:
        # Local to this thread and inherited by the query's: every job of the topic runs in its pool.
        self.spark.sparkContext.setLocalProperty(POOL_PROPERTY, pool_name(topic))
        outcome = self.outcomes[topic]
        failures = 0
        for attempt in self._attempts():
            started = time.monotonic()
            stage = "settings"
            try:
                config = self._load(topic)
                stage = "start"
                if self._prepare is not None:
                    self._prepare(config)
                router = Router(config, self.spark, self.metrics, self._stop)
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._routers[topic] = router
                stage = "query"
                totals = router.run(available_now=available_now)
                outcome.error = None
                outcome.totals.add(totals)
                return
            except RegistryStopped:
                return  # stopped, as asked, before its query started
            except Exception as error:
                reason = failure_reason(error)
                outcome.error = reason
                self.fleet_metrics.failures.labels(topic, stage).inc()
                if self.restart is None:
                    with self._lock:
                        self._failure = self._failure or error
                    self.stop()
                    return
                # Spark's and bergstream's errors say what failed in their message; others are bugs.
                expected = isinstance(error, BergstreamError | PySparkException) or bool(java_causes(error))
                if not self._driver_alive():
                    self._lost_driver = reason
                    log.error("the driver's Spark session is gone (%s): stopping every topic", reason)
                    self.stop()
                    return
                if self._stop.is_set() or available_now:
                    log.error(
                        "the router of topic %s failed (%s): %s", topic, stage, reason, exc_info=not expected
                    )
                    return
                failures = (
                    1 if time.monotonic() - started > self.restart.max_backoff_seconds else failures + 1
                )
                delay = self.restart.delay(failures)
                log.error(
                    "the router of topic %s failed (%s, attempt %d): %s; starting it again in %.0fs",
                    topic, stage, attempt, reason, delay, exc_info=not expected,
                )  # fmt: skip
                if self._stop.wait(delay):
                    return
                outcome.restarts += 1
                self.fleet_metrics.restarts.labels(topic).inc()
            finally:
                with self._lock:
                    self._routers.pop(topic, None)

    def _up(self, topic: str) -> float:
        """1 while the topic's query runs, 0 otherwise: `bergstream_router_topic_up`."""
        router = self._routers.get(topic)
        return 1.0 if router is not None and router.running else 0.0

    def _driver_alive(self) -> bool:
        """Whether the JVM still answers and its SparkContext runs: no topic can run once it does not."""
        try:
            context = self.spark.sparkContext._jsc
            return context is not None and not context.sc().isStopped()
        except Exception:
            return False

    def _attempts(self) -> Iterator[int]:
        attempt = 0
        while not self._stop.is_set():
            attempt += 1
            yield attempt
