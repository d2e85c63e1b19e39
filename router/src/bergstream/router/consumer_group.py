"""The router's own Kafka client: committing archived offsets to its consumer group, reading watermarks."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from bergstream.errors import ConfigError
from bergstream.kafka_settings import (
    ClientErrors,
    KafkaUnreachable,
    cluster_metadata,
    failure,
    not_authorized,
)
from bergstream.kafka_source import READ_COMMITTED
from bergstream.kafka_topics import topic_ids

log = logging.getLogger(__name__)
GROUP_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class LogBounds:
    """A topic's partitions as the router reads them: where each log starts, where it ends for the router
    (the last stable offset under read_committed), and, under read_committed, the high watermark past any
    open transaction (None: not read)."""

    start: dict[int, int]
    end: dict[int, int]
    high: dict[int, int] | None = None


class GroupCommitter:
    """Commits to `bergstream-router.<topic>` so that kafka-consumer-groups, Burrow and lag exporters see the
    router. Spark's Kafka source tracks its own position in the checkpoint; this group is for the world.

    `client_config` is librdkafka's: RouterConfig.kafka_client_config() translates the Java client's names."""

    def __init__(
        self, topic: str, group: str, client_config: dict[str, str], isolation_level: str = READ_COMMITTED
    ) -> None:
        self.topic = topic
        self.group = group
        self.isolation_level = isolation_level
        self._errors = ClientErrors()
        settings = {**client_config, **self._errors.settings()}
        try:
            self._consumer = Consumer(
                {
                    **settings,
                    "group.id": group,
                    # Its watermarks are what the router can read: the last stable offset under
                    # read_committed, where the lag is measured to.
                    "isolation.level": isolation_level,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    # It reads one record now and then, for its timestamp: no need to prefetch more. A fetch
                    # still brings a partition's first record batch whole, however small this is.
                    "queued.max.messages.kbytes": 1024,
                    "fetch.message.max.bytes": 1024,
                }
            )
            self._admin = AdminClient(settings)
        except KafkaException as error:
            raise ConfigError(
                f"the kafka.* settings of {topic} do not suit the router's own Kafka client, which commits "
                f"its consumer group (librdkafka): {error.args[0].str()}"
            ) from error

    def commit(self, offsets: dict[int, int]) -> bool:
        """Commit `offsets`; False when Kafka refused, so that the caller tries again later."""
        if not offsets:
            return True
        partitions = [
            TopicPartition(self.topic, partition, offset) for partition, offset in sorted(offsets.items())
        ]
        try:
            self._consumer.commit(offsets=partitions, asynchronous=False)
        except KafkaException as error:
            # The archive is already committed; only the group's view of the router lags behind.
            log.warning("committing offsets of %s to group %s failed: %s", self.topic, self.group, error)
            return False
        return True

    def committed(self) -> dict[int, int]:
        partitions = [TopicPartition(self.topic, p) for p in self.partitions()]
        committed = self._consumer.committed(partitions, timeout=10)
        return {tp.partition: tp.offset for tp in committed if tp.offset >= 0}

    def require_topic(self, group: bool = True) -> None:
        """Refuse to start when Kafka cannot be reached, has no such topic, or does not let the router's
        user read the topic and (with `group`) commit its group."""
        try:
            metadata = cluster_metadata(self._consumer, self._errors, self.topic)
        except KafkaUnreachable as error:
            raise ConfigError(f"cannot reach Kafka for topic {self.topic}: {error}") from error
        found = metadata.topics.get(self.topic)
        if found is None or (
            found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        ):
            raise ConfigError(
                f"Kafka has no topic {self.topic!r}; create it, or check kafka.bootstrap.servers"
            )
        if found.error is not None:
            raise ConfigError(
                f"Kafka refuses topic {self.topic} to the router: {failure(found.error)}; "
                f"its user needs READ on topic {self.topic}"
            )
        if group:
            self._require_group()

    def _require_group(self) -> None:
        """The group's committed offsets can be read. A group the user may not use makes the request time
        out; why comes as an error on the consumer's queue. (The AdminClient's ListConsumerGroupOffsets
        would say it at once, but librdkafka 2.16 crashes when the coordinator answers it with an error,
        as a new cluster's does while it loads its offsets topic.)"""
        deadline = time.monotonic() + GROUP_TIMEOUT_SECONDS
        while True:
            try:
                self._consumer.committed([TopicPartition(self.topic, 0)], timeout=2)
                return
            except KafkaException as error:
                queued = self._consumer.poll(0)
                refused = queued.error() if queued is not None else None
                if refused is not None and not_authorized(refused):
                    raise ConfigError(
                        f"Kafka refuses the router's consumer group {self.group}: {failure(refused)}; "
                        f"its user needs READ on group {self.group}"
                    ) from error
                if time.monotonic() >= deadline:
                    raise ConfigError(
                        f"cannot read the offsets of consumer group {self.group}: "
                        f"{self._errors.explain(self._consumer, error.args[0])}"
                    ) from error

    def topic_id(self) -> str | None:
        """Kafka's id of the topic now (None from a broker that gives none)."""
        try:
            return topic_ids(self._admin, [self.topic])[self.topic]
        except KafkaException as error:
            raise ConfigError(
                f"cannot ask Kafka for the id of topic {self.topic}: {failure(error.args[0])}"
            ) from error

    def partitions(self) -> list[int]:
        metadata = self._consumer.list_topics(self.topic, timeout=10).topics[self.topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        return sorted(metadata.partitions)

    def watermarks(self, partitions: list[int] | None = None) -> dict[int, tuple[int, int]]:
        """{partition: (oldest offset Kafka still has, next offset to be written)}."""
        # librdkafka's errors and log lines wait to be served by a poll; the lag is read every few seconds.
        self._consumer.poll(0)
        result = {}
        for partition in partitions if partitions is not None else self.partitions():
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=10, cached=False
            )
            result[partition] = (low, high)
        return result

    def high_watermarks(self, partitions: list[int]) -> dict[int, int]:
        """{partition: the next offset to be written}, past any open transaction: what a reader of uncommitted
        records can read up to. One request for every partition."""
        from confluent_kafka import IsolationLevel
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        requests = {TopicPartition(self.topic, p): latest for p in partitions}
        answers = self._admin.list_offsets(
            requests, isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=10
        )
        return {tp.partition: future.result(10).offset for tp, future in answers.items()}

    def record_timestamps(self, positions: dict[int, int], timeout: float = 5.0) -> dict[int, float]:
        """{partition: Kafka timestamp in seconds} of the record at each {partition: offset} (or the first
        one after it); a partition whose record does not come within `timeout` is left out.

        A partition is paused once its record is found: the records fetched after it are dropped instead of
        being served one by one, so a deep backlog costs a fetch per partition, not a poll per record."""
        found: dict[int, float] = {}
        if not positions:
            return found
        self._consumer.assign([TopicPartition(self.topic, p, offset) for p, offset in positions.items()])
        deadline = time.monotonic() + timeout
        try:
            while len(found) < len(positions) and (left := deadline - time.monotonic()) > 0:
                message = self._consumer.poll(timeout=min(left, 0.5))
                if message is None or message.error() is not None:
                    continue
                kind, milliseconds = message.timestamp()
                partition = message.partition()
                if partition is None or partition in found or kind == TIMESTAMP_NOT_AVAILABLE:
                    continue
                found[partition] = milliseconds / 1000
                self._consumer.pause([TopicPartition(self.topic, partition)])
        finally:
            # A pause outlives the assignment in librdkafka: the next assignment must find them resumed.
            self._consumer.resume([TopicPartition(self.topic, partition) for partition in found])
            self._consumer.unassign()
        return found

    def close(self) -> None:
        self._consumer.close()


