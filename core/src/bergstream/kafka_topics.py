"""Kafka topics and records, for every producer of bergstream (the load generator and the replay), and topics'
identities (their Kafka ids) for the router and the hand-over."""

from __future__ import annotations

import base64
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bergstream.errors import BergstreamError
from bergstream.kafka_settings import ClientErrors, KafkaUnreachable, cluster_metadata, failure

log = logging.getLogger("bergstream.kafka")

_DESCRIBE_SECONDS = 15
# The most a refresh of the brokers' metadata waits, after a description failed.
_METADATA_SECONDS = 5


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


def ensure_topic(
    client_config: Mapping[str, Any], topic: str, partitions: int, config: Mapping[str, str] | None = None
) -> None:
    """Create `topic` unless it exists, with topic `config` (`cleanup.policy`, ...); `client_config` is
    librdkafka's, `bootstrap.servers` included."""
    bootstrap_servers = client_config["bootstrap.servers"]
    admin, existing = _admin_and_topics(client_config)
    if topic in existing:
        return
    # -1: as many copies as the cluster's default.replication.factor says.
    new = NewTopic(topic, num_partitions=partitions, replication_factor=-1, config=dict(config or {}))
    future = admin.create_topics([new])[topic]
    try:
        future.result(timeout=30)
    except TimeoutError as error:
        raise BergstreamError(f"creating topic {topic} on {bootstrap_servers} took over 30s") from error
    except KafkaException as error:
        if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise BergstreamError(
                f"cannot create topic {topic} on {bootstrap_servers}: {failure(error.args[0])}"
            ) from error
    # The controller has the topic; a broker's metadata may not list it yet, and a client that asks it right
    # away is told there is no such topic. Returned once the brokers list it with a leader for each partition.
    deadline = time.monotonic() + 30
    while not _listed(admin, topic):
        if time.monotonic() > deadline:
            raise BergstreamError(f"topic {topic} created on {bootstrap_servers}, but not listed after 30s")
        time.sleep(0.1)


