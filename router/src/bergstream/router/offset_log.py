"""What each micro-batch of a router's query covers in Kafka, from the query's checkpoint: Spark writes a
batch's end offsets to its offset log before the batch runs, and the batch's range runs from the previous
batch's end (or the query's startingOffsets) to there. The router records that range in the snapshots of
the batch's commits (bergstream.schemas.batch_range; read back in recorded_positions.py).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from bergstream.schemas.batch_range import BatchRange

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

# Where Spark starts a partition it finds after a query began: its earliest offset.
EARLIEST_START = "earliest"


def batch_range(
    query: StreamingQuery,
    batch_id: int,
    topic: str,
    starting: str,
    previous_end: dict[int, int] | None = None,
) -> BatchRange:
    """Batch `batch_id`'s range, from the query's offset log (written before the batch runs); `starting`
    is the query's startingOffsets, the start of its first batch; `previous_end`, batch `batch_id - 1`'s
    end where the caller has it (one read of the log instead of two)."""
    end = _logged_offsets(query, batch_id, topic)
    if end is None:
        raise RuntimeError(f"{topic}: batch {batch_id} is not in the query's offset log")
    start: dict[int, int] | str | None = previous_end
    if start is None and batch_id:
        start = _logged_offsets(query, batch_id - 1, topic)
    if start is None:
        start = _parse_starting(starting, topic)
    return BatchRange(start, end)


def _logged_offsets(query: StreamingQuery, batch_id: int, topic: str) -> dict[int, int] | None:
    logged = logged_offsets(query, batch_id)
    return None if logged is None else logged.get(topic, {})


def logged_offsets(query: StreamingQuery, batch_id: int) -> dict[str, dict[int, int]] | None:
    """The end of batch `batch_id` of every topic the query reads, from its offset log; None when the log
    does not hold the batch."""
    logged = query._jsq.streamingQuery().offsetLog().get(batch_id)
    if not logged.isDefined():
        return None
    offset = logged.get().offsets().apply(0)
    if not offset.isDefined():
        return None
    return {topic: _per_partition(offsets) for topic, offsets in json.loads(offset.get().json()).items()}


def topic_ranges(
    query: StreamingQuery, batch_id: int, starting: str, previous_end: dict[str, dict[int, int]] | None
) -> dict[str, BatchRange]:
    """Batch `batch_id`'s range in every topic of a query of many (`router run --pattern`): from its offset
    log, where a topic missing from the previous batch's end (`previous_end`, else read from the log) is
    new, read from its earliest offset as Spark reads new partitions."""
    end = logged_offsets(query, batch_id)
    if end is None:
        raise RuntimeError(f"batch {batch_id} is not in the offset log of query {query.name}")
    previous = previous_end
    if previous is None and batch_id:
        previous = logged_offsets(query, batch_id - 1)
    ranges = {}
    for topic, offsets in end.items():
        start: dict[int, int] | str
        if previous is not None:
            start = previous.get(topic, EARLIEST_START)
        else:
            start = _first_start(_parse_starting(starting, topic))
        ranges[topic] = BatchRange(start, offsets)
    return ranges


def _first_start(start: dict[int, int] | str) -> dict[int, int] | str:
    """A first batch's start in one topic: Spark's -2 and -1 (earliest, latest) by name; a topic the
    query's startingOffsets leave out starts at its earliest offset."""
    if isinstance(start, str):
        return start
    if not start or all(offset == -2 for offset in start.values()):
        return EARLIEST_START
    if all(offset == -1 for offset in start.values()):
        return "latest"
    return start


def may_hold_records(covered: BatchRange) -> bool:
    """Whether a batch's range in a topic may hold records: it moved, or it starts at a name."""
    if isinstance(covered.start, str):
        return True
    start = covered.start
    return any(partition not in start or end > start[partition] for partition, end in covered.end.items())


def moved_back(covered: BatchRange) -> list[int]:
    """The partitions of a batch's range in a topic whose end fell below their start, or that are gone: the
    topic deleted and made again with fewer records (or partitions) than the old one had read. Spark reads
    nothing of them, and `may_hold_records` says the topic holds nothing."""
    if isinstance(covered.start, str):
        return []
    return sorted(p for p, start in covered.start.items() if covered.end.get(p, -1) < start)


def _parse_starting(starting: str, topic: str) -> dict[int, int] | str:
    try:
        parsed = json.loads(starting)
    except ValueError:
        return starting  # earliest, latest
    return _per_partition(parsed.get(topic, {})) if isinstance(parsed, dict) else starting


def _per_partition(offsets: dict[str, int]) -> dict[int, int]:
    return {int(partition): int(offset) for partition, offset in offsets.items()}


def _logged_batches(spark: SparkSession, location: str, log: str) -> list[int]:
    """The batch ids in one of the query's checkpoint logs (`offsets`, `commits`)."""
    jvm = spark._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(f"{location.rstrip('/')}/{log}")
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(path):
        return []
    return [int(name) for status in fs.listStatus(path) if (name := status.getPath().getName()).isdigit()]


def checkpoint_has_batches(spark: SparkSession, location: str) -> bool:
    """Whether the query's checkpoint holds an offset log: Spark then resumes from it."""
    return bool(_logged_batches(spark, location, "offsets"))


def checkpoint_query_id(spark: SparkSession, location: str) -> str | None:
    """The id of the query whose checkpoint `location` is (Spark's `metadata` file), the id its batches are
    committed under; None before the query first started."""
    jvm = spark._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(f"{location.rstrip('/')}/metadata")
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(path):
        return None
    stream = fs.open(path)
    try:
        text = bytes(stream.readAllBytes()).decode()
    finally:
        stream.close()
    try:
        return str(json.loads(text.strip().splitlines()[0])["id"])
    except (ValueError, KeyError, IndexError):
        return None


def last_committed_batch(spark: SparkSession, location: str) -> int | None:
    """The newest batch the query's checkpoint records as committed; None before its first."""
    return max(_logged_batches(spark, location, "commits"), default=None)
