"""Files a router of an earlier version left pending beside a query's checkpoint: that version wrote the
files of a topic on a target lag with each batch, committed them later, and recorded them meanwhile
(RECORDS_DIR/<batch>.json: each held table's files, as Iceberg writes a data file in JSON, and the summary
its commit carries). Today a topic is read only when its commit is due (driver/unread.py) and nothing is
pending; a driver started on such a checkpoint commits those files once, before anything new (PendingFiles,
in router/jvm): those of a table that holds their batch already (committed before the record was cleared)
are dropped, the others committed. A table dropped since (made again at its start, or not) is another
table: the files written for the one dropped are not committed into it, and their range is read from Kafka
again, as that of files gone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession

from bergstream.router.metrics import RouterMetrics
from bergstream.router.write import BATCH_ID, QUERY_ID
from bergstream.schemas.batch_range import CLUSTER, BatchRange

if TYPE_CHECKING:
    from bergstream.router.topic import TopicWorker

log = logging.getLogger("bergstream.router.driver")
RECORDS_DIR = "bergstream-pending"
_PENDING_FILES = "io.bergstream.router.PendingFiles"


class PendingCommits:
    """The files an earlier version of the router left pending on a query's checkpoint."""

    def __init__(self, spark: SparkSession, checkpoint: str, metrics: RouterMetrics) -> None:
        self.spark = spark
        self.metrics = metrics
        jvm = spark._jvm
        assert jvm is not None
        self.files = getattr(jvm, _PENDING_FILES)()
        self._directory = f"{checkpoint.rstrip('/')}/{RECORDS_DIR}"

    def recover(
        self,
        workers: Mapping[str, TopicWorker],
        set_aside: Callable[[str, BatchRange, str], None],
        subscription: str,
    ) -> int:
        """Commit the files a driver before this one left pending on the checkpoint, each once (a table
        that holds their batch already committed them before the record was cleared), through outages as
        the topic's worker retries, and clear their records: how many tables were committed. A topic whose
        files are gone, or one of whose tables is not the table they were written for (dropped, and made
        again or not: their field ids and partitions are that table's), commits none: its recorded range is
        given to `set_aside(topic, range, why)`, to be read from Kafka again into the tables as they are."""

        def attempt(topic: str, commit: Callable[[], Any]) -> Any:
            worker = workers.get(topic)
            return commit() if worker is None else worker.retry.attempt(topic, -1, commit)

        def lost(topic: str, summary: dict[str, str], why: str) -> None:
            covered = BatchRange.recorded(summary, topic, summary[CLUSTER])
            if covered is not None:
                set_aside(topic, covered, why)

        committed = self._recover(attempt, lost)
        if committed:
            log.warning("%s: the files of %d tables pending when the router stopped are committed",
                        subscription, committed)  # fmt: skip
        return committed

    def _recover(
        self,
        attempt: Callable[[str, Callable[[], Any]], Any],
        lost: Callable[[str, dict[str, str], str], None],
    ) -> int:
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
