"""Spark's Kafka source for one topic, as the router and an application's live named sources read it.

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


def kafka_stream(
    spark: SparkSession, topic: str, options: Mapping[str, str], max_offsets_per_trigger: int | None
) -> DataFrame:
    """The streaming DataFrame of `topic`'s records, headers included, `options` over the defaults."""
    reader = (
        spark.readStream.format("kafka")
        .options(**{**SOURCE_DEFAULTS, **options})
        .option("subscribe", topic)
        .option("includeHeaders", "true")
    )
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    return reader.load()
