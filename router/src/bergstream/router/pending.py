"""Each topic commits on its own target lag: the files a batch writes for a topic that is not due are kept
pending, recorded beside the query's checkpoint, and committed with a later batch's, each once.

The driver decides once per batch, for every topic the batch wrote (`PendingCommits.due`, by the rule in
router/commit_policy.py: no target lag, the lag, a commit's worth pending, a schema change). Every pending
file is committed when the query ends (a graceful stop, the end of `--available-now`, a topic recreated),
before a topic's batch is written on its own (`flush`), when a topic leaves the query, and when a driver
starts again on the checkpoint (`recover`). A topic set aside drops what it has pending (`drop`): its
catch-up reads Kafka from where its tables end.

A commit that carries several batches' files records the query's newest batch among them and the Kafka
range from the oldest one's start to the newest one's end: every reader of positions (the resume without a
checkpoint, the one-writer check, backfill plans, the hand-over to Kafka) sees ranges that follow each
other, as when every batch committed.

What is pending is kept in the driver's memory (PendingFiles, in router/jvm) and, before a batch ends, in
one record per batch beside the checkpoint (RECORDS_DIR/<batch>.json: each held table's files, as Iceberg
writes a data file in JSON, and the summary its commit carries). A driver killed at any point starts again
with the records left: those of a table that holds their batch already (committed before the record was
cleared) are dropped, the others committed; Spark then runs the batch it had not finished, whose tables hold
it. A table dropped while the driver was stopped (made again at its start, or not) is another table: the
files written for the one dropped are not committed into it, and their range is read from Kafka again, as
that of files gone. A checkpoint deleted takes its records with it: the query starts where its tables end,
and the files never committed are orphans that maintenance removes (router/maintain.py keeps every file
younger than `orphan_retention_hours`, an hour at least, and a target lag is at most a quarter of that).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession

from bergstream.router.commit_policy import (
    Cadence,
    CommitPolicy,
    Held,
    Written,
    commit_reason,
    overdue,
    phase,
)
from bergstream.router.metrics import RouterMetrics
from bergstream.router.write import BATCH_ID, QUERY_ID
from bergstream.schemas.batch_range import BatchRange

log = logging.getLogger("bergstream.router.driver")
RECORDS_DIR = "bergstream-pending"
_PENDING_FILES = "io.bergstream.router.PendingFiles"


class PendingCommits:
    """The pending files of one query's topics, and when each topic commits."""

    def __init__(
        self, spark: SparkSession, checkpoint: str, metrics: RouterMetrics, trigger_seconds: float
    ) -> None:
        self.spark = spark
        self.metrics = metrics
        self.cadence = Cadence(trigger_seconds)
        jvm = spark._jvm
        assert jvm is not None
        self.files = getattr(jvm, _PENDING_FILES)()
        self._directory = f"{checkpoint.rstrip('/')}/{RECORDS_DIR}"
        self._held: dict[str, Held] = {}
        # Per batch recorded: the tables it names that are not committed yet.
        self._records: dict[int, set[str]] = {}
        self._plans: dict[str, str] = {}
        self._lock = threading.RLock()

    def held(self, topic: str) -> Held | None:
        return self._held.get(topic)

    def widened(self, topic: str, covered: BatchRange) -> BatchRange:
        """The range a commit of `topic` in this batch records: from its oldest pending batch's start."""
        held = self._held.get(topic)
        return covered if held is None else covered.after(held.range)

    def batch_began(self) -> None:
        self.cadence.began(time.monotonic())

    def batch_ended(self) -> None:
        self.cadence.ended(time.monotonic())

    def due(self, topic: str, policy: CommitPolicy, written: Written, now: float | None = None) -> str | None:
        """Why `topic` commits in this batch, having written `written`; None: its files are held."""
        self.metrics.target_lag.labels(topic).set(policy.target_lag or 0)
        previous_plan = self._plans.get(topic)
        self._plans[topic] = written.plan
        now = time.monotonic() if now is None else now
        held = self._held.get(topic)
        return commit_reason(policy, self.cadence.seconds, held, written, previous_plan, now, phase(topic))

    def overdue(self, lags: dict[str, float | None], busy: set[str], now: float | None = None) -> list[str]:
        """The topics not in this batch (`busy`) whose pending files are due by their target lag (`lags`):
        a quiet topic's files are committed on its lag as a busy one's are, not when its next record comes."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return [
                topic
                for topic, held in sorted(self._held.items())
                if topic not in busy
                and overdue(lags.get(topic), self.cadence.seconds, held.since, now, phase(topic))
            ]

    def hold(
        self,
        batch_id: int,
        query_id: str,
        topics: dict[str, tuple[list[str], dict[str, str], BatchRange, Written]],
    ) -> None:
        """Batch `batch_id`'s files of `topics` ({topic: (its tables written, its commit's widened summary,
        widened range, what it wrote)}) stay pending, and the batch's record is written."""
        now = time.monotonic()
        tables: dict[str, Any] = {}
        with self._lock:
            for topic, (identifiers, properties, widened, written) in topics.items():
                held = self._held.get(topic)
                if held is None:
                    held = self._held[topic] = Held(widened, properties, now, time.time())
                held.range, held.properties = widened, properties
                held.tables.update(identifiers)
                held.records += written.records
                held.bytes += written.bytes
                held.batches.append(batch_id)
                if written.oldest is not None:
                    held.oldest = min(held.oldest or written.oldest, written.oldest)
                if written.newest is not None:
                    held.newest = max(held.newest or written.newest, written.newest)
                for identifier in identifiers:
                    tables[identifier] = {"topic": topic, "properties": properties}
            if tables:
                document = {"batch": batch_id, "query": query_id, "tables": tables}
                self.files.record(self.spark._jsparkSession, self._path(batch_id), json.dumps(document))
                self._records[batch_id] = set(tables)
            # The gauges say what is pending once it is recorded: a router killed after reading them leaves
            # those files to the next start.
            for topic in topics:
                self._gauge(topic)

    def committed(self, topic: str) -> Held | None:
        """`topic`'s pending files were committed (with a batch's, or flushed): its records lose it."""
        with self._lock:
            held = self._held.pop(topic, None)
            if held is None:
                return None
            self._forget(held.tables)
            self._gauge(topic)
            return held

    def drop(self, topic: str) -> None:
        """`topic` is set aside: what it has pending is not committed now, and its catch-up reads Kafka from
        where its tables end. Its records still name those files: a driver started again before the catch-up
        commits them, and the catch-up then reads on from there."""
        with self._lock:
            held = self._held.pop(topic, None)
            if held is None:
                return
            for identifier in held.tables:
                self.files.committed(identifier, 2**62)
            log.warning("topic %s: %d records of batches %d to %d were pending; set aside, they are read "
                        "from Kafka again", topic, held.records, held.batches[0],
                        held.batches[-1])  # fmt: skip
            self._forget(held.tables)
            self._gauge(topic)

    def flush(
        self, topic: str, attempt: Callable[[Callable[[], Any]], Any] | None = None, reason: str = "flush"
    ) -> Held | None:
        """Commit what `topic` has pending on its own, each table once (`attempt` runs the commit, through
        outages); what was committed."""
        held = self._held.get(topic)
        if held is None:
            return None
        batch = held.batches[-1]

        def commit() -> None:
            for identifier in sorted(held.tables):
                self.files.flush(
                    self.spark._jsparkSession, identifier, QUERY_ID, BATCH_ID, batch, held.properties
                )

        (attempt or (lambda run: run()))(commit)
        self.metrics.pending_commits.labels(topic, reason).inc()
        return self.committed(topic)

    def topics(self) -> list[str]:
        return sorted(self._held)

    def recover(
        self,
        attempt: Callable[[str, Callable[[], Any]], Any],
        lost: Callable[[str, dict[str, str], str], None],
    ) -> int:
        """Commit the files a driver before this one left pending on the checkpoint, each once (a table
        that holds their batch already committed them before the record was cleared), and clear their
        records: how many tables were committed. `attempt(topic, commit)` runs a commit of a topic's table
        through outages; `lost(topic, summary, why)` takes a topic whose files are gone, or one of whose
        tables is not the table they were written for (dropped, and made again or not: their field ids and
        partitions are that table's), none committed (its range, in `summary`, is to be read from Kafka
        again, into the tables as they are)."""
        loaded = json.loads(self.files.load(self.spark._jsparkSession, self._directory))
        if not loaded:
            return 0
        newest: dict[str, tuple[str, int, dict[str, str]]] = {}
        replaced: dict[str, str] = {}
        for record in loaded:
            for identifier, table in record["tables"].items():
                newest[identifier] = (table["topic"], int(record["batch"]), table["properties"])
                if table.get("replaced"):
                    replaced[identifier] = table["replaced"]
        # A topic any of whose files are gone, or whose table is not the one they were written for (dropped,
        # and made again or not), commits none of its tables (they record the same range), and reads that
        # range from Kafka again.
        gone: dict[str, str] = {}
        session = self.spark._jsparkSession
        for identifier, (topic, batch, properties) in sorted(newest.items()):
            if topic in gone:
                continue
            why = replaced.get(identifier)
            if why is not None:
                why = f"{why} since its files pending up to batch {batch} were written"
            else:

                def look(name: str = identifier, last: int = batch, query: str = properties[QUERY_ID]) -> Any:
                    return self.files.missing(session, name, QUERY_ID, BATCH_ID, last, query)

                missing = attempt(topic, look)
                if not missing:
                    continue
                why = (f"{missing} of the files of {identifier} pending up to batch {batch} are gone "
                       "(removed as orphans while the router was stopped?)")  # fmt: skip
            gone[topic] = why
            lost(topic, properties, why)
        for identifier, (topic, batch, _) in newest.items():
            if topic in gone:
                self.files.committed(identifier, batch)
                log.error("%s: %s; none of %s's files pending up to batch %d is committed, the range is read "
                          "from Kafka again", topic, gone[topic], identifier, batch)  # fmt: skip
        newest = {identifier: held for identifier, held in newest.items() if held[0] not in gone}
        committed = 0
        for identifier, (topic, batch, properties) in sorted(newest.items()):

            def commit(name: str = identifier, last: int = batch, props: dict[str, str] = properties) -> Any:
                session = self.spark._jsparkSession
                return self.files.flush(session, name, QUERY_ID, BATCH_ID, last, props)

            files, size, _ = attempt(topic, commit)
            if files >= 0:
                committed += 1
                self.metrics.pending_commits.labels(topic, "restart").inc()
                log.warning("%s: %d files (%.1f MB) pending when the router stopped, up to batch %d, "
                            "committed", identifier, files, size / 1e6, batch)  # fmt: skip
            else:
                log.info("%s: the files pending when the router stopped were committed before it stopped",
                         identifier)  # fmt: skip
        for record in loaded:
            self.files.delete(self.spark._jsparkSession, record["path"])
        return committed

    def _forget(self, tables: set[str]) -> None:
        """`tables` have nothing pending: a batch's record all of whose tables are committed goes. One that
        still names some of them stays as it is: a driver started again commits only the batches a table's
        history does not hold (PendingFiles.flush)."""
        for batch, remaining in list(self._records.items()):
            remaining -= tables
            if not remaining:
                del self._records[batch]
                self.files.delete(self.spark._jsparkSession, self._path(batch))

    def _path(self, batch_id: int) -> str:
        return f"{self._directory}/{batch_id}.json"

    def _gauge(self, topic: str) -> None:
        held = self._held.get(topic)
        self.metrics.pending_records.labels(topic).set(held.records if held else 0)
        self.metrics.pending_bytes.labels(topic).set(held.bytes if held else 0)
        self.metrics.pending_oldest.labels(topic).set(held.oldest or 0 if held else 0)
        self.metrics.pending_since.labels(topic).set(held.written_at if held else 0)