def require_access(topic: str, group: str, client_config: dict[str, str]) -> None:
    """Refuse to start unless the router's user may read `topic` and commit `group` (GroupCommitter)."""
    committer = GroupCommitter(topic, group, client_config)
    try:
        committer.require_topic()
    finally:
        committer.close()


class SharedKafka:
    """The Kafka clients of a router of many topics in one query (`router run --pattern`): one consumer
    reads every topic's metadata, watermarks and record timestamps, and one admin client commits each
    topic's consumer group, `bergstream-router.<topic>`, as a topic's own router would. A client per topic
    would cost each topic its threads and connections to every broker."""

    def __init__(
        self, name: str, client_config: dict[str, str], isolation_level: str = READ_COMMITTED
    ) -> None:
        self.name = name
        self.isolation_level = isolation_level
        self.errors = ClientErrors()
        settings = {**client_config, **self.errors.settings()}
        try:
            # Its own group is never committed: it only ever reads metadata and assigned partitions.
            self.consumer = Consumer(
                {
                    **settings,
                    "group.id": f"bergstream-router-pattern.{name}",
                    "isolation.level": isolation_level,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "queued.max.messages.kbytes": 1024,
                    "fetch.message.max.bytes": 1024,
                }
            )
            self.admin = AdminClient(settings)
        except KafkaException as error:
            raise ConfigError(
                f"the kafka.* settings of the router of {name} do not suit its own Kafka client, which "
                f"commits its topics' consumer groups (librdkafka): {error.args[0].str()}"
            ) from error

    def topics(self, pattern: re.Pattern[str]) -> list[str]:
        """The topics Kafka has now whose whole name `pattern` matches, by name."""
        try:
            metadata = cluster_metadata(self.consumer, self.errors, None)
        except KafkaUnreachable as error:
            raise ConfigError(f"cannot reach Kafka for the router of {self.name}: {error}") from error
        return sorted(topic for topic in metadata.topics if pattern.fullmatch(topic))

    def committer(self, topic: str, group: str) -> GroupCommitter:
        return SharedGroupCommitter(topic, group, self)

    def log_bounds(self, topics: list[str]) -> dict[str, LogBounds]:
        """Every partition's bounds of each of `topics` that Kafka has: one metadata request and a ListOffsets
        request per bound and broker for all of them, where a topic's own client asks a partition at a
        time. A topic whose partitions do not all answer is left out (its lag keeps its last values)."""
        from confluent_kafka import IsolationLevel
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        metadata = self.consumer.list_topics(timeout=10).topics
        partitions = [
            TopicPartition(topic, partition)
            for topic in topics
            if (found := metadata.get(topic)) is not None and found.error is None
            for partition in found.partitions
        ]
        if not partitions:
            return {}
        committed = self.isolation_level == READ_COMMITTED
        isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        asked = [(OffsetSpec.earliest(), isolation), (OffsetSpec.latest(), isolation)]  # type: ignore[no-untyped-call]
        if committed:
            asked.append((OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED))  # type: ignore[no-untyped-call]
        answers = [
            self.admin.list_offsets(dict.fromkeys(partitions, spec), isolation_level=at, request_timeout=10)
            for spec, at in asked
        ]
        bounds: list[dict[str, dict[int, int]]] = []
        failed: set[str] = set()
        for answer in answers:
            offsets: dict[str, dict[int, int]] = {}
            for asked_partition, future in answer.items():
                try:
                    offset = future.result(15).offset
                except KafkaException as error:
                    log.debug("the offsets of %s[%d]: %s", asked_partition.topic, asked_partition.partition,
                              error)  # fmt: skip
                    failed.add(asked_partition.topic)
                    continue
                offsets.setdefault(asked_partition.topic, {})[asked_partition.partition] = offset
            bounds.append(offsets)
        return {
            topic: LogBounds(bounds[0][topic], bounds[1][topic], bounds[2][topic] if committed else None)
            for topic in bounds[1]
            if topic not in failed
        }

    def close(self) -> None:
        self.consumer.close()


