"""Where an application bootstrapped from the archive goes over to Kafka: per source, the newest router
commit of its topic and cluster in the table's current history, and the Kafka position it records.

The archive phase reads that snapshot; the Kafka phase starts at exactly its next offsets, in every
partition the router had, so that each offset is read once: from the archive if the router archived it
(and it is in the window), from Kafka otherwise. A partition added to the topic since is read from its
start. The position must still be in Kafka: a hand-over offset that retention has passed is refused,
naming the topic, partition, hand-over offset and the earliest offset Kafka still has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bergstream.backfill.errors import BackfillConfigError
from bergstream.backfill.read.order import Window
from bergstream.backfill.read.planner import TableRef, from_micros, rows_read, table_ref
from bergstream.backfill.read.split import Micros, Split
from bergstream.catalog import CatalogConfig
from bergstream.schemas.positions import BatchRange, offsets_json
from bergstream.timeparse import format_instant

# A bootstrap's archive phase is planned up to here (parse.py's latest event time), then cut at the newest
# row of its pinned snapshots. Kafka's own timestamps are not bounded: see refuse_rows_past.
END_OF_TIME: Micros = 7_258_118_400 * 1_000_000


@dataclass(frozen=True)
class Handover:
    """A source's pinned snapshot and the Kafka position its archive ends at."""

    table: str  # catalog.namespace.table
    topic: str
    cluster: str
    snapshot_id: int
    offsets: dict[int, int]  # per partition, the next offset to read from Kafka

    def to_json(self) -> dict[str, Any]:
        offsets = {str(partition): offset for partition, offset in sorted(self.offsets.items())}
        return {
            "topic": self.topic,
            "cluster": self.cluster,
            "snapshot_id": self.snapshot_id,
            "offsets": offsets,
        }

    @classmethod
    def from_json(cls, table: str, data: Mapping[str, Any]) -> Handover:
        offsets = {int(partition): int(offset) for partition, offset in data["offsets"].items()}
        return cls(table, data["topic"], data["cluster"], int(data["snapshot_id"]), offsets)

    def describe(self) -> str:
        listed = ", ".join(f"p{partition}: {offset}" for partition, offset in sorted(self.offsets.items()))
        return f"{self.topic} at {listed} (snapshot {self.snapshot_id} of {self.table})"


def pin_handover(catalog: CatalogConfig, ref: TableRef, topic: str, cluster: str) -> Handover:
    """The newest router commit of `topic` from `cluster` in the current history of table `ref`."""
    handover = recorded_handover(catalog, ref, topic, cluster)
    if handover is None:
        raise BackfillConfigError(
            f"table {ref.identifier} records no Kafka position of topic {topic} read from cluster {cluster}: "
            "no router commit of this bergstream version is in its history (run the router, or check the "
            "source's topic and cluster)"
        )
    return handover


def recorded_handover(
    catalog: CatalogConfig, ref: TableRef, topic: str, cluster: str, snapshot_id: int | None = None
) -> Handover | None:
    """The newest router commit of `topic` from `cluster` at or before `snapshot_id` (default: the current
    snapshot) in table `ref`'s history; None when there is none."""
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.table.snapshots import ancestors_of

    try:
        table = catalog.load().load_table(ref.pyiceberg_identifier)
    except NoSuchTableError as error:
        raise BackfillConfigError(f"table {ref.identifier} does not exist in the catalog") from error
    newest = table.current_snapshot() if snapshot_id is None else table.snapshot_by_id(snapshot_id)
    history = (
        (snapshot.snapshot_id, snapshot.summary.additional_properties if snapshot.summary is not None else {})
        for snapshot in ancestors_of(newest, table.metadata)
    )
    return newest_handover(history, ref.identifier, topic, cluster)


def newest_handover(
    history: Iterable[tuple[int, Mapping[str, str]]], table: str, topic: str, cluster: str
) -> Handover | None:
    """The hand-over the newest router commit of `topic` from `cluster` records, in `history`: a snapshot's
    ancestors as (snapshot id, summary properties), newest first. Snapshots that record no position of
    them (compactions, other topics' or clusters' commits) are passed over; None when none records one."""
    for snapshot_id, summary in history:
        recorded = BatchRange.recorded(summary, topic, cluster)
        if recorded is not None:
            return Handover(table, topic, cluster, snapshot_id, recorded.end)
    return None


def archive_window(start: Micros, splits: Iterable[Split]) -> Window:
    """The window of a bootstrap's archive phase: from `start` to just past the newest ingestion time the
    pinned snapshot's files of it may hold, so that every archived row from `start` on is read whatever its
    timestamp, and the epochs end with the archive."""
    end = max((split.upper + 1 for split in splits), default=start + 1)
    return Window(start, max(end, start + 1))


def refuse_rows_past(catalog: CatalogConfig, handover: Handover, end: Micros = END_OF_TIME) -> None:
    """Refuse a pinned snapshot holding rows of the hand-over's cluster stamped by Kafka at or after `end`,
    where the archive phase's plan ends: below the hand-over, they would be read neither from the archive
    nor from Kafka. A broker takes such timestamps when the topic's `message.timestamp.after.max.ms` allows
    timestamps that far in the future."""
    ref = table_ref(handover.table, catalog)
    table = catalog.load().load_table(ref.pyiceberg_identifier)
    row_filter = rows_read(table, end, 2**63 - 1, [handover.cluster])
    past = table.scan(
        row_filter=row_filter, snapshot_id=handover.snapshot_id, selected_fields=("__metadata__",)
    )
    rows = past.to_arrow().num_rows
    if rows:
        raise BackfillConfigError(
            f"table {ref.identifier}: snapshot {handover.snapshot_id} holds {rows:,} row(s) of cluster "
            f"{handover.cluster} below the hand-over stamped by Kafka at or after "
            f"{format_instant(from_micros(end))}: a bootstrap reads the archive in ingestion order up to "
            "then, so it would read them neither from the archive nor from Kafka. Run the application live "
            "from Kafka, or backfill it up to a time before them"
        )


def refuse_lost_handover(handover: Handover, client_config: Mapping[str, str]) -> None:
    """Refuse a hand-over whose offsets Kafka no longer holds, or a partition Kafka no longer has."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {**client_config, "group.id": "bergstream-handover-check", "enable.auto.commit": False}
    )
    try:
        metadata = consumer.list_topics(handover.topic, timeout=15).topics.get(handover.topic)
        if metadata is None or metadata.error is not None:
            why = "it does not exist" if metadata is None else str(metadata.error)
            raise BackfillConfigError(f"topic {handover.topic}: cannot hand over to it: {why}")
        for partition, offset in sorted(handover.offsets.items()):
            if partition not in metadata.partitions:
                raise BackfillConfigError(
                    f"topic {handover.topic} partition {partition}: the hand-over position "
                    f"{offsets_json(handover.offsets)} names a partition Kafka no longer has (was the topic "
                    "deleted and made again?)"
                )
            earliest, next_offset = consumer.get_watermark_offsets(
                TopicPartition(handover.topic, partition), timeout=15, cached=False
            )
            if offset < earliest or offset > next_offset:
                lost = "no longer holds" if offset < earliest else "has not reached"
                raise BackfillConfigError(
                    f"Kafka {lost} the hand-over offset: topic {handover.topic} partition {partition}, "
                    f"hand-over offset {offset}, earliest offset {earliest}, next offset {next_offset}"
                )
    finally:
        consumer.close()
