"""Kafka topics and records, for every producer of bergstream: the load generator and the replay."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
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


class DeliveryFailed(BergstreamError):
    """Records that did not reach their topic; `reason` says why in bergstream's words, `undelivered` counts
    them (0 when the producer failed before it could say how many)."""

    def __init__(self, reason: str, undelivered: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.undelivered = undelivered


# Every producer of bergstream: Java clients' key partitioning (murmur2), so that a key lands on the
# partition a Java producer would give it; batched and compressed. Settings of the caller override these.
PRODUCER_DEFAULTS: dict[str, Any] = {
    "partitioner": "murmur2_random",
    "linger.ms": 20,
    "compression.type": "lz4",
}
# And these override the caller's: a record is written once, and only once every replica has it.
PRODUCER_GUARANTEES: dict[str, Any] = {"enable.idempotence": True, "acks": "all"}


class RecordProducer:
    """bergstream's one Kafka producer, for the load generator and the replay: idempotent, counting what
    each partition acknowledged (and the lowest and highest offsets), keeping the failures as they come.

    `client_config` is librdkafka's, `bootstrap.servers` included."""

    def __init__(self, client_config: Mapping[str, Any]) -> None:
        self.errors = ClientErrors()
        self.delivered: Counter[int] = Counter()
        self.offsets: dict[int, tuple[int, int]] = {}
        # Errors are kept as they come: librdkafka may call back while it raises a fatal error of its own.
        self.failures: list[KafkaError] = []
        self._producer = Producer(
            {**PRODUCER_DEFAULTS, **client_config, **PRODUCER_GUARANTEES, **self.errors.settings()}
        )

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failures.append(error)
            return
        partition, offset = message.partition(), message.offset()
        assert partition is not None and offset is not None, "a delivered record has a partition and offset"
        self.delivered[partition] += 1
        low, high = self.offsets.get(partition, (offset, offset))
        self.offsets[partition] = (min(low, offset), max(high, offset))

    def send(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Any, timestamp_ms: int
    ) -> None:
        """Send one record; a timestamp of 0 lets the producer stamp the time of sending. Raises
        DeliveryFailed when the producer has failed for good (a user that may not write the topic)."""
        with self._fatal():
            while True:
                try:
                    self._producer.produce(
                        topic, value=value, key=key, headers=headers, timestamp=timestamp_ms,
                        on_delivery=self._on_delivery,
                    )  # fmt: skip
                    return
                except BufferError:
                    # The local queue is full: let librdkafka deliver, then try again.
                    self._producer.poll(0.1)

    def poll(self) -> None:
        with self._fatal():
            self._producer.poll(0)

    def flush(self, timeout_seconds: float) -> None:
        """Wait for every record sent to be acknowledged; DeliveryFailed when one was not."""
        with self._fatal():
            remaining = self._producer.flush(timeout_seconds)
        if self.failures or remaining:
            fallback = (
                self.failures[0]
                if self.failures
                else f"{remaining} records still undelivered after {timeout_seconds:g}s"
            )
            raise DeliveryFailed(
                self.errors.explain(self._producer, fallback), len(self.failures) + remaining
            )

    @contextmanager
    def _fatal(self) -> Iterator[None]:
        """The producer's fatal error as DeliveryFailed. confluent-kafka raises it from flush() and poll(),
        or, when a delivery callback runs after it was raised, as the cause of a SystemError, or as a
        SystemError with no cause at all (the fatal error then comes through the error callback)."""
        try:
            yield
        except (KafkaException, SystemError) as error:
            cause = error.__cause__ if isinstance(error, SystemError) else error
            if isinstance(cause, KafkaException):
                raise DeliveryFailed(failure(cause.args[0])) from error
            with suppress(KafkaException, SystemError):
                self._producer.poll(0)  # serves the error callback
            if self.errors.fatal is None and not self.failures:
                raise
            fallback = self.failures[0] if self.failures else "the producer failed"
            raise DeliveryFailed(self.errors.explain(self._producer, fallback), len(self.failures)) from error
