"""A topic is its identity, not its name: Kafka's topic id, recorded beside the router's checkpoint and in
every router commit, and checked against Kafka when the router starts and before each micro-batch.

A topic deleted and created again under its name starts its offsets over. A router that went on from its
checkpoint, or from the positions its tables record, would read the new topic from the old topic's offsets:
every record below them skipped, without an error. Spark's Kafka source knows topics by name alone, so
bergstream asks Kafka for the topic's id with an admin client and refuses a topic whose id is not the one
recorded, naming the topic, both ids and what to do.

What the checks catch: a topic recreated while the router was stopped (at start), and one recreated
between two micro-batches (before the next one is written), also with fewer records than the old one had
read: Spark's end offsets then fall below the batch's start and it reads nothing of the topic, whose id is
checked all the same. What they cannot catch: a topic recreated
during a micro-batch, between the check and Spark's fetch of the batch's records; those records, the
first of the new topic read at the old topic's offsets, are lost from that batch (Spark counts them as data
loss), and the next batch stops the router. Commits and checkpoints written before ids were recorded have
no id, and are accepted as unknown.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bergstream.errors import ConfigError
from bergstream.schemas.batch_range import TOPIC_ID

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from bergstream.router.consumer_group import GroupCommitter
    from bergstream.router.recorded_positions import RecordedHistory

log = logging.getLogger("bergstream.router")
# Beside Spark's offset log in the query's checkpoint: {"<topic>": "<topic id>", ...}.
IDS_FILE = "bergstream-topic-ids.json"
# And {"<topic>": {"<partition>": <offset>, ...}}: where a topic new to the query starts
# (router/driver/floors.py).
FLOORS_FILE = "bergstream-topic-floors.json"


class TopicRecreated(ConfigError):
    """The topic Kafka has under a name is not the one the router archived under it."""


def refuse_another(topic: str, current: str | None, recorded: str | None, where: str) -> None:
    """Refuse to go on when `where` records another id of `topic` than Kafka's current one."""
    if current is None or recorded is None or current == recorded:
        return
    raise TopicRecreated(
        f"topic {topic}: Kafka's topic of that name has id {current}, and {where} records id {recorded}: the "
        "topic was deleted and created again, and its offsets started over, so reading on from the recorded "
        "offsets would skip or mix records. Archive the new topic with a router of its own from its start "
        "(another table and checkpoint), and keep the old archive as it is"
    )


class CheckpointFile:
    """A JSON object kept beside a query's checkpoint (`name`), on the checkpoint's own file system: the
    topic ids (IDS_FILE), the positions topics new to the query start from (FLOORS_FILE).

    The object last read or written is kept in this process with the file's modification time and length:
    a read finds the file as it was by those (one status, not its bytes), which a driver of a thousand topics
    reads once for each at start. Inside `gathered()`, what is put is written once, as it ends."""

    def __init__(self, spark: SparkSession, checkpoint: str, name: str = IDS_FILE) -> None:
        jvm = spark._jvm
        assert jvm is not None
        self._path = jvm.org.apache.hadoop.fs.Path(checkpoint.rstrip("/") + "/" + name)
        self._fs = self._path.getFileSystem(spark._jsc.hadoopConfiguration())
        self.location = f"{checkpoint.rstrip('/')}/{name}"

    def read(self) -> dict[str, Any]:
        """The object as it is: read under the lock `put` writes under, as the file is replaced by a delete
        and a rename, between which a read would find none."""
        with _lock_of(self.location):
            return dict(self._read())

    def _read(self) -> dict[str, Any]:
        held = _HELD.get(self.location)
        if held is not None and held.gathering:
            return held.document
        if not self._fs.exists(self._path):
            _HELD.pop(self.location, None)
            return {}
        status = self._fs.getFileStatus(self._path)
        stamp = (status.getModificationTime(), status.getLen())
        if held is not None and held.stamp == stamp:
            return held.document
        stream = self._fs.open(self._path)
        try:
            text = bytes(stream.readAllBytes()).decode()
        finally:
            stream.close()
        try:
            document = json.loads(text)
        except ValueError as error:
            raise ConfigError(
                f"{self.location} is not JSON: {error}; remove it to record it again"
            ) from error
        if not isinstance(document, dict):
            raise ConfigError(f"{self.location} is not a JSON object; remove it to record it again")
        _HELD[self.location] = _Held(document, stamp)
        return document

    def put(self, key: str, value: Any) -> None:
        """Keep `value` under `key` (None: remove it), beside the others: read, changed and written whole (to
        a file beside it, then renamed over it), one key at a time in this process, as topics of one query
        are added from several threads."""
        with _lock_of(self.location):
            document = dict(self._read())
            if document.get(key) == value:
                return
            if value is None:
                document.pop(key)
            else:
                document[key] = value
            held = _HELD.get(self.location)
            if held is not None and held.gathering:
                held.document, held.changed = document, True
                return
            self._write(document)

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """What is put meanwhile, by any thread, written once as it ends, however it ends (each put stands
        on its own: a topic refused leaves the others' ids good)."""
        with _lock_of(self.location):
            held = _HELD[self.location] = _Held(dict(self._read()), None, gathering=True)
        try:
            yield
        finally:
            with _lock_of(self.location):
                held.gathering = False
                _HELD.pop(self.location, None)
                if held.changed:
                    self._write(held.document)

    def _write(self, document: dict[str, Any]) -> None:
        written = self._path.suffix(f".{uuid.uuid4().hex}.tmp")
        stream = self._fs.create(written, True)
        try:
            stream.write(json.dumps(dict(sorted(document.items())), indent=1).encode())
        finally:
            stream.close()
        if self._fs.exists(self._path):
            self._fs.delete(self._path, False)
        if not self._fs.rename(written, self._path):
            raise ConfigError(f"cannot write {self.location}: renaming {written} over it failed")
        status = self._fs.getFileStatus(self._path)
        _HELD[self.location] = _Held(document, (status.getModificationTime(), status.getLen()))


