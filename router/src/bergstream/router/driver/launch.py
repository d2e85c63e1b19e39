"""`bergstream router run`: a driver's topics, from their settings to their outcomes.

The settings of the topics loaded and checked before Spark takes its time to start (the catalog answers,
the router's user may read each named topic and commit its group), the metrics served, one SparkSession,
and a `Driver` running the topics' queries: one for `--topic T`, one per set of query-level settings for
several topics, `--all` and `--pattern`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from bergstream.router.accounting import RouterTotals
from bergstream.router.config import QuerySettings, RouterConfig
from bergstream.router.consumer_group import require_access
from bergstream.router.driver.named import (
    RestartSettings,
    check_shared_driver,
    driver_app_name,
    driver_spark_conf,
    group_queries,
    load_topics,
)
from bergstream.router.driver.run import Driver, TopicOutcome
from bergstream.router.driver.settings import DriverSettings, named_topics_settings
from bergstream.router.metrics import RouterMetrics
from bergstream.spark import build_spark_session

log = logging.getLogger("bergstream.router.driver")
# A query of many topics reads many partitions each batch: Spark's pool of Kafka consumers (64 by default)
# would close and open consumers every batch.
MANY_TOPICS_SPARK_CONF = {"spark.kafka.consumer.cache.capacity": "4096"}
# A driver of many topics allocates fast and keeps little: G1 grows its heap to the limit under that rate
# (650 MiB live of 2 GiB committed at 100 topics) and keeps it. Told to keep 10 to 30 % of it free after a
# collection, it gives the rest back: 1,630 against 2,333 MiB resident at 100 topics, the CPU spent outside
# the JIT no higher (bench/README.md, "The heap").
MANY_TOPICS_JAVA_OPTIONS = "-XX:MaxHeapFreeRatio=30 -XX:MinHeapFreeRatio=10"
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def many_topics_conf(conf: dict[str, str]) -> dict[str, str]:
    """The Spark settings of a driver of many topics, `conf` (its topics' `spark.conf`) over them; Java
    options given there come after the driver's own, so that theirs win."""
    options = " ".join(part for part in (MANY_TOPICS_JAVA_OPTIONS, conf.get(DRIVER_JAVA_OPTIONS, "")) if part)
    return {**MANY_TOPICS_SPARK_CONF, **conf, DRIVER_JAVA_OPTIONS: options}


# Spark's own metrics for Prometheus, served by the driver's UI (port 4040, or spark.ui.port) beside the
# router's: /metrics/prometheus holds the driver's (JVM, scheduler, block manager, and each streaming query's
# input and processing rates, latency and event-time watermark), /metrics/executors/prometheus every
# executor's. The namespace keeps their names the same from one run to the next, instead of Spark's default,
# the application's id. A router's --conf or spark.conf can turn any of them off.
SPARK_PROMETHEUS_CONF = {
    "spark.ui.prometheus.enabled": "true",
    "spark.metrics.conf.*.sink.prometheusServlet.class": "org.apache.spark.metrics.sink.PrometheusServlet",
    "spark.metrics.conf.*.sink.prometheusServlet.path": "/metrics/prometheus",
    "spark.metrics.namespace": "bergstream_router",
    "spark.sql.streaming.metricsEnabled": "true",
}


@dataclass(frozen=True)
class Launch:
    """What one driver runs. `load(topic)` reads and validates a topic's settings."""

    topics: list[str]
    load: Callable[[str], RouterConfig]
    available_now: bool = False
    # Every topic of a folder (--all): a topic whose settings do not load is dead-lettered whole until they
    # do while the others start. Otherwise each topic must load, pass its checks and share the driver's
    # settings.
    every_topic: bool = False
    # None: no query is started again; the first failure ends the driver, with its error.
    restart: RestartSettings | None = None
    # Over the first topic's metrics_port.
    metrics_port: int | None = None
    # The name of the driver and of its query (--group; `all` for --all).
    group: str | None = None
    # The checkpoint of the query of several topics (a defaults file's checkpoint_location); unset, beside
    # the first topic's.
    checkpoint: str | None = None


def prepare(config: RouterConfig) -> None:
    """Refuse a topic that Kafka does not let the router read and commit for."""
    require_access(config.settings.topic, config.settings.consumer_group, config.query.kafka_client_config())


def launch(request: Launch, spark: SparkSession | None = None) -> list[TopicOutcome]:
    """Run the named topics until stopped (or, with available_now, until each archived what it holds).

    `spark`: a session of the caller's to run on, left open; otherwise the driver's own, built from the
    first topic's settings and stopped at the end."""
    topics = request.topics
    strict = not request.every_topic
    loaded = load_topics(topics, request.load, strict)
    first = loaded[0]
    driver = first.query
    # A catalog that does not answer, a refused login, an untrusted certificate or a missing ACL is told
    # before Spark starts.
    driver.catalog.check_reachable()
    if strict:
        for config in loaded:
            prepare(config)
    queries = group_queries(topics, loaded, request.group, request.metrics_port, request.checkpoint)
    owner = {topic: query for query in queries for topic in query.topics or ()}

    def load_checked(topic: str) -> RouterConfig:
        config = request.load(topic)
        check_shared_driver(config, first)
        # A topic runs with its query's settings: its commits, ids and floors are kept beside the query's
        # checkpoint.
        return config.in_query(owner.get(topic, queries[0]))

    conf = driver.spark.conf if len(topics) == 1 else many_topics_conf(driver_spark_conf(driver.spark.conf))
    label = ", ".join(topics)
    app_name = driver_app_name(topics, request.group)
    # Queries that are started again check their topics' access again: it may have changed meanwhile.
    again = prepare if request.restart is not None else None
    return run_queries(queries, load_checked, driver, spark, request.restart, request.available_now,
                       label=label, app_name=app_name, conf=conf, strict=strict, again=again)  # fmt: skip


def run_queries(
    queries: list[DriverSettings],
    load: Callable[[str], RouterConfig],
    driver: QuerySettings,
    spark: SparkSession | None,
    restart: RestartSettings | None,
    available_now: bool,
    *,
    label: str,
    app_name: str,
    conf: dict[str, Any],
    strict: bool,
    again: Callable[[RouterConfig], None] | None = None,
) -> list[TopicOutcome]:
    """The one way a driver runs, whatever named its topics: its metrics served (`label` names what they
    are of), its SparkSession built from `driver`'s settings with `conf` (unless `spark`, the caller's, left
    open), and `queries` run by a `Driver` under the `restart` policy until they end (with `available_now`,
    once they archived what they read)."""
    metrics = RouterMetrics(label)
    port = queries[0].metrics_port
    if port is not None:
        bound = metrics.serve(port, driver.metrics_host)
        log.info("metrics on http://%s:%d/metrics for %s", driver.metrics_host, bound, label)
    try:
        session = spark or build_spark_session(
            driver.catalog, master=driver.spark.master, app_name=app_name,
            conf={**SPARK_PROMETHEUS_CONF, **conf},
        )  # fmt: skip
        try:
            return Driver(queries, load, session, metrics, restart, strict, again).run(available_now)
        finally:
            if spark is None:
                session.stop()
    finally:
        metrics.close()


def launch_pattern(
    settings: DriverSettings,
    load: Callable[[str], RouterConfig],
    available_now: bool = False,
    spark: SparkSession | None = None,
    queries: list[DriverSettings] | None = None,
    restart: RestartSettings | None = None,
) -> list[TopicOutcome]:
    """Run the query of every topic `settings.pattern` matches until stopped (or, with available_now, until
    it archived what they hold); `queries` (settings.pattern_queries) when some topics run in queries of
    their own, each started again alone after a failure with `restart` (as under `--all`). A topic
    dead-lettered whole is reported as failed, with why."""
    settings.catalog.check_reachable()
    conf = many_topics_conf(settings.spark.conf)
    app_name = f"bergstream-router-{settings.name}"
    label = settings.pattern or settings.name
    return run_queries(queries or [settings], load, settings, spark, restart, available_now, label=label,
                       app_name=app_name, conf=conf, strict=False)  # fmt: skip


def archive_available_now(spark: SparkSession, config: RouterConfig) -> RouterTotals:
    """Archive what the topic holds now and return: the query of `router run --topic T --available-now`."""
    topic = config.settings.topic
    settings = named_topics_settings(topic, [config], None)
    driver = Driver([settings], lambda _: config, spark, RouterMetrics(topic), None, strict=True)
    (outcome,) = driver.run(available_now=True)
    return outcome.totals
