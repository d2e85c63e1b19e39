"""The topics of one query, a worker each (router/topic): added when the query starts or when it meets a
topic first, archived, or dead-lettered whole while their settings do not load; their ids checked before
each batch; where each starts when the query's checkpoint holds no batch."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from bergstream.errors import BergstreamError, ConfigError, first_line
from bergstream.kafka_topics import topic_ids
from bergstream.router.config import RouterConfig
from bergstream.router.consumer_group import SharedKafka
from bergstream.router.driver.settings import DriverSettings
from bergstream.router.identity import TopicRecreated, refuse_another
from bergstream.router.metrics import RouterMetrics
from bergstream.router.topic import TopicWorker
from bergstream.router.topic.archived import ArchivedTopic
from bergstream.router.topic.dead_lettered import DeadLetteredTopic
from bergstream.schemas.schema_registry import RegistryStopped

log = logging.getLogger("bergstream.router.driver")


class Members:
    """The workers of the topics of query `settings`. `load(topic)` reads a topic's settings. `strict`
    (topics named one by one): a topic that cannot be archived stops the query at start instead of being
    dead-lettered whole."""

    def __init__(
        self,
        settings: DriverSettings,
        load: Callable[[str], RouterConfig],
        spark: SparkSession,
        metrics: RouterMetrics,
        stopping: threading.Event,
        kafka: SharedKafka,
        strict: bool,
        on_added: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.spark = spark
        self.metrics = metrics
        self.kafka = kafka
        self.strict = strict
        self.topics: dict[str, TopicWorker] = {}
        self._load = load
        self._stopping = stopping
        self._tables: dict[str, str] = {}  # table name: the topic archived into it
        self._adding = threading.Lock()
        self._on_added = on_added

    def add(self, topic: str) -> TopicWorker:
        """The topic's worker, its tables made: archived, or dead-lettered whole."""
        added: TopicWorker
        try:
            config = self._load(topic)
            with self._adding:
                owner = self._tables.setdefault(config.settings.table, topic)
            if owner != topic:
                raise ConfigError(
                    f"table {config.settings.table} already archives topic {owner}; give {topic} its own"
                )
            committer = self.kafka.committer(topic, config.settings.consumer_group)
            archived = ArchivedTopic(config, self.spark, self.metrics, self._stopping, committer)
            archived.identify(self.spark, self.settings.checkpoint_location)
            added = archived
        except (TopicRecreated, RegistryStopped):
            raise  # its records belong to no table yet: the query stops, saying what to do
        except (ConfigError, BergstreamError) as error:
            if self.strict:
                raise
            self.metrics.topic_failures.labels(topic, "settings").inc()
            committer = self.kafka.committer(topic, f"bergstream-router.{topic}")
            added = DeadLetteredTopic(
                topic, first_line(error), self.settings, self.spark, self.metrics, self._stopping, committer
            )
        self.topics[topic] = added
        if self._on_added is not None:
            self._on_added(topic)
        return added

    def for_batch(self, topic: str, query: StreamingQuery) -> TopicWorker:
        """The topic's worker, added when the query meets it first; a topic dead-lettered whole has its
        settings read again once in a while."""
        worker = self.topics.get(topic)
        if worker is None:
            log.info("topic %s: met by the query of %s; archiving it", topic, self.settings.subscription)
            worker = self.add(topic)
            worker.started(query)
        elif worker.settings_due():
            again = self.add(topic)
            if again.archived:
                log.info("topic %s: its settings load now; archiving it", topic)
                again.totals.add(worker.totals)
                self.metrics.topic_restarts.labels(topic).inc()
            again.started(query)
            worker = again
        return worker

    def archived_settings(self) -> list[RouterConfig]:
        """The settings of the topics archived (not dead-lettered whole), those met later included."""
        workers = list(self.topics.values())
        return [settings for worker in workers if (settings := worker.archive_settings) is not None]

    def check_ids(self, topics: list[str], batch_id: int) -> None:
        """Stop before batch `batch_id` is written when one of `topics` is no longer the topic it was when
        the query met it (deleted and created again): one request for all of them."""
        known = {topic: topic_id for topic in topics if (topic_id := self.topics[topic].topic_id)}
        if not known:
            return
        try:
            current_ids = topic_ids(self.kafka.admin, sorted(known))
        except Exception as error:  # Kafka out for a moment: Spark's reader waits it out, or fails
            log.warning("batch %d is written without checking its topics' ids: %s", batch_id, error)
            return
        for topic, current in current_ids.items():
            where = f"the router, which met it and was about to write batch {batch_id},"
            refuse_another(topic, current, known[topic], where)

    def resume_offsets(self) -> dict[str, dict[int, int]] | None:
        """Per topic and partition, where a query without checkpoint starts: where the topic's tables end;
        None when no table records a position (the settings' startingOffsets hold)."""
        resumed = {topic: worker.resume(self.spark) for topic, worker in self.topics.items()}
        if all(offsets is None for offsets in resumed.values()):
            return None
        # Spark takes exact offsets only for every partition of every topic: the others start where the
        # settings say, by Spark's numbers for earliest (-2) and latest (-1).
        fallback = -1 if self.settings.kafka.get("startingOffsets", "latest") == "latest" else -2
        starting = {}
        for topic, offsets in resumed.items():
            if offsets is None:
                offsets = dict.fromkeys(self.topics[topic].kafka.partitions(), fallback)
            starting[topic] = offsets
        return starting
