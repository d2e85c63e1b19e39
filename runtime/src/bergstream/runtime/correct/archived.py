"""The archive holds every event a correction's rows need: on every partition of every source topic, each
record ingested before the read window's end (the window's end plus output.settle).

A router commit records, per partition, the next Kafka offset such that every record below it is in the
archive or its dead-letter table (schemas/batch_range.py). A partition is archived to a time T when:
- the archive holds a row of it ingested at or after T (the router has read past T there), or
- Kafka says so: the first record of it stamped at or after T lies below the router's position, or it has
  none and the router's position is the partition's end (a partition with no event since).
One file ingested past T anywhere in the table proves neither: one partition's router, or one region's,
may be behind while the others are not.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from bergstream.backfill.errors import BackfillConfigError
from bergstream.backfill.read.planner import CLUSTER_COLUMN, table_ref
from bergstream.kafka_settings import librdkafka_settings
from bergstream.schemas.archive import INGESTION_TS_COLUMN, METADATA
from bergstream.schemas.batch_range import BatchRange, Origin
from bergstream.timeparse import format_duration, format_instant

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from bergstream.runtime.settings import AppSettings, SourceSettings

PARTITION_COLUMN = f"{METADATA}.partition"
# The rows first looked at past T: an hour partition of the archive; later ones only for what it lacks.
_FIRST_LOOK = timedelta(hours=1)


@dataclass(frozen=True)
class Partition:
    topic: str
    cluster: str
    partition: int
    position: int  # the router's next offset

    def describe(self) -> str:
        return f"topic {self.topic} partition {self.partition} of cluster {self.cluster}"


def check_archived_to(settings: AppSettings, end: datetime) -> None:
    """Every source's archive holds every record ingested before `end`, on every partition; or an error
    naming each partition that is not archived that far and what to do."""
    from pyiceberg.exceptions import NoSuchTableError

    for name, source in settings.sources.items():
        ref = table_ref(source.table_or_topic, settings.catalog)
        try:
            table = settings.catalog.load().load_table(ref.pyiceberg_identifier)
        except NoSuchTableError as error:
            raise BackfillConfigError(
                f"{settings.app}: no archive table {ref.identifier}: a backfill reads a topic's archive; "
                "check the source's table, or route the topic first"
            ) from error
        partitions = _recorded_partitions(table)
        if not partitions:
            raise BackfillConfigError(
                f"{settings.app}: archive table {ref.identifier} records no router position: a correction "
                "needs the partitions' positions a bergstream router records with each commit"
            )
        unseen = _not_archived(table, partitions, end)
        behind = _behind_in_kafka(settings, name, source, unseen, end) if unseen else []
        if behind:
            settle = format_duration(settings.output.settle) if settings.output.settle else "unset"
            raise BackfillConfigError(
                f"{settings.app}: archive table {ref.identifier} does not hold every event ingested before "
                f"{format_instant(end)} (the window's end plus output.settle, {settle}): "
                f"{'; '.join(behind)}. The window's rows need them: wait for the router to archive them, or "
                "end the window earlier"
            )


def _recorded_partitions(table: Table) -> list[Partition]:
    """The partitions of every topic and cluster whose router commits are in the table's history, each
    with the position the newest of them records."""
    from pyiceberg.table.snapshots import ancestors_of

    newest: dict[tuple[str, str], dict[int, int]] = {}
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):  # newest first
        summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        origin = Origin.recorded(summary)
        if origin is None or (origin.topic, origin.cluster) in newest:
            continue
        recorded = BatchRange.recorded(summary, origin.topic, origin.cluster)
        if recorded is not None:
            newest[(origin.topic, origin.cluster)] = recorded.end
    return [
        Partition(topic, cluster, partition, position)
        for (topic, cluster), positions in sorted(newest.items())
        for partition, position in sorted(positions.items())
    ]


def _not_archived(table: Table, partitions: list[Partition], end: datetime) -> list[Partition]:
    """The partitions of which the archive holds no row ingested at or after `end`."""
    missing = {(p.cluster, p.partition): p for p in partitions}
    for batch in _rows_from(table, end):
        clusters = batch.column(METADATA).field("cluster").to_pylist()
        numbers = batch.column(METADATA).field("partition").to_pylist()
        for found in zip(clusters, numbers, strict=True):
            missing.pop(found, None)
        if not missing:
            break
    return list(missing.values())


def _rows_from(table: Table, end: datetime) -> Iterator[Any]:
    """The (cluster, partition) of the rows ingested at or after `end`: the first hour's, then the rest."""
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

    column, fields = INGESTION_TS_COLUMN, (CLUSTER_COLUMN, PARTITION_COLUMN)
    later = (end + _FIRST_LOOK).isoformat()
    for row_filter in (
        And(GreaterThanOrEqual(column, end.isoformat()), LessThan(column, later)),
        GreaterThanOrEqual(column, later),
    ):
        yield from table.scan(row_filter=row_filter, selected_fields=fields).to_arrow_batch_reader()


def _behind_in_kafka(
    settings: AppSettings, name: str, source: SourceSettings, partitions: list[Partition], end: datetime
) -> list[str]:
    """Of `partitions` (no archived row at or after `end`), each one Kafka does not show archived to `end`,
    described; a partition of another cluster than the source's Kafka is described as not known."""
    from confluent_kafka import Consumer, TopicPartition

    options = settings.kafka_options(name)
    reachable = "kafka.bootstrap.servers" in options
    behind = [
        f"{p.describe()}: no row ingested at or after it, and its Kafka is not reachable from here to tell "
        f"whether it had none (the application's kafka settings name no cluster {p.cluster})"
        for p in partitions
        if not reachable or p.cluster != source.cluster
    ]
    asked = [p for p in partitions if reachable and p.cluster == source.cluster]
    if not asked:
        return behind
    consumer = Consumer({**librdkafka_settings(options, "kafka."), "group.id": "bergstream-correction-check",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})  # fmt: skip
    try:
        millis = int(end.timestamp() * 1000)
        stamped = consumer.offsets_for_times(
            [TopicPartition(p.topic, p.partition, millis) for p in asked], timeout=15
        )
        for p, first in zip(asked, stamped, strict=True):
            if first.offset >= 0:
                if p.position <= first.offset:
                    behind.append(
                        f"{p.describe()}: the router is at offset {p.position}, Kafka's first record stamped "
                        f"at or after it is at offset {first.offset}"
                    )
                continue
            _, next_offset = consumer.get_watermark_offsets(
                TopicPartition(p.topic, p.partition), timeout=15, cached=False
            )
            if p.position < next_offset:
                behind.append(
                    f"{p.describe()}: the router is at offset {p.position} of {next_offset}, Kafka holding "
                    "no record stamped at or after it"
                )
    finally:
        consumer.close()
    return behind
