"""Kafka topics and records, for every producer of bergstream: the load generator and the replay."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bergstream.errors import BergstreamError
from bergstream.kafka_settings import ClientErrors, KafkaUnreachable, cluster_metadata, failure


def _admin_and_topics(client_config: Mapping[str, Any]) -> tuple[AdminClient, dict[str, Any]]:
    """An admin client and the cluster's topics. All topics, not one: asking for a missing topic may create
    it where auto-creation is on."""
    errors = ClientErrors()
    admin = AdminClient({**client_config, **errors.settings()})
    try:
        return admin, cluster_metadata(admin, errors).topics
    except KafkaUnreachable as error:
        raise BergstreamError(
            f"cannot reach Kafka at {client_config['bootstrap.servers']}: {error}"
        ) from error


def ensure_topic(client_config: Mapping[str, Any], topic: str, partitions: int) -> None:
    """Create `topic` unless it exists; `client_config` is librdkafka's, `bootstrap.servers` included."""
    bootstrap_servers = client_config["bootstrap.servers"]
    admin, existing = _admin_and_topics(client_config)
    if topic in existing:
        return
    # -1: as many copies as the cluster's default.replication.factor says.
    future = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=-1)])[topic]
    try:
        future.result(timeout=30)
    except TimeoutError as error:
        raise BergstreamError(f"creating topic {topic} on {bootstrap_servers} took over 30s") from error
    except KafkaException as error:
        if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise BergstreamError(
                f"cannot create topic {topic} on {bootstrap_servers}: {failure(error.args[0])}"
            ) from error


def topic_partitions(client_config: Mapping[str, Any], topic: str) -> int | None:
    """How many partitions `topic` has on the cluster; None when it is not there."""
    found = _admin_and_topics(client_config)[1].get(topic)
    return len(found.partitions) if found is not None and found.error is None else None


def fatal_error(error: BaseException) -> KafkaError | None:
    """The producer's fatal error that `error` reports, if it is one: a user that may write no topic cannot
    even start an idempotent producer. confluent-kafka raises it from flush() and poll(), or, when a delivery
    callback runs after it was raised, as the cause of a SystemError."""
    cause = error.__cause__ if isinstance(error, SystemError) else error
    return cause.args[0] if isinstance(cause, KafkaException) else None


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
