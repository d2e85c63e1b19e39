"""The router's own Kafka client: committing archived offsets to its consumer group, reading watermarks."""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bergstream.errors import ConfigError

log = logging.getLogger(__name__)


class GroupCommitter:
    """Commits to `bergstream-router.<topic>` so that kafka-consumer-groups, Burrow and lag exporters see the
    router. Spark's Kafka source tracks its own position in the checkpoint; this group is for the world."""

    def __init__(self, topic: str, group: str, client_config: dict[str, str]) -> None:
        self.topic = topic
        self.group = group
        try:
            self._consumer = Consumer(
                {
                    **client_config,
                    "group.id": group,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                }
            )
        except KafkaException as error:
            raise ConfigError(
                f"the kafka.* settings of {topic} do not suit the router's own Kafka client, which commits "
                f"its consumer group (librdkafka): {error.args[0].str()}. Settings that only the Java "
                "client knows, such as kafka.sasl.jaas.config, need their librdkafka equivalents "
                "(kafka.sasl.username, kafka.sasl.password, ...)"
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

    def require_topic(self) -> None:
        """Refuse to start when Kafka cannot be reached or has no such topic."""
        try:
            topics = self._consumer.list_topics(timeout=15).topics
        except KafkaException as error:
            raise ConfigError(f"cannot reach Kafka for topic {self.topic}: {error.args[0].str()}") from error
        if self.topic not in topics:
            raise ConfigError(
                f"Kafka has no topic {self.topic!r}; create it, or check kafka.bootstrap.servers"
            )

    def partitions(self) -> list[int]:
        metadata = self._consumer.list_topics(self.topic, timeout=10).topics[self.topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        return sorted(metadata.partitions)

    def watermarks(self, partitions: list[int] | None = None) -> dict[int, tuple[int, int]]:
        """{partition: (oldest offset Kafka still has, next offset to be written)}."""
        result = {}
        for partition in partitions if partitions is not None else self.partitions():
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=10, cached=False
            )
            result[partition] = (low, high)
        return result

    def close(self) -> None:
        self._consumer.close()
