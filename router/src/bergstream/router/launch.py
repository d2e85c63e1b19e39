"""`bergstream router run`: the routers of one driver, from their settings to their outcomes.

One topic or many, the same way: the settings of the topics loaded and checked before Spark takes its time
to start (the catalog answers, the router's user may read its topic and commit its group), the metrics
served, one SparkSession, and a `Fleet` running a query per topic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import SparkSession

from bergstream.router.config import RouterConfig
from bergstream.router.consumer_group import require_access
from bergstream.router.fleet import (
    Fleet,
    RestartSettings,
    TopicOutcome,
    check_shared_driver,
    driver_settings,
    fleet_app_name,
    fleet_spark_conf,
)
from bergstream.router.metrics import RouterMetrics
from bergstream.router.pattern import PatternConfig, PatternRouter, RejectedTopic
from bergstream.spark import build_spark_session

log = logging.getLogger("bergstream.router.launch")
# A query of many topics reads many partitions each batch: Spark's pool of Kafka consumers (64 by default)
# would close and open consumers every batch.
PATTERN_SPARK_CONF = {"spark.kafka.consumer.cache.capacity": "4096"}
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
    # Every topic of a folder (--all): a topic whose settings do not load is left to its restarts while the
    # others start. Otherwise each topic must load, pass its checks and share the driver's settings.
    every_topic: bool = False
    # None: no topic is started again; the first failure ends the driver, with its error.
    restart: RestartSettings | None = None
    # Over the first topic's metrics_port.
    metrics_port: int | None = None
    group: str | None = None


def prepare(config: RouterConfig) -> None:
    """Refuse a topic that Kafka does not let the router read and commit for."""
    require_access(config.topic, config.consumer_group, config.kafka_client_config())


def launch(request: Launch, spark: SparkSession | None = None) -> list[TopicOutcome]:
    """Run the topics until stopped (or, with available_now, until each archived what it holds).

    `spark`: a session of the caller's to run on, left open; otherwise the driver's own, built from the
    first topic's settings and stopped at the end."""
    topics = request.topics
    loaded = driver_settings(topics, request.load, strict=not request.every_topic)
    driver = loaded[0]
    # A catalog that does not answer, a refused login, an untrusted certificate or a missing ACL is told
    # before Spark starts.
    driver.catalog.check_reachable()
    if not request.every_topic:
        for config in loaded:
            prepare(config)

    def load_checked(topic: str) -> RouterConfig:
        config = request.load(topic)
        check_shared_driver(config, driver)
        return config

    metrics = RouterMetrics(", ".join(topics))
    port = request.metrics_port if request.metrics_port is not None else driver.metrics_port
    if port is not None:
        bound = metrics.serve(port, driver.metrics_host)
        many = f" for {len(topics)} topics" if len(topics) > 1 else ""
        log.info("metrics on http://%s:%d/metrics%s", driver.metrics_host, bound, many)
    session = spark or build_spark_session(
        driver.catalog, master=driver.spark.master, app_name=fleet_app_name(topics, request.group),
        conf={**SPARK_PROMETHEUS_CONF,
              **(fleet_spark_conf(driver.spark.conf) if len(topics) > 1 else driver.spark.conf)},
    )  # fmt: skip
    try:
        # Topics that are started again are checked again: their access may have changed meanwhile.
        again = prepare if request.restart is not None else None
        fleet = Fleet(topics, load_checked, session, metrics, request.restart, driver.catalog, again)
        return fleet.run(request.available_now)
    finally:
        if spark is None:
            session.stop()


def launch_pattern(
    config: PatternConfig,
    load: Callable[[str], RouterConfig],
    available_now: bool = False,
    spark: SparkSession | None = None,
) -> list[TopicOutcome]:
    """Run the query of every topic `config.pattern` matches until stopped (or, with available_now, until
    it archived what they hold). A topic dead-lettered whole is reported as failed, with why."""
    config.catalog.check_reachable()
    metrics = RouterMetrics(config.pattern)
    if config.metrics_port is not None:
        bound = metrics.serve(config.metrics_port, config.metrics_host)
        log.info("metrics on http://%s:%d/metrics for the topics of %r", config.metrics_host, bound,
                 config.pattern)  # fmt: skip
    session = spark or build_spark_session(
        config.catalog, master=config.spark.master, app_name=f"bergstream-router-{config.name}",
        conf={**SPARK_PROMETHEUS_CONF, **PATTERN_SPARK_CONF, **config.spark.conf},
    )  # fmt: skip
    try:
        router = PatternRouter(config, load, session, metrics)
        totals = router.run(available_now)
        outcomes = []
        for topic, archive in sorted(router.topics.items()):
            error = f"dead-lettered whole: {archive.reason}" if isinstance(archive, RejectedTopic) else None
            outcomes.append(TopicOutcome(topic, totals[topic], error=error))
        return outcomes
    finally:
        if spark is None:
            session.stop()