def _listed(admin: AdminClient, topic: str) -> bool:
    found = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
    return (
        found is not None and found.error is None and bool(found.partitions)
        and all(partition.leader >= 0 for partition in found.partitions.values())
    )  # fmt: skip


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

    `client_config` is librdkafka's, `bootstrap.servers` included; with a `transactional.id`, records are
    sent in transactions (`init_transactions`, then `begin_transaction` and `commit_transaction` or
    `abort_transaction`), and the counts are those of the committed transactions."""

    def __init__(self, client_config: Mapping[str, Any]) -> None:
        self.errors = ClientErrors()
        self.delivered: Counter[int] = Counter()
        self.offsets: dict[int, tuple[int, int]] = {}
        # Errors are kept as they come: librdkafka may call back while it raises a fatal error of its own.
        self.failures: list[KafkaError] = []
        self._producer = Producer(
            {**PRODUCER_DEFAULTS, **client_config, **PRODUCER_GUARANTEES, **self.errors.settings()}
        )
        self._committed: tuple[Counter[int], dict[int, tuple[int, int]]] = (Counter(), {})

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failures.append(error)
            return
        partition, offset = message.partition(), message.offset()
        assert partition is not None and offset is not None, "a delivered record has a partition and offset"
        self.delivered[partition] += 1
        low, high = self.offsets.get(partition, (offset, offset))
        self.offsets[partition] = (min(low, offset), max(high, offset))

    def _on_uncounted_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failures.append(error)

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Any,
        timestamp_ms: int,
        counted: bool = True,
    ) -> None:
        """Send one record; a timestamp of 0 lets the producer stamp the time of sending; a record not
        `counted` (bookkeeping beside the records) is left out of `delivered` and `offsets`. Raises
        DeliveryFailed when the producer has failed for good (a user that may not write the topic)."""
        with self._fatal():
            while True:
                try:
                    self._producer.produce(
                        topic, value=value, key=key, headers=headers, timestamp=timestamp_ms,
                        on_delivery=self._on_delivery if counted else self._on_uncounted_delivery,
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
            undelivered = f"{remaining} records still undelivered after {timeout_seconds:g}s"
            fallback = self.failures[0] if self.failures else undelivered
            raise DeliveryFailed(self._why(fallback), len(self.failures) + remaining)

    def _why(self, fallback: KafkaError | str) -> str:
        """Why records failed: the broker's refusal says more than the local failures that follow it (in a
        transaction, the records still queued then fail as purged)."""
        refused = [failure for failure in self.failures if failure.code() >= 0]
        return self.errors.explain(self._producer, refused[0] if refused else fallback)

    def init_transactions(self, timeout_seconds: float) -> None:
        """Make this producer the only one of its `transactional.id`: an earlier one (a process killed in a
        transaction) is fenced, and its open transaction aborted, so that no read_committed consumer ever
        sees its records."""
        self._transactional(lambda: self._producer.init_transactions(timeout_seconds), timeout_seconds)

    def begin_transaction(self) -> None:
        self._committed = (Counter(self.delivered), dict(self.offsets))
        self._transactional(self._producer.begin_transaction, 0)

    def commit_transaction(self, timeout_seconds: float) -> None:
        """Deliver every record of the transaction and commit it; DeliveryFailed when one was not delivered
        or the commit failed, and the transaction is then to be aborted."""
        self.flush(timeout_seconds)
        self._transactional(lambda: self._producer.commit_transaction(timeout_seconds), timeout_seconds)

    def abort_transaction(self, timeout_seconds: float) -> None:
        """Abort the open transaction where there is one to abort: a fenced producer has none. The counts go
        back to those of the last commit."""
        self.delivered, self.offsets = self._committed
        with suppress(KafkaException, SystemError):
            self._producer.abort_transaction(timeout_seconds)
        self.failures.clear()

    def _transactional(self, call: Callable[[], None], timeout_seconds: float) -> None:
        """A transaction call, tried again while librdkafka says it may succeed, up to `timeout_seconds`."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            try:
                with self._fatal():
                    call()
                return
            except DeliveryFailed as error:
                cause = error.__cause__
                retriable = isinstance(cause, KafkaException) and cause.args[0].retriable()
                if not retriable or time.monotonic() >= deadline:
                    raise

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
                if cause.args[0].code() == KafkaError._STATE:
                    # A transaction a refused record put in error refuses the records sent after it: the
                    # refusal, in its delivery report, says why.
                    with suppress(KafkaException, SystemError):
                        self._producer.poll(0)
                if cause.args[0].code() != KafkaError._STATE or not self.failures:
                    raise DeliveryFailed(failure(cause.args[0])) from error
                raise DeliveryFailed(self._why(self.failures[0]), len(self.failures)) from error
            with suppress(KafkaException, SystemError):
                self._producer.poll(0)  # serves the error callback
            if self.errors.fatal is None and not self.failures:
                raise
            fallback = self.failures[0] if self.failures else "the producer failed"
            raise DeliveryFailed(self.errors.explain(self._producer, fallback), len(self.failures)) from error


