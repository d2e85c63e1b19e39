"""The named topics of a driver (`router run --topic`, repeated, `--group`, `--all`): their settings loaded
and checked, and grouped into queries by their query-level settings."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

from pydantic import Field

from bergstream.errors import ConfigError
from bergstream.router.config import RouterConfig
from bergstream.router.driver.settings import (
    DriverSettings,
    group_name,
    named_topics_settings,
    query_key,
    sibling,
)
from bergstream.router.retry import Backoff

log = logging.getLogger("bergstream.router.driver")
# A driver of many topics schedules its queries' jobs FAIR unless its settings say otherwise.
FAIR_CONF = {"spark.scheduler.mode": "FAIR"}


class RestartSettings(Backoff):
    """How a failed query of several topics is started again: after a backoff that doubles on each failure in
    a row, capped. A query that ran for longer than the cap before it failed starts again from the first
    backoff."""

    initial_backoff_seconds: float = Field(default=5.0, gt=0)
    max_backoff_seconds: float = Field(default=300.0, gt=0)


class SharedDriverMismatch(ConfigError):
    """A topic's settings ask for another Spark session than the driver's."""


def check_shared_driver(config: RouterConfig, driver: RouterConfig) -> None:
    """The topics of one driver share its SparkSession: the same catalog and the same `spark` block."""
    topic = config.settings.topic
    for key in ("catalog", "spark"):
        if getattr(config.query, key) != getattr(driver.query, key):
            raise SharedDriverMismatch(
                f"topic {topic}: its {key} settings differ from those of topic {driver.settings.topic}, "
                f"whose settings started this driver; the topics of one driver share their catalog and "
                f"spark settings: make them the same, or run {topic} in a driver of its own"
            )


def topics_in(directory: Path) -> list[str]:
    """The topics with a settings file (<topic>.yaml) in `directory`, by name."""
    topics = sorted(path.stem for path in directory.glob("*.yaml"))
    if not topics:
        raise ConfigError(f"--all: {directory} holds no topic settings (<topic>.yaml)")
    return topics


def driver_app_name(topics: list[str], group: str | None = None) -> str:
    """The driver's Spark application: named after its group (as `bergstream deploy` names it), or after
    its topic when it runs one."""
    if group is None and len(topics) == 1:
        return f"bergstream-router-{topics[0]}"
    return f"bergstream-routers-{group if group is not None else f'{len(topics)}-topics'}"


def driver_spark_conf(conf: dict[str, str]) -> dict[str, str]:
    """A driver of many topics schedules FAIR unless its settings say otherwise."""
    return {**FAIR_CONF, **conf}


def load_topics(topics: list[str], load: Callable[[str], RouterConfig], strict: bool) -> list[RouterConfig]:
    """The settings of the topics that load; the first one's catalog and spark block start the driver.

    `strict` (topics named one by one): every topic must load and share the driver's catalog and spark
    settings, or the driver refuses to start. Otherwise (`--all`) a topic whose settings do not load is
    reported and dead-lettered whole in the driver's first query until they do: the others start
    regardless."""
    if len(set(topics)) != len(topics):
        raise ConfigError(f"a topic is named twice: {', '.join(topics)}")
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
        log.error("%s; that topic is dead-lettered whole until its settings load", problem)
    for config in loaded[1:]:
        check_shared_driver(config, loaded[0])
    return loaded


def group_queries(
    topics: list[str],
    loaded: list[RouterConfig],
    name: str | None,
    metrics_port: int | None,
    checkpoint: str | None = None,
) -> list[DriverSettings]:
    """The queries of the named `topics`: one per set of equal query-level settings, the first holding the
    topics whose settings did not load. One set: the query is named `name` (else from the topics); several:
    each after `name` and its trigger and rate limit."""
    groups: dict[str, list[RouterConfig]] = {}
    for config in loaded:
        groups.setdefault(query_key(config.query), []).append(config)
    base = group_name(topics, name)
    failed = [topic for topic in topics if topic not in {config.settings.topic for config in loaded}]
    queries = []
    for index, configs in enumerate(groups.values()):
        first = configs[0]
        named = base
        if len(groups) > 1:
            rate = first.query.max_offsets_per_trigger or "unlimited"
            digest = hashlib.sha256(query_key(first.query).encode()).hexdigest()[:6]
            named = f"{base}-{first.query.trigger_interval.replace(' ', '')}-{rate}-{digest}"
        where = checkpoint
        if where is not None and len(groups) > 1:
            where = sibling(where, named)
        settings = named_topics_settings(named, configs, metrics_port, where)
        if index == 0 and failed:
            settings = settings.model_copy(update={"topics": (*settings.topics, *failed)})  # type: ignore[misc]
        queries.append(settings)
    if len(queries) > 1:
        log.info("%d topics in %d queries, one per set of query-level settings: %s", len(topics),
                 len(queries),
                 "; ".join(f"{q.name}: {', '.join(q.topics or ())}" for q in queries))  # fmt: skip
    return queries
