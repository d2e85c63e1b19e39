"""Reading a topic to its end the way a downstream consumer of bergstream's output would."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition


def read_committed(client: dict[str, Any], topic: str, group: str | None = None) -> list[Any]:
    """Every record of `topic` a read_committed consumer sees, partition by partition in offset order. The
    end offsets also count the transactions' commit markers, so the read ends at each partition's EOF at or
    past its end offset, not at a count of records."""
    consumer = Consumer({**client, "group.id": group or f"check-{topic}", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True})  # fmt: skip
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        messages: list[Any] = []
        reached: set[int] = set()
        deadline = time.monotonic() + 60
        while len(reached) < len(ends):
            assert time.monotonic() < deadline, f"{topic}: not read to its end in 60s"
            message = consumer.poll(1)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                if (message.offset() or 0) >= ends[message.partition()]:
                    reached.add(message.partition())
                continue
            assert error is None, f"{topic}: {error}"
            messages.append(message)
        return messages
    finally:
        consumer.close()
