"""Where a topic new to a query's checkpoint starts: where its tables say its archive ends.

Spark's Kafka source reads a topic it meets mid-query (created later, a file added back under `--all`, a
topic that had its own router and now matches a pattern) from its earliest offset, and takes no other
start. Where the topic's tables record where its archive ends, its rows below that floor are read from
Kafka once more and dropped before they are written, and its range is raised to it: never archived twice.
The floor is kept beside the checkpoint (FLOORS_FILE) until every partition's range starts past it, for a
restart meanwhile.
"""

from __future__ import annotations

import logging

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from bergstream.router.identity import FLOORS_FILE, CheckpointFile
from bergstream.router.offset_log import EARLIEST_START
from bergstream.router.topic import TopicWorker
from bergstream.schemas.batch_range import EARLIEST, BatchRange, offsets_json

log = logging.getLogger("bergstream.router.driver")


class Floors:
    """The floors of the topics of one query, kept beside its `checkpoint`."""

    def __init__(self, spark: SparkSession, checkpoint: str) -> None:
        self.spark = spark
        self._file = CheckpointFile(spark, checkpoint, FLOORS_FILE)
        self._floors = {
            str(topic): {int(p): int(o) for p, o in floor.items()}
            for topic, floor in self._file.read().items()
        }

    def apply(
        self,
        records: DataFrame,
        batch_id: int,
        ranges: dict[str, BatchRange],
        busy: dict[str, TopicWorker],
        first_of_fresh_checkpoint: bool,
    ) -> DataFrame:
        """`records` without the rows of the `busy` topics below their floors, each such topic's range raised
        to its floor (`ranges` changed in place). The first batch of a fresh checkpoint starts each topic
        where its tables end already: no floor is looked for in it."""
        excluded: Column | None = None
        for topic, worker in busy.items():
            floor = self._floor(worker, ranges[topic], batch_id, first_of_fresh_checkpoint)
            if floor is None:
                continue
            ranges[topic] = ranges[topic].raised_to(floor)
            for partition, offset in floor.items():
                below = (
                    (F.col("topic") == topic) & (F.col("partition") == partition) & (F.col("offset") < offset)
                )
                excluded = below if excluded is None else excluded | below
        return records if excluded is None else records.where(~excluded)

    def _floor(
        self, worker: TopicWorker, covered: BatchRange, batch_id: int, first_of_fresh_checkpoint: bool
    ) -> dict[int, int] | None:
        """The topic's floor in this batch: found in its tables when it is new to the checkpoint (its range
        starts at `earliest`), kept until every partition's range starts past it."""
        topic = worker.topic
        new = covered.start == EARLIEST_START and not first_of_fresh_checkpoint
        if topic not in self._floors and new:
            # Its tables are read as a commit would be: through a catalog's outage.
            positions = worker.retry.attempt(topic, batch_id, lambda: worker.positions(self.spark)) or {}
            found = {p: offset for p, offset in positions.items() if offset != EARLIEST}
            if found:
                log.warning(
                    "topic %s is new to the query's checkpoint, and Spark reads it from its earliest offset; "
                    "its tables record that its archive ends at %s: the records below are dropped, not "
                    "archived twice", topic, offsets_json(found),
                )  # fmt: skip
                self._floors[topic] = found
                self._file.put(topic, {str(p): o for p, o in sorted(found.items())})
        floor = self._floors.get(topic)
        if floor is None:
            return None
        start = covered.start
        if isinstance(start, dict) and all(start.get(p, 0) >= offset for p, offset in floor.items()):
            del self._floors[topic]
            self._file.put(topic, None)
            return None
        return floor
