"""Spark's Kafka source for one topic, as the router and an application's live named sources read it; and
one range of it, or of several topics, as a batch read.

Options keep the names of Spark's Kafka source (`kafka.bootstrap.servers`, `startingOffsets`, ...); the
defaults below are bergstream's, and a user's settings override each of them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from bergstream.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ISOLATION_OPTION = "kafka.isolation.level"
READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
SOURCE_DEFAULTS = {
    # What a read_committed consumer of the topic reads: records of committed transactions and records
    # sent outside transactions, never an aborted one, and nothing past the last stable offset (the first
    # record of a transaction still open) until that transaction ends.
    ISOLATION_OPTION: READ_COMMITTED,
    # Offsets that expire from Kafka before they are read are counted and reported by the router, and
    # skipped by a live application, instead of failing the query.
    "failOnDataLoss": "false",
    # Spark's Kafka reader asks a partition's consumer for the partition's offset range after every poll,
    # on the connection where the consumer's next fetch is already waiting at the end of the batch's range;
    # the broker answers requests on a connection in order, so that fetch holds the answer back for
    # fetch.max.wait.ms (500 ms by default) for every partition of every batch.
    "kafka.fetch.max.wait.ms": "10",
}
# Options of the streaming source alone: a batch read is refused with them, or ignores them.
_STREAMING_ONLY = (
    "startingOffsets", "endingOffsets", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy",
    "endingTimestamp", "endingOffsetsByTimestamp",
)  # fmt: skip


def isolation_level(options: Mapping[str, str]) -> str:
    """How Spark's Kafka source reads with `options` (bergstream's default: read_committed); a value that
    is neither level is refused."""
    level = str(options.get(ISOLATION_OPTION, READ_COMMITTED))
    if level.strip().lower() not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise ConfigError(
            f"{ISOLATION_OPTION} {level!r} is not a Kafka isolation level: use {READ_COMMITTED} (the "
            f"default: no record of an aborted transaction is read) or {READ_UNCOMMITTED}"
        )
    return level.strip().lower()


def kafka_stream(
    spark: SparkSession,
    topic: str,
    options: Mapping[str, str],
    max_offsets_per_trigger: int | None,
    pattern: bool = False,
) -> DataFrame:
    """The streaming DataFrame of `topic`'s records, headers included, `options` over the defaults; with
    `pattern`, `topic` is a regular expression, and the records are those of every topic whose whole name
    it matches, topics created later included."""
    reader = (
        spark.readStream.format("kafka")
        .options(**{**SOURCE_DEFAULTS, **options})
        .option("subscribePattern" if pattern else "subscribe", topic)
        .option("includeHeaders", "true")
    )
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    return reader.load()


def kafka_range(
    spark: SparkSession, topic: str, options: Mapping[str, str], starting: str, ending: str
) -> DataFrame:
    """`topic`'s records from `starting` up to `ending` (Spark's startingOffsets and endingOffsets), headers
    included, read as a batch with the streaming source's `options`."""
    kept = {key: value for key, value in options.items() if key not in _STREAMING_ONLY}
    return (
        spark.read.format("kafka")
        .options(**{**SOURCE_DEFAULTS, **kept})
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .option("startingOffsets", starting)
        .option("endingOffsets", ending)
        .load()
    )


def kafka_ranges(
    spark: SparkSession,
    options: Mapping[str, str],
    ranges: Mapping[str, tuple[Mapping[int, int], Mapping[int, int]]],
    group: str,
) -> DataFrame:
    """The records of several topics' ranges ({topic: (start, end)}, offsets per partition) read as one
    batch with the streaming source's `options`, headers included. `group`: the consumers' group id, the
    same for every read, so that Spark's executors reuse their pooled consumers from one read to the next
    (a read of its own group would open new ones for every partition)."""
    kept = {key: value for key, value in options.items() if key not in _STREAMING_ONLY}
    kept = {k: v for k, v in kept.items() if k not in ("subscribe", "subscribePattern", "assign")}
    starting = {t: {str(p): o for p, o in sorted(start.items())} for t, (start, _) in sorted(ranges.items())}
    ending = {t: {str(p): o for p, o in sorted(end.items())} for t, (_, end) in sorted(ranges.items())}
    assign = {topic: sorted(int(p) for p in offsets) for topic, offsets in ending.items()}
    return (
        spark.read.format("kafka")
        .options(**{**SOURCE_DEFAULTS, **kept})
        .option("assign", json.dumps(assign))
        .option("kafka.group.id", group)
        .option("includeHeaders", "true")
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .load()
    )
