"""Each topic commits on its own target lag by being read only when its commit is due: a batch reads from
Kafka the topics that are due, each from where its archive ends, and leaves the others unread.

Spark's checkpoint moves every topic's position on with each batch; what a topic has not read is the range
from where its tables end (the position their newest commit records) to the newest batch's end. The driver
decides once per batch, and between batches for topics without new records, for every topic with a range
unread (commit_policy.py: no target lag, the lag, a commit's worth unread), and always at the end of
`--available-now`, at a graceful stop, and when a topic leaves the query. The due topics' ranges are read
in one Kafka read and written by one job, each commit recording the whole range it covers: every reader of
positions (the resume without a checkpoint, the one-writer check, backfill plans, the hand-over to Kafka)
sees ranges that follow each other, as when every batch committed. Nothing is written before it is
committed: there are no files pending, and nothing for orphan removal to take.

What is unread is known again when a driver starts on the checkpoint: a topic's range starts where its
tables end (read once at start, with the check of its id), and ends where the checkpoint's last batch
ended. Before a batch ends, each topic with a range unread has its start, and since when, recorded beside
the checkpoint (RECORDS_DIR/<batch>.json, the newest of which is read at start): the start of a topic
whose tables record no position (new tables, or tables made again while the driver was stopped), and how
old a range is, are kept there. A batch run again after a crash reads from where each topic's tables end
by then: a topic committed by the batch's first attempt is not read twice.

What this costs: a topic left unread costs a batch nothing but its place in the offset log. What Kafka
deletes before a range is read is counted as expired (a target lag is refused unless it is well within
the topic's retention); a topic deleted with a range unread loses that range, up to its target lag of
records (docs/many-topics.md).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from pyspark.sql import SparkSession

from bergstream.errors import ConfigError, first_line
from bergstream.kafka_topics import retention_seconds
from bergstream.router.commit_policy import Cadence, CommitPolicy, Unread, due_reason, phase
from bergstream.router.metrics import RouterMetrics
from bergstream.schemas.batch_range import BatchRange, offsets_json

log = logging.getLogger("bergstream.router.driver")
RECORDS_DIR = "bergstream-unread"
# A topic's records stay in Kafka at least this many times its target lag, or its target lag is refused.
RETENTION_MARGIN = 2
# The records kept: a crash while the newest is written leaves the one before it whole.
KEPT_RECORDS = 2


class UnreadRanges:
    """The ranges the topics of one query have not read, kept beside its `checkpoint`."""

    def __init__(
        self, spark: SparkSession, checkpoint: str, metrics: RouterMetrics, trigger_seconds: float
    ) -> None:
        self.spark = spark
        self.metrics = metrics
        self.cadence = Cadence(trigger_seconds)
        jvm = spark._jvm
        assert jvm is not None
        self._directory = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/{RECORDS_DIR}")
        self._fs = self._directory.getFileSystem(spark._jsc.hadoopConfiguration())
        self.location = f"{checkpoint.rstrip('/')}/{RECORDS_DIR}"
        self._lock = threading.RLock()
        # Per topic, where its archive ends where known: its tables' newest position, then each commit's end.
        self._archived: dict[str, dict[int, int]] = {}
        self._unread: dict[str, Unread] = {}
        # Per topic, the newest batch's end, and that of the newest batch that ended (`settled`): where a
        # range read between batches, or as the query ends, ends (a batch that failed is run again).
        self.ends: dict[str, dict[int, int]] = {}
        self._settled: dict[str, dict[int, int]] = {}
        # Per topic, the mean size of its records so far (bytes), for a commit's worth by size.
        self._record_bytes: dict[str, float] = {}
        self._recorded: dict[str, object] | None = None
        self._lags: dict[str, float | None] = {}
        self._kept: dict[str, dict[str, object]] = self._read()
        # Per topic recorded unread that can no longer be read, where its range started: counted as expired
        # once the checkpoint's last batch's end is known.
        self._lost: dict[str, dict[int, int]] = {}

    def known(self, topic: str, archived_end: Mapping[int, int] | None) -> None:
        """`topic` joins the query, its tables recording that its archive ends at `archived_end` (per
        partition; None, or a partition left out or at EARLIEST: not recorded). A range recorded as unread
        before the driver started starts there, or where its tables end if further on."""
        recorded = {p: o for p, o in (archived_end or {}).items() if o >= 0}
        with self._lock:
            kept = self._kept.pop(topic, None)
            if kept is not None:
                start = {int(p): int(o) for p, o in dict(kept["start"]).items()}  # type: ignore[call-overload]
                start.update({p: max(o, start.get(p, o)) for p, o in recorded.items()})
                self._archived[topic] = start
                self._unread[topic] = Unread(dict(start), dict(start), float(kept["since"]))  # type: ignore[arg-type]
            elif recorded:
                self._archived[topic] = recorded

    def left_before_start(self) -> list[str]:
        """Topics recorded with a range unread that no worker took at start (no longer in the query)."""
        with self._lock:
            return sorted(self._kept)

    def lost_before_start(self, topic: str, why: str) -> None:
        """`topic`, recorded with a range unread, left the query while no driver ran and can no longer be
        read (`why`: deleted, or deleted and made again, its offsets started over): its range is lost, logged
        and counted as expired, and no longer recorded."""
        with self._lock:
            kept = self._kept.pop(topic, None)
            if kept is None:
                return
            start = {int(p): int(o) for p, o in dict(kept["start"]).items()}  # type: ignore[call-overload]
            self._lost[topic] = start
        log.error("topic %s %s while the router was stopped, with offsets from %s unread: they are lost, "
                  "counted as expired", topic, why, offsets_json(start))  # fmt: skip

    def met(self, topic: str, covered: BatchRange, now: float | None = None) -> bool:
        """A batch's range of `topic` (its start by offsets): added to what it has unread, from where its
        archive ends (a range its tables hold already, committed by a batch's first attempt, is not read
        again). Whether the range holds offsets and its tables hold them all: a batch run again."""
        assert not isinstance(covered.start, str), "a range starting by name is read by its batch"
        now = time.time() if now is None else now
        with self._lock:
            archived = self._archived.get(topic, {})
            moved = {p: end for p, end in covered.end.items() if end > covered.start.get(p, 0)}
            replayed = bool(moved) and all(end <= archived.get(p, -1) for p, end in moved.items())
            self.ends[topic] = {**self.ends.get(topic, {}), **covered.end}
            unread = self._unread.get(topic)
            if unread is None:
                start = {p: max(covered.start.get(p, 0), archived.get(p, 0)) for p in covered.end}
                unread = Unread(start, {p: max(e, start[p]) for p, e in covered.end.items()}, now)
                if unread.empty:
                    return replayed
                self._unread[topic] = unread
            else:
                for partition, end in covered.end.items():
                    unread.start.setdefault(partition, max(covered.start.get(partition, 0),
                                                           archived.get(partition, 0)))  # fmt: skip
                    unread.end[partition] = max(end, unread.end.get(partition, end), unread.start[partition])
                if unread.empty:
                    unread.since = now  # nothing unread yet: its age starts with its first record
            self._gauge(topic)
            return replayed

    def ended(self, ends: Mapping[str, Mapping[int, int]]) -> None:
        """The newest batch's end in each topic, for topics whose range the query knows only from its
        checkpoint (a driver started again, before its first batch); a range lost before the start is
        counted as expired up to it."""
        with self._lock:
            for topic, end in ends.items():
                if topic in self._unread and topic not in self.ends:
                    self.met(topic, BatchRange(dict(end), dict(end)))
                    self._settled[topic] = dict(self.ends[topic])
                lost = self._lost.pop(topic, None)
                for partition, offset in sorted((lost or {}).items()):
                    count = end.get(partition, offset) - offset
                    if count > 0:
                        self.metrics.expired_offsets.labels(topic, str(partition)).inc(count)

    def due(
        self,
        policies: Mapping[str, CommitPolicy],
        now: float | None = None,
        every: bool = False,
        left: Iterable[str] = (),
        settled: bool = False,
    ) -> dict[str, str]:
        """The topics due now, with why: by their `policies` (a topic without one is not due), all with
        `every` ("drain"), and those that `left` the query; with `settled`, of what the batches that ended
        passed (`range`)."""
        now = time.time() if now is None else now
        gone = set(left)
        due = {}
        for topic, policy in policies.items():
            if self._lags.get(topic, -1.0) != policy.target_lag:
                self._lags[topic] = policy.target_lag
                self.metrics.target_lag.labels(topic).set(policy.target_lag or 0)
        with self._lock:
            for topic, unread in sorted(self._unread.items()):
                if unread.empty or (settled and self.range(topic, settled=True) is None):
                    continue
                if topic in gone:
                    due[topic] = "left"
                elif every:
                    due[topic] = "drain"
                elif topic in policies:
                    reason = due_reason(policies[topic], self.cadence.seconds, unread, now, phase(topic),
                                        self._record_bytes.get(topic, 0.0))  # fmt: skip
                    if reason is not None:
                        due[topic] = reason
        return due

    def range(self, topic: str, settled: bool = False) -> BatchRange | None:
        """What `topic` has unread, None when nothing; with `settled`, up to where the newest batch that
        ended ends (between batches, and as the query ends: a batch that failed is run again, and the range
        it met is read by it)."""
        with self._lock:
            unread = self._unread.get(topic)
            if unread is None or unread.empty:
                return None
            if not settled:
                return unread.range
            until = self._settled.get(topic, {})
            end = {p: max(unread.start.get(p, 0), min(e, until.get(p, -1))) for p, e in unread.end.items()}
            taken = Unread(dict(unread.start), end, unread.since)
            return None if taken.empty else taken.range

    def topics(self) -> list[str]:
        """The topics with a range unread."""
        with self._lock:
            return sorted(topic for topic, unread in self._unread.items() if not unread.empty)

    def archived(self, topic: str, covered: BatchRange, records: int = 0, size: int = 0) -> None:
        """`topic`'s range `covered` is archived (committed, `records` of `size` bytes): its archive ends at
        its end, and what it has unread starts there."""
        with self._lock:
            self._archived[topic] = {**self._archived.get(topic, {}), **covered.end}
            if records > 0:
                self._record_bytes[topic] = size / records
            unread = self._unread.get(topic)
            if unread is not None:
                unread.start = {p: max(o, covered.end.get(p, o)) for p, o in unread.start.items()}
                unread.start.update({p: o for p, o in covered.end.items() if p not in unread.start})
                unread.end = {p: max(o, unread.start[p]) for p, o in unread.end.items()}
                if unread.empty:
                    del self._unread[topic]
            self._gauge(topic)

    def set_aside(self, topic: str) -> BatchRange | None:
        """`topic` is set aside (driver/behind.py archives it from Kafka): it leaves what it has unread,
        returned, to the catch-up."""
        with self._lock:
            unread = self._unread.pop(topic, None)
            self._archived.pop(topic, None)
            self._gauge(topic)
            return None if unread is None or unread.empty else unread.range

    def rejoined(self, topic: str, reached: Mapping[int, int]) -> None:
        """`topic` caught up to `reached` and rejoins the query's batches."""
        with self._lock:
            self._archived[topic] = dict(reached)
            self.ends[topic] = {**self.ends.get(topic, {}), **reached}

    def record(self, batch_id: int) -> None:
        """Before batch `batch_id` ends: where each topic's range unread starts, and since when, beside the
        checkpoint (a record only when it changed; the older ones go)."""
        with self._lock:
            document: dict[str, object] = {
                topic: {"start": {str(p): o for p, o in sorted(u.start.items())}, "since": u.since}
                for topic, u in sorted(self._unread.items())
                if not u.empty
            }
            # Recorded before the driver started, not met by this one yet: kept as they were.
            document.update(self._kept)
            self._settled.update({topic: dict(end) for topic, end in self.ends.items()})
            if document == self._recorded:
                return
            path = self._path(batch_id)
            stream = self._fs.create(path, True)
            try:
                stream.write(json.dumps({"batch": batch_id, "topics": document}).encode())
            finally:
                stream.close()
            self._recorded = document
            for older in sorted(self._batches())[:-KEPT_RECORDS]:
                self._fs.delete(self._path(older), False)

    def _read(self) -> dict[str, dict[str, object]]:
        """The newest record that reads whole (one cut off as a driver was killed is passed over)."""
        for batch in sorted(self._batches(), reverse=True):
            stream = self._fs.open(self._path(batch))
            try:
                text = bytes(stream.readAllBytes()).decode()
            finally:
                stream.close()
            try:
                topics = dict(json.loads(text)["topics"])
            except (ValueError, KeyError, TypeError):
                log.warning("%s/%d.json is not whole (a driver killed as it was written); the one before it "
                            "is read", self.location, batch)  # fmt: skip
                continue
            for topic, kept in sorted(topics.items()):
                log.info("topic %s: a range from %s unread when the router stopped", topic,
                         offsets_json({int(p): int(o) for p, o in kept["start"].items()}))  # fmt: skip
            return topics
        return {}

    def _batches(self) -> list[int]:
        if not self._fs.exists(self._directory):
            return []
        names = (status.getPath().getName() for status in self._fs.listStatus(self._directory))
        return [int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit()]

    def _path(self, batch_id: int) -> object:
        jvm = self.spark._jvm
        assert jvm is not None
        return jvm.org.apache.hadoop.fs.Path(self._directory, f"{batch_id}.json")

    def _gauge(self, topic: str) -> None:
        unread = self._unread.get(topic)
        records = 0 if unread is None else unread.offsets
        self.metrics.pending_records.labels(topic).set(records)
        self.metrics.pending_bytes.labels(topic).set(records * self._record_bytes.get(topic, 0.0))
        since = unread.since if unread is not None and records else 0
        self.metrics.pending_since.labels(topic).set(since)
        self.metrics.pending_oldest.labels(topic).set(since)


def check_retention(admin: Any, lags: Mapping[str, float]) -> None:
    """Refuse the target `lags` ({topic: seconds}) Kafka's retention does not leave room for: a topic read
    only when its commit is due must find its records still there, with a target lag to spare."""
    try:
        kept = retention_seconds(admin, sorted(lags))
    except Exception as error:  # Kafka out for a moment: a range that expires is counted as expired
        log.warning("the retention of %d topics is not known now: %s", len(lags), first_line(error))
        return
    short = {
        topic: seconds
        for topic, seconds in kept.items()
        if seconds is not None and seconds < RETENTION_MARGIN * lags[topic]
    }
    if short:
        named = ", ".join(f"{t} (retention.ms {s * 1000:.0f}, target_lag {lags[t]:.0f}s)"
                          for t, s in sorted(short.items()))  # fmt: skip
        raise ConfigError(
            f"{len(short)} topics keep their records in Kafka for less than {RETENTION_MARGIN} times "
            f"their target lag: {named}. A topic is read only when its commit is due: lower target_lag "
            "in its settings file, or raise the topic's retention.ms"
        )