class SharedGroupCommitter(GroupCommitter):
    """A topic's `GroupCommitter` over the clients of a router of many topics (`SharedKafka`)."""

    def __init__(self, topic: str, group: str, shared: SharedKafka) -> None:
        self.topic = topic
        self.group = group
        self.isolation_level = shared.isolation_level
        self._errors = shared.errors
        self._consumer = shared.consumer
        self._admin = shared.admin

    def commit(self, offsets: dict[int, int]) -> bool:
        if not offsets:
            return True
        partitions = [TopicPartition(self.topic, p, offset) for p, offset in sorted(offsets.items())]
        request = ConsumerGroupTopicPartitions(self.group, partitions)
        try:
            self._admin.alter_consumer_group_offsets([request])[self.group].result(GROUP_TIMEOUT_SECONDS)
        except (KafkaException, TimeoutError) as error:
            log.warning("committing offsets of %s to group %s failed: %s", self.topic, self.group, error)
            return False
        return True

    def committed(self) -> dict[int, int]:
        partitions = [TopicPartition(self.topic, p) for p in self.partitions()]
        request = ConsumerGroupTopicPartitions(self.group, partitions)
        answer = self._admin.list_consumer_group_offsets([request])[self.group].result(GROUP_TIMEOUT_SECONDS)
        return {tp.partition: tp.offset for tp in answer.topic_partitions if tp.offset >= 0}

    def close(self) -> None:
        """The shared clients are closed by their owner."""
