"""Where an application bootstrapped from the archive goes over to Kafka: per source, the newest router
commit of its topic and cluster in the table's current history and the Kafka position it records, read at
the table's current snapshot.

The archive phase reads that snapshot: the router commit's rows, and those of every later commit that adds
rows below the position (a redrive of dead letters); no row of the snapshot may lie at or past the position
(`refuse_rows_at_or_past`). The Kafka phase starts at exactly the position, in every partition the router
had, so that each committed record is read once: from the archive if the router archived it (and it is in
the window), from Kafka otherwise. A partition added to the topic since is read from its start. The
position must still be in Kafka: a hand-over offset that retention has passed is refused, naming the topic,
partition, hand-over offset and the earliest offset Kafka still has.

Kafka is asked at the isolation level the archive was read with (both checks: this one, and the source's
own at the switch), and the Kafka phase must read at that level too: an archive of committed records handed
over to a reader of uncommitted ones (or the other way round) would not be one topic read one way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bergstream.backfill.errors import BackfillConfigError
from bergstream.backfill.read.order import Window
from bergstream.backfill.read.planner import CLUSTER_COLUMN, TableRef, from_micros, rows_read, table_ref
from bergstream.backfill.read.split import Micros, Split
from bergstream.catalog import CatalogConfig
from bergstream.kafka_source import READ_COMMITTED, READ_UNCOMMITTED
from bergstream.kafka_topics import topic_ids
from bergstream.schemas.archive import METADATA
from bergstream.schemas.batch_range import ISOLATION_LEVEL, TOPIC_ID, BatchRange, offsets_json
from bergstream.timeparse import format_instant

log = logging.getLogger(__name__)
# A bootstrap's archive phase is planned up to here (checks.py's latest event time), then cut at the newest
# row of its pinned snapshots. Kafka's own timestamps are not bounded: see refuse_rows_past.
END_OF_TIME: Micros = 7_258_118_400 * 1_000_000
_PARTITION_COLUMN = f"{METADATA}.partition"
_OFFSET_COLUMN = f"{METADATA}.offset"


@dataclass(frozen=True)
class Handover:
    """A source's pinned snapshot and the Kafka position its archive ends at."""

    table: str  # catalog.namespace.table
    topic: str
    cluster: str
    snapshot_id: int  # the snapshot the archive phase reads
    offsets: dict[int, int]  # per partition, the next offset to read from Kafka
    # The level the archive was read with, which Kafka is asked at; None where the router commit does not
    # record it (bergstream before levels were recorded read with Spark's default, read_uncommitted).
    isolation_level: str | None = None
    topic_id: str | None = None  # Kafka's id of the topic the router read, where recorded
    positioned_at: int | None = None  # the router commit that recorded the offsets, when not snapshot_id

    def to_json(self) -> dict[str, Any]:
        offsets = {str(partition): offset for partition, offset in sorted(self.offsets.items())}
        document: dict[str, Any] = {
            "topic": self.topic,
            "cluster": self.cluster,
            "snapshot_id": self.snapshot_id,
            "offsets": offsets,
        }
        for key, value in (
            ("isolation_level", self.isolation_level),
            ("topic_id", self.topic_id),
            ("positioned_at", self.positioned_at),
        ):
            if value is not None:
                document[key] = value
        return document

    @classmethod
    def from_json(cls, table: str, data: Mapping[str, Any]) -> Handover:
        offsets = {int(partition): int(offset) for partition, offset in data["offsets"].items()}
        positioned_at = data.get("positioned_at")
        return cls(
            table, data["topic"], data["cluster"], int(data["snapshot_id"]), offsets,
            data.get("isolation_level"), data.get("topic_id"),
            None if positioned_at is None else int(positioned_at),
        )  # fmt: skip

    @property
    def position_snapshot(self) -> int:
        """The router commit whose position this is."""
        return self.snapshot_id if self.positioned_at is None else self.positioned_at

    def describe(self) -> str:
        listed = ", ".join(f"p{partition}: {offset}" for partition, offset in sorted(self.offsets.items()))
        return f"{self.topic} at {listed} (snapshot {self.snapshot_id} of {self.table})"


def pin_handover(catalog: CatalogConfig, ref: TableRef, topic: str, cluster: str) -> Handover:
    """The newest router commit of `topic` from `cluster` in the current history of table `ref`, read at the
    table's current snapshot."""
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
    """The hand-over at `snapshot_id` (default: the current snapshot) of table `ref`: the newest router
    commit of `topic` from `cluster` at or before it; None when there is none."""
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
    """The hand-over at the head of `history` (a snapshot's ancestors as (snapshot id, summary properties),
    newest first): the position the newest router commit of `topic` from `cluster` records, read at the
    head. Snapshots that record no position of them (compactions, redrives, other topics' or clusters'
    commits) are passed over for the position, and read; None when no snapshot records one."""
    head: int | None = None
    for snapshot_id, summary in history:
        head = snapshot_id if head is None else head
        recorded = BatchRange.recorded(summary, topic, cluster)
        if recorded is not None:
            return Handover(
                table, topic, cluster, head, recorded.end, summary.get(ISOLATION_LEVEL),
                summary.get(TOPIC_ID), None if snapshot_id == head else snapshot_id,
            )  # fmt: skip
    return None


