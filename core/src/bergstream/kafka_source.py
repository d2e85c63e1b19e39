"""Spark's Kafka source for one topic, as the router and an application's live named sources read it; and
one range of it as a batch read.

Options keep the names of Spark's Kafka source (`kafka.bootstrap.servers`, `startingOffsets`, ...); the
defaults below are bergstream's, and a user's settings override each of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SOURCE_DEFAULTS = {
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
