"""The pending dead letters of a topic, parsed again as the router parses, each with its outcome: redriven,
already archived, or still failing with the reason the parser gives now."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from bergstream.router.redrive.outcomes import ALREADY_ARCHIVED, REDRIVEN, STILL_FAILING, RedriveCounts
from bergstream.router.redrive.snapshots import RedriveTables
from bergstream.router.transform import RecordSplitter
from bergstream.schemas.archive import INGESTION_TS, METADATA, REDRIVE_ID, REDRIVEN_AT

# A dead letter and its archive row are the same Kafka record: these columns of the Kafka-shaped rows.
KEY_COLUMNS = ("topic", "partition", "offset", "timestamp")
_PREVIOUS_REASON = "_redrive_previous_reason"
_ORIGINAL_METADATA = "_redrive_metadata"
_IN_ARCHIVE = "_redrive_in_archive"
_OUTCOME = "_redrive_outcome"
_REASON = "_redrive_reason"
# Up to this many dead letters, their keys are broadcast to find those the archive already holds.
_BROADCAST_KEYS = 1_000_000


def pending(tables: RedriveTables, snapshot: int, reason: str | None) -> DataFrame:
    """The dead letters of `snapshot` not redriven yet, whose reason contains `reason`."""
    rows = tables.session.sql(f"SELECT * FROM {tables.dead_letters} VERSION AS OF {snapshot}")
    # A snapshot taken before the table gained the marks reads with its own columns: nothing is marked.
    if REDRIVE_ID in rows.columns:
        rows = rows.where(F.col(REDRIVE_ID).isNull())
    if reason is not None:
        rows = rows.where(F.col("error").contains(reason))
    return rows


def kafka_records(dead_letters: DataFrame) -> DataFrame:
    """Dead letters as the rows of Spark's Kafka source that they were read from, with their reason and
    their `__metadata__` alongside."""
    metadata = F.col(METADATA)
    return dead_letters.select(
        F.col("raw_key").alias("key"),
        F.col("raw_value").alias("value"),
        metadata["topic"].alias("topic"),
        metadata["partition"].alias("partition"),
        metadata["offset"].alias("offset"),
        metadata[INGESTION_TS].alias("timestamp"),
        F.when(metadata["timestamp_type"] == "LogAppendTime", 1).otherwise(0).alias("timestampType"),
        metadata["headers"].alias("headers"),
        F.col("error").alias(_PREVIOUS_REASON),
        metadata.alias(_ORIGINAL_METADATA),
    )


def archive_keys(metadata: Column) -> list[Column]:
    """KEY_COLUMNS from an archive row's `__metadata__`."""
    return [
        metadata["topic"].alias("topic"),
        metadata["partition"].alias("partition"),
        metadata["offset"].alias("offset"),
        metadata[INGESTION_TS].alias("timestamp"),
    ]


def classify(
    tables: RedriveTables,
    splitter: RecordSplitter,
    dead_letters: DataFrame,
    rows: int,
    lower: int,
    upper: int,
) -> DataFrame:
    """The `pending` dead letters parsed as the router parses, with their outcome and their reason now.

    The Kafka source's columns rebuilt from a dead letter stamp the same `__metadata__` again; the router's
    write time is the redrive's, and the cluster and timestamp type stay those the dead letter has."""
    metadata = F.col(METADATA)
    original = F.col(_ORIGINAL_METADATA)
    stamped = splitter.stamp(kafka_records(dead_letters)).withColumn(
        METADATA,
        metadata.withField("cluster", original["cluster"]).withField(
            "timestamp_type", original["timestamp_type"]
        ),
    )
    # The archive's rows of the dead letters' hours are streamed past the dead letters' keys, which are
    # sent to every task while there are not too many: the archive is never shuffled.
    keys = stamped.select(*KEY_COLUMNS)
    ingested = metadata[INGESTION_TS]
    archived = (
        tables.session.table(tables.archive)
        .where(ingested.between(F.timestamp_micros(F.lit(lower)), F.timestamp_micros(F.lit(upper))))
        .select(*archive_keys(metadata))
        .join(F.broadcast(keys) if rows <= _BROADCAST_KEYS else keys, list(KEY_COLUMNS), "left_semi")
        .distinct()
        .withColumn(_IN_ARCHIVE, F.lit(True))
    )
    joined = stamped.join(archived, list(KEY_COLUMNS), "left")
    outcome = (
        F.when(F.col(_IN_ARCHIVE).isNotNull(), F.lit(ALREADY_ARCHIVED))
        .when(splitter.valid, F.lit(REDRIVEN))
        .otherwise(F.lit(STILL_FAILING))
    )
    return joined.withColumn(_OUTCOME, outcome).withColumn(
        _REASON, F.when(F.col(_OUTCOME) == STILL_FAILING, splitter.reason)
    )


def count_outcomes(classified: DataFrame) -> RedriveCounts:
    """The outcomes of the classified dead letters, by their previous reason."""
    groups = (
        classified.groupBy(
            _PREVIOUS_REASON,
            _OUTCOME,
            F.coalesce(F.col(_REASON) != F.col(_PREVIOUS_REASON), F.lit(False)),
        )
        .count()
        .collect()
    )
    return RedriveCounts.tally((row[0], row[1], bool(row[2]), int(row[3])) for row in groups)


def redriven_rows(classified: DataFrame, splitter: RecordSplitter) -> DataFrame:
    """The archive rows of the dead letters that parse now, one per Kafka record."""
    return (
        classified.where(F.col(_OUTCOME) == REDRIVEN)
        .dropDuplicates(list(KEY_COLUMNS))
        .select(*splitter.archive_columns)
    )


def marks(classified: DataFrame, redrive_id: str, redriven_at: Column) -> DataFrame:
    """What changes in the dead-letter table (KEY_COLUMNS, redrive_id, redriven_at, reason): the marks of
    the dead letters redriven or already archived, and the reasons that changed of those still failing."""
    marked = F.col(_OUTCOME) != STILL_FAILING
    return classified.where(marked | (F.col(_REASON) != F.col(_PREVIOUS_REASON))).select(
        *KEY_COLUMNS,
        F.when(marked, F.lit(redrive_id)).alias(REDRIVE_ID),
        F.when(marked, redriven_at).alias(REDRIVEN_AT),
        F.col(_REASON).alias("reason"),
    )
