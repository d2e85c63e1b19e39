"""`bergstream router aborted`: records of aborted transactions in a topic's tables, found and removed.

A router that read uncommitted records (Spark's default, and bergstream's before read_committed was its
own) archived the records of aborted transactions beside the committed ones. They are the tables' rows, of
the router's cluster, whose offsets a read_committed read of the topic does not return. That can be told
only where Kafka still holds the offsets: from each partition's earliest offset up to its last stable
offset. Rows below it (deleted by retention) and at or past it (a transaction still open) are counted
as not checked.

The whole range Kafka holds is read once, as a batch, its keys alone kept. With `delete`, each table's
aborted rows go in one commit, made again on fresh metadata if it loses to a router's append.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bergstream.kafka_source import ISOLATION_OPTION, READ_COMMITTED, kafka_range
from bergstream.router.config import RouterConfig
from bergstream.router.consumer_group import GroupCommitter
from bergstream.router.maintain import until_committed
from bergstream.schemas.archive import DEAD_LETTER_SUFFIX, METADATA

log = logging.getLogger("bergstream.router")
REMOVED_PROPERTY = "bergstream.aborted.removed"


@dataclass
class TableAborted:
    table: str
    aborted: dict[int, int] = field(default_factory=dict)  # partition: aborted rows found
    unchecked: int = 0  # rows outside what Kafka holds, which cannot be told apart
    deleted_in: int | None = None  # the snapshot of the delete

    @property
    def total(self) -> int:
        return sum(self.aborted.values())


@dataclass
class AbortedReport:
    topic: str
    cluster: str
    checked: dict[int, tuple[int, int]]  # partition: [earliest, last stable) offsets read
    tables: list[TableAborted]
    delete: bool

    def lines(self) -> list[str]:
        ranges = ", ".join(f"p{p}: {a} to {b - 1}" for p, (a, b) in sorted(self.checked.items()) if b > a)
        lines = [f"{self.topic} (cluster {self.cluster}): offsets checked against Kafka: {ranges or 'none'}"]
        for table in self.tables:
            per = ", ".join(f"p{p}: {n:,}" for p, n in sorted(table.aborted.items())) or "none"
            done = (
                f"; deleted in snapshot {table.deleted_in}"
                if table.deleted_in is not None
                else ("" if not table.total or self.delete else "; run again with --delete to remove them")
            )
            lines.append(
                f"{table.table}: {table.total:,} rows of aborted transactions ({per}){done}; "
                f"{table.unchecked:,} rows outside Kafka's offsets not checked"
            )
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "cluster": self.cluster,
            "checked": {str(p): [a, b] for p, (a, b) in sorted(self.checked.items())},
            "delete": self.delete,
            "tables": [
                {
                    "table": t.table,
                    "aborted": t.total,
                    "per_partition": {str(p): n for p, n in sorted(t.aborted.items())},
                    "unchecked": t.unchecked,
                    "deleted_in": t.deleted_in,
                }
                for t in self.tables
            ],
        }


def find_aborted(spark: SparkSession, config: RouterConfig, delete: bool = False) -> AbortedReport:
    """The rows of aborted transactions in the topic's archive and dead-letter tables; with `delete`,
    removed."""
    topic = config.settings.topic
    kafka = GroupCommitter(
        topic, config.settings.consumer_group, config.query.kafka_client_config(), READ_COMMITTED
    )
    try:
        kafka.require_topic()
        checked = {p: (low, high) for p, (low, high) in kafka.watermarks().items()}
    finally:
        kafka.close()
    ending = json.dumps({topic: {str(p): high for p, (_, high) in checked.items()}})
    options = {**config.query.kafka, ISOLATION_OPTION: READ_COMMITTED}
    committed = (
        kafka_range(spark, topic, options, "earliest", ending)
        .select(F.col("partition").alias("p"), F.col("offset").alias("o"))
        .localCheckpoint()
    )
    report = AbortedReport(topic, config.query.cluster, checked, [], delete)
    for name in (config.settings.table, config.settings.table + DEAD_LETTER_SUFFIX):
        identifier = config.query.catalog.table_identifier(name)
        report.tables.append(_in_table(spark, config, identifier, checked, committed, delete))
    return report


def _in_table(
    spark: SparkSession,
    config: RouterConfig,
    identifier: str,
    checked: dict[int, tuple[int, int]],
    committed: DataFrame,
    delete: bool,
) -> TableAborted:
    found = TableAborted(identifier)
    rows = spark.table(identifier).where(F.col(f"{METADATA}.cluster") == config.query.cluster)
    keys = rows.select(F.col(f"{METADATA}.partition").alias("p"), F.col(f"{METADATA}.offset").alias("o"))
    bounds = spark.createDataFrame(
        [(p, low, high) for p, (low, high) in checked.items()], "p int, low long, high long"
    )
    placed = keys.join(bounds, "p", "left")
    inside = (F.col("o") >= F.col("low")) & (F.col("o") < F.col("high"))
    found.unchecked = placed.where(~inside | F.col("low").isNull()).count()
    aborted = placed.where(inside).select("p", "o").join(committed, ["p", "o"], "left_anti").localCheckpoint()
    found.aborted = {int(row.p): int(row["count"]) for row in aborted.groupBy("p").count().collect()}
    if not delete or not found.total:
        return found
    view = f"bergstream_aborted_{uuid.uuid4().hex}"
    aborted.createOrReplaceTempView(view)
    property_key = f"spark.sql.iceberg.snapshot-property.{REMOVED_PROPERTY}"
    spark.conf.set(property_key, str(found.total))
    try:
        until_committed(
            spark, identifier, "removing aborted records",
            lambda: spark.sql(
                f"DELETE FROM {identifier} WHERE {METADATA}.cluster = '{config.query.cluster}' AND "
                f"({METADATA}.partition, {METADATA}.offset) IN (SELECT p, o FROM {view})"
            ).collect(),
        )  # fmt: skip
    finally:
        spark.conf.unset(property_key)
        spark.catalog.dropTempView(view)
    snapshot = spark.sql(
        f"SELECT snapshot_id FROM {identifier}.snapshots WHERE summary['{REMOVED_PROPERTY}'] IS NOT NULL "
        "ORDER BY committed_at DESC LIMIT 1"
    ).first()
    found.deleted_in = None if snapshot is None else int(snapshot.snapshot_id)
    log.warning("%s: %d rows of aborted transactions deleted", identifier, found.total)
    return found