def last_committed_value(
    client_config: Mapping[str, Any], topic: str, key: bytes, group_id: str, timeout_seconds: float
) -> bytes | None:
    """The value of the newest committed record of `key` in the one-partition `topic` (None when there is
    none, or the newest is a tombstone), read to the end as a read_committed consumer sees it. The end is
    the high watermark when reading starts: an open transaction of another producer before it holds the
    reading back until it ends, which takes `timeout_seconds` at most."""
    errors = ClientErrors()
    consumer = Consumer(
        {**client_config, "group.id": group_id, "isolation.level": "read_committed",
         "enable.auto.commit": False, "enable.partition.eof": True, **errors.settings()}
    )  # fmt: skip
    deadline = time.monotonic() + timeout_seconds
    try:
        low, high = _watermarks(consumer, topic, deadline)
        if high <= low:
            return None
        consumer.assign([TopicPartition(topic, 0, low)])
        value: bytes | None = None
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                # Where the fetching stands: past the commit markers, which are no records.
                if (message.offset() or 0) >= high:
                    return value
            elif error is not None:
                raise BergstreamError(f"cannot read topic {topic}: {errors.explain(consumer, error)}")
            elif message.key() == key:
                value = message.value()
        raise BergstreamError(
            f"reading topic {topic} to its end (offset {high}) took over {timeout_seconds:g}s: a transaction "
            "of another producer stays open in it"
        )
    except KafkaException as error:
        raise BergstreamError(
            f"cannot read topic {topic}: {errors.explain(consumer, error.args[0])}"
        ) from error
    finally:
        consumer.close()


_NOT_YET_KNOWN = (KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART,
                  KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION)  # fmt: skip


def _watermarks(consumer: Consumer, topic: str, deadline: float) -> tuple[int, int]:
    """The low and high watermarks of partition 0 of `topic`, asked again while a topic just created is not
    known yet to the broker that answers."""
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, 0), timeout=max(0.1, min(5.0, deadline - time.monotonic()))
            )
            return low or 0, high or 0
        except KafkaException as error:
            if error.args[0].code() not in _NOT_YET_KNOWN or time.monotonic() >= deadline:
                raise
            consumer.list_topics(topic, timeout=max(0.1, min(5.0, deadline - time.monotonic())))


def canonical_id(uuid: Any) -> str:
    """Kafka's topic id as Kafka's own tools print it (URL-safe base64, no padding); librdkafka's text uses
    the standard alphabet instead."""
    raw = uuid.get_most_significant_bits().to_bytes(8, "big", signed=True) + (
        uuid.get_least_significant_bits().to_bytes(8, "big", signed=True)
    )
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def topic_ids(admin: AdminClient, topics: list[str]) -> dict[str, str | None]:
    """Kafka's id of each of `topics` now; None for a topic Kafka gives no id for (brokers before 2.8)."""
    from confluent_kafka import TopicCollection

    if not topics:
        return {}
    ids: dict[str, str | None] = {}
    try:
        described = admin.describe_topics(TopicCollection(topics), request_timeout=_DESCRIBE_SECONDS)
        for topic, future in described.items():
            uuid = future.result(_DESCRIBE_SECONDS).topic_id
            ids[topic] = None if uuid is None or (
                uuid.get_most_significant_bits() == 0 and uuid.get_least_significant_bits() == 0
            ) else canonical_id(uuid)  # fmt: skip
    except Exception:
        _refresh_metadata(admin)
        raise
    return ids


def _refresh_metadata(admin: AdminClient) -> None:
    """Ask any broker for the cluster's metadata: the client sends its next description to the controller
    that answer names, not to the broker it last knew as one. With that broker killed, a long-lived client
    (a router's, asking before every batch) would otherwise wait out each description until its own refresh,
    minutes later."""
    try:
        admin.list_topics(timeout=_METADATA_SECONDS)
    except Exception as error:
        log.debug("the brokers' metadata is not refreshed now: %s", error)


def retention_seconds(admin: AdminClient, topics: list[str]) -> dict[str, float | None]:
    """How long Kafka keeps each of `topics`' records (its `retention.ms`, in seconds); None: for ever."""
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    if not topics:
        return {}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, topic) for topic in topics]
    described = admin.describe_configs(resources, request_timeout=_DESCRIBE_SECONDS)
    kept: dict[str, float | None] = {}
    for resource, future in described.items():
        entry = future.result(_DESCRIBE_SECONDS).get("retention.ms")
        milliseconds = None if entry is None or entry.value is None else int(entry.value)
        kept[resource.name] = None if milliseconds is None or milliseconds < 0 else milliseconds / 1000
    return kept
