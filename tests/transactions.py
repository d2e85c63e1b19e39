"""A transactional producer of playback events for the tests: each transaction is committed, aborted or left
open, and every record says which in its value's `playback_id`, so that a test knows what a read_committed
consumer must see."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from confluent_kafka import Producer

from bergstream.kafka_topics import ensure_topic
from bergstream.loadgen.events import EventModel
from bergstream.schemas.event_schema import load_event_schema

Outcome = Literal["commit", "abort"]


@dataclass
class Sent:
    """What the transactions sent: playback ids by outcome; an open transaction's are pending."""

    committed: set[str] = field(default_factory=set)
    aborted: set[str] = field(default_factory=set)
    pending: set[str] = field(default_factory=set)


class TransactionalWriter:
    """Playback events into `topic` through one transactional producer (`transactional_id`), stamped from
    `start` on, a second apart, each named `<transactional_id>-<n>`."""

    def __init__(
        self, bootstrap: str, topic: str, transactional_id: str, start: datetime, sent: Sent
    ) -> None:
        ensure_topic({"bootstrap.servers": bootstrap}, topic, 3)
        self.topic = topic
        self.name = transactional_id
        self.sent = sent
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5}
        )
        self._producer.init_transactions(30)
        self._schema = load_event_schema("playback")
        self._clock = [start]
        self._events = EventModel(seed=hash(transactional_id) & 0xFFFF, clock=lambda: self._clock[0]).events(
            "playback"
        )
        self._count = 0
        self._open: list[str] = []

    def begin(self, records: int) -> None:
        """Open a transaction and send `records` into it, flushed to the broker: they are in the log."""
        self._producer.begin_transaction()
        for _ in range(records):
            self._clock[0] += timedelta(seconds=1)
            event = next(self._events)
            name = f"{self.name}-{self._count}"
            self._count += 1
            value = self._schema.encode({**event.event, "playback_id": name}, "json")
            self._producer.produce(
                self.topic, value, event.key, timestamp=int(self._clock[0].timestamp() * 1000)
            )
            self._open.append(name)
        assert self._producer.flush(30) == 0, f"{self.topic}: records of {self.name} not delivered in 30s"
        self.sent.pending.update(self._open)

    def end(self, outcome: Outcome) -> None:
        """Commit or abort the open transaction."""
        if outcome == "commit":
            self._producer.commit_transaction(30)
            self.sent.committed.update(self._open)
        else:
            self._producer.abort_transaction(30)
            self.sent.aborted.update(self._open)
        self.sent.pending.difference_update(self._open)
        self._open = []

    def transaction(self, records: int, outcome: Outcome) -> None:
        self.begin(records)
        self.end(outcome)