@dataclass
class _Held:
    """A checkpoint file's object as last read or written, with the file's (modification time, length) then;
    `gathering`: puts are kept here, to be written once (`CheckpointFile.gathered`)."""

    document: dict[str, Any]
    stamp: tuple[int, int] | None
    gathering: bool = False
    changed: bool = False


_HELD: dict[str, _Held] = {}
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def _lock_of(location: str) -> threading.Lock:
    with _LOCKS_LOCK:
        return _LOCKS.setdefault(location, threading.Lock())


class TopicIdentity:
    """One topic's id: learnt from Kafka when the router starts, checked then against the one kept beside
    the checkpoint and those the tables' commits record, and against Kafka's again before each batch."""

    def __init__(self, topic: str, cluster: str, kafka: GroupCommitter) -> None:
        self.topic = topic
        self.cluster = cluster
        self.kafka = kafka
        self.topic_id: str | None = None

    def at_start(
        self, spark: SparkSession, checkpoint: str, tables: Mapping[str, RecordedHistory]
    ) -> str | None:
        """Kafka's id of the topic now, once the checkpoint and `tables` (each table's recorded history as
        read at start, by its identifier) are found to record no other; it is then kept beside the
        checkpoint."""
        current = self.kafka.topic_id()
        kept = CheckpointFile(spark, checkpoint)
        ids = {str(topic): str(topic_id) for topic, topic_id in kept.read().items()}
        refuse_another(self.topic, current, ids.get(self.topic), f"the router's checkpoint ({kept.location})")
        for identifier, history in tables.items():
            newest = history.newest_of(TOPIC_ID, self.topic, self.cluster)
            recorded = None if newest is None else newest[1][TOPIC_ID]
            refuse_another(self.topic, current, recorded, f"table {identifier}")
        if current is not None:
            kept.put(self.topic, current)
        self.topic_id = current
        return current

    def before_batch(self, batch_id: int) -> None:
        """Stop before batch `batch_id` is written when the topic is not the one the router started on."""
        if self.topic_id is not None:
            try:
                current = self.kafka.topic_id()
            except ConfigError as error:  # Kafka out for a moment: Spark's reader waits it out, or fails
                log.warning("%s: batch %d is written without checking the topic's id: %s", self.topic,
                            batch_id, error)  # fmt: skip
                return
            refuse_another(
                self.topic, current, self.topic_id,
                f"the router, which started on it and was about to write batch {batch_id},",
            )  # fmt: skip
