"""Kafka topics and records, for every producer of bergstream: the load generator and the replay."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bergstream.errors import BergstreamError


def ensure_topic(bootstrap_servers: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    try:
        existing = admin.list_topics(timeout=10).topics
    except KafkaException as error:
        raise BergstreamError(f"cannot reach Kafka at {bootstrap_servers}: {error}") from error
    if topic in existing:
        return
    future = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic]
    try:
        future.result(timeout=30)
    except TimeoutError as error:
        raise BergstreamError(f"creating topic {topic} on {bootstrap_servers} took over 30s") from error
    except KafkaException as error:
        if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise BergstreamError(f"cannot create topic {topic} on {bootstrap_servers}: {error}") from error


def send(
    producer: Producer,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: Any,
    timestamp_ms: int,
    callback: Any,
) -> None:
    """Send one record; a timestamp of 0 lets the producer stamp the time of sending."""
    while True:
        try:
            producer.produce(
                topic, value=value, key=key, headers=headers, timestamp=timestamp_ms, on_delivery=callback
            )
            return
        except BufferError:
            # The local queue is full: let librdkafka deliver, then try again.
            producer.poll(0.1)