def agreed_isolation_level(handover: Handover, reads_with: str) -> Handover:
    """The hand-over with the isolation level both checks ask Kafka at: the archive's. A source that reads
    Kafka at another level than the archive was read with is refused; an archive that does not record its
    level (written before levels were recorded, read_uncommitted) is accepted for a source of either, with a
    warning, and Kafka is asked at the source's."""
    recorded = handover.isolation_level
    if recorded is None:
        log.warning(
            "%s: the router commits of topic %s do not record the isolation level they read with (written "
            "before levels were recorded, so read with %s): if a transactional producer writes the topic, "
            "the archive may hold records of aborted transactions: `bergstream router aborted --topic %s` "
            "finds them",
            handover.table, handover.topic, READ_UNCOMMITTED, handover.topic,
        )  # fmt: skip
        return Handover(**{**handover.__dict__, "isolation_level": reads_with})
    if recorded != reads_with:
        raise BackfillConfigError(
            f"topic {handover.topic}: the archive in {handover.table} was read with isolation level "
            f"{recorded} (snapshot {handover.position_snapshot}), and this source reads Kafka with "
            f"{reads_with}: one bootstrap would read the topic two ways. Set kafka.isolation.level: "
            f"{recorded} on the source, or archive the topic again at the level wanted"
        )
    return handover


def refuse_rows_at_or_past(catalog: CatalogConfig, handover: Handover) -> None:
    """Refuse a pinned snapshot holding a row of the hand-over's cluster at or past its offsets, or of a
    partition it has none for: Kafka's phase would read that record again. Only the files added since the
    router commit that recorded the position are read (a redrive's rows lie below it)."""
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, NotIn, Or
    from pyiceberg.io.pyarrow import ArrowScan

    if handover.positioned_at is None:
        return
    ref = table_ref(handover.table, catalog)
    table = catalog.load().load_table(ref.pyiceberg_identifier)
    row_filter = NotIn(_PARTITION_COLUMN, set(handover.offsets))
    for partition, offset in handover.offsets.items():
        row_filter = Or(
            row_filter, And(EqualTo(_PARTITION_COLUMN, partition), GreaterThanOrEqual(_OFFSET_COLUMN, offset))
        )
    row_filter = And(EqualTo(CLUSTER_COLUMN, handover.cluster), row_filter)
    positioned = table.snapshot_by_id(handover.positioned_at)
    known: set[str] = set()
    if positioned is not None:
        known = {task.file.file_path for task in table.scan(snapshot_id=positioned.snapshot_id).plan_files()}
    added = [
        task
        for task in table.scan(snapshot_id=handover.snapshot_id, row_filter=row_filter).plan_files()
        if task.file.file_path not in known
    ]
    if not added:
        return
    schema = table.schema().select(_PARTITION_COLUMN, _OFFSET_COLUMN)
    found = ArrowScan(table.metadata, table.io, schema, row_filter).to_table(added)
    if found.num_rows:
        first = found.column(METADATA)[0].as_py()
        raise BackfillConfigError(
            f"table {ref.identifier}: snapshot {handover.snapshot_id} holds {found.num_rows:,} row(s) of "
            f"topic {handover.topic} (cluster {handover.cluster}) at or past the position its router "
            f"recorded in snapshot {handover.position_snapshot}, {offsets_json(handover.offsets)}, e.g. "
            f"partition {first['partition']} offset {first['offset']}: written by a commit that records no "
            "position (not a router's), Kafka's phase would read them again. Find the commit in the table's "
            "history and roll it back, or bootstrap from a snapshot before it"
        )


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


def refuse_another_topic(handover: Handover, client_config: Mapping[str, str]) -> None:
    """Refuse a hand-over to a topic that is not the one archived: deleted and created again under its
    name since, its offsets started over. A router commit that records no topic id is not checked."""
    from confluent_kafka.admin import AdminClient

    if handover.topic_id is None:
        return
    current = topic_ids(AdminClient(dict(client_config)), [handover.topic]).get(handover.topic)
    if current is not None and current != handover.topic_id:
        raise BackfillConfigError(
            f"topic {handover.topic}: Kafka's topic of that name has id {current}, and the router commit "
            f"that records the hand-over (snapshot {handover.position_snapshot} of {handover.table}) records "
            f"id {handover.topic_id}: the topic was deleted and created again, and its offsets started over, "
            f"so {offsets_json(handover.offsets)} is not where the archive ends in it. Run the application "
            "live, or bootstrap it from an archive of the new topic (a router of its own from its start)"
        )


def refuse_lost_handover(handover: Handover, client_config: Mapping[str, str]) -> None:
    """Refuse a hand-over whose offsets Kafka no longer holds, or a partition Kafka no longer has; Kafka is
    asked at the hand-over's isolation level, as the source's own check at the switch asks it."""
    from confluent_kafka import Consumer, TopicPartition

    # Its next offsets are the last stable offsets at read_committed, the high watermarks otherwise: what
    # the Kafka phase, reading at the archive's level, can read up to.
    level = handover.isolation_level or READ_COMMITTED
    consumer = Consumer(
        {**client_config, "group.id": "bergstream-handover-check", "enable.auto.commit": False,
         "isolation.level": level}
    )  # fmt: skip
    try:
        metadata = consumer.list_topics(handover.topic, timeout=15).topics.get(handover.topic)
        if metadata is None or metadata.error is not None:
            why = "it does not exist" if metadata is None else str(metadata.error)
            raise BackfillConfigError(f"topic {handover.topic}: cannot hand over to it: {why}")
        refuse_another_topic(handover, client_config)
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
