"""A bootstrap's sources (`app run --from`): each source is both the archive and Kafka, in one query. The
`bergstream-hybrid` source reads the archive from `--from` in the backfill's aligned epochs, up to where the
pinned snapshot records that the archive ends in Kafka (backfill/read/handover.py), then Spark's own Kafka
reader from exactly there. Its rows carry Kafka's columns, or the archive row in `__archive__`; one projection
parses the Kafka rows as the router does and yields the same columns for both.

Its plan is a backfill's (sources_backfill.py), with the hand-overs pinned at its first run and kept beside
the checkpoint, its window ending with the archive; once the query has switched to Kafka, the archive is read
no more and its snapshot is released, for maintenance to expire: a restart then needs only what the first run
kept beside the checkpoint (the epochs, and the archive row's type), never the snapshot.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from bergstream.backfill.read.handover import (
    END_OF_TIME,
    Handover,
    agreed_isolation_level,
    archive_window,
    pin_handover,
    refuse_lost_handover,
    refuse_rows_at_or_past,
    refuse_rows_past,
)
from bergstream.backfill.read.order import Epoch, OrderingPolicy, Window
from bergstream.backfill.read.planner import BackfillPlan, TableScan, table_ref, to_micros
from bergstream.kafka_settings import librdkafka_settings
from bergstream.kafka_source import SOURCE_DEFAULTS, isolation_level
from bergstream.runtime.pins import release
from bergstream.runtime.sources import ARCHIVE, HYBRID_FORMAT, PLAN_DIR
from bergstream.runtime.sources_backfill import BackfillSources
from bergstream.schemas.archive import METADATA, METADATA_TYPE
from bergstream.schemas.parse import ERROR
from bergstream.schemas.spark_types import optional
from bergstream.schemas.stamp import metadata
from bergstream.timeparse import parse_duration

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from bergstream.runtime.settings import AppSettings

log = logging.getLogger("bergstream.runtime.sources")


class BootstrapSources(BackfillSources):
    """A bootstrap's sources: the archive from `--from`, then Kafka from where the archive ends."""

    def __init__(
        self, spark: SparkSession, settings: AppSettings, stopping: threading.Event | None = None
    ) -> None:
        super().__init__(spark, settings, stopping)
        self._handovers: dict[str, Handover] = {}

    def _stream(self, name: str) -> DataFrame:
        from pyspark.sql import functions as F

        settings = self.settings
        source = settings.sources[name]
        backfill_plan = self.plan()
        table = table_ref(source.table_or_topic, settings.catalog).identifier
        handover = self._handovers[table]
        path = f"{PLAN_DIR}/{name}.json"
        # The archive row's type, as the source found it at the pinned snapshot on its first run.
        archive_type = f"{PLAN_DIR}/{name}.archive-type.json"
        # The archive's rows of this source's region alone: Kafka takes over from its cluster, and the other
        # sources' regions are theirs (the plan's epochs and files cover every source's).
        source_plan = {
            **backfill_plan.source_plan(table, name),
            "regions": [source.cluster],
            "handover": handover.to_json(),
        }
        kafka_alone = self._switched() and self.files.exists(archive_type)
        if kafka_alone:
            # The source reads the archive no more: it takes the row type kept, not the snapshot's.
            source_plan["archive_schema"] = json.loads(self.files.read_text(archive_type))
        self.files.write_text(path, json.dumps(source_plan))
        options = {
            **SOURCE_DEFAULTS,
            **{k: v for k, v in settings.kafka_options(name).items() if k != "startingOffsets"},
        }
        max_offsets = settings.max_offsets(name)
        if max_offsets is not None:
            options["maxOffsetsPerTrigger"] = str(max_offsets)
        if self.paced and "minOffsetsPerTrigger" not in options:
            # Kafka's batches wait for this many records or for the trigger interval, whichever first.
            options["minOffsetsPerTrigger"] = str(2**62)
            interval = parse_duration(settings.trigger_interval, "trigger_interval")
            options["maxTriggerDelay"] = f"{interval // timedelta(milliseconds=1)}ms"
        records = (
            self.spark.readStream.format(HYBRID_FORMAT)
            .option("plan", self.files.uri(path))
            .options(**options)
            .load()
        )
        if not kafka_alone and not self.files.exists(archive_type):
            # Spark's own JSON of the type: read back, the query has exactly the schema it has now.
            jvm_schema: Any = records._jdf.schema()
            self.files.write_text(archive_type, str(jvm_schema.apply(ARCHIVE).dataType().json()))
        layout, parser = self._parser(name)
        archived = records.schema[ARCHIVE].dataType
        assert hasattr(archived, "fieldNames"), "the archive row is a struct"
        present = set(archived.fieldNames())
        is_archive = F.col(ARCHIVE).isNotNull()
        parsed = parser.parse(records, metadata(source.cluster))
        columns = []
        for field in layout.event_type.fields:
            from_archive = F.col(f"{ARCHIVE}.{field.name}") if field.name in present else F.lit(None)
            from_kafka = F.col(f"event.{field.name}")
            columns.append(
                F.when(is_archive, from_archive.cast(optional(field.dataType)))
                .otherwise(from_kafka)
                .alias(field.name)
            )
        archived_metadata = F.struct(
            *[
                F.col(f"{ARCHIVE}.{METADATA}.{f.name}").cast(optional(f.dataType)).alias(f.name)
                for f in METADATA_TYPE.fields
            ]
        )
        columns.append(F.when(is_archive, archived_metadata).otherwise(F.col(METADATA)).alias(METADATA))
        return parsed.where(is_archive | F.col(ERROR).isNull()).select(*columns)

    def _window(self) -> Window:
        assert self.settings.backfill.start is not None, "validated by AppSettings"
        return Window(to_micros(self.settings.backfill.start), END_OF_TIME)

    def _asked(self, request: dict[str, Any]) -> None:
        request["mode"] = "bootstrap"
        request["regions"] = sorted({source.cluster for source in self.settings.sources.values()})

    def _resumed(self, pinned: dict[str, Any]) -> None:
        self._handovers = {
            table: Handover.from_json(table, handover)
            for table, handover in pinned.get("handovers", {}).items()
        }

    def _first_snapshots(self) -> dict[str, int | None] | None:
        self._handovers = self._pin_handovers()
        for handover in self._handovers.values():
            refuse_rows_past(self.settings.catalog, handover)
        return {table: handover.snapshot_id for table, handover in self._handovers.items()}

    def _planned(
        self,
        tables: list[str],
        window: Window,
        policy: OrderingPolicy,
        regions: list[str] | None,
        snapshots: dict[str, int | None] | None,
        pinned: dict[str, Any] | None,
    ) -> BackfillPlan:
        if pinned is not None and "epochs" in pinned and self._switched():
            return _kafka_phase_plan(self.settings, pinned, policy)
        planned = super()._planned(tables, window, policy, regions, snapshots, pinned)
        return _ending_at_the_archive(planned, pinned, policy)

    def _kept(self, document: dict[str, Any], backfill_plan: BackfillPlan) -> None:
        document.setdefault("handovers", {table: h.to_json() for table, h in self._handovers.items()})
        document.setdefault("window_end", backfill_plan.window.end)
        # What the Kafka phase reads of the plan, for restarts once the snapshots may have expired (a
        # checkpoint planned without them gets them at its next start, while its snapshots last).
        document.setdefault("epochs", [[epoch.lower, epoch.upper] for epoch in backfill_plan.epochs])

    def _hold(self, snapshots: dict[str, int | None]) -> None:
        settings = self.settings
        if self._switched():
            # Kafka took over: the archive is not read again.
            release(settings.catalog, snapshots, settings.checkpoint_location)
            return
        super()._hold(snapshots)
        for handover in self._handovers.values():
            source = next(s for s in settings.sources.values() if s.topic == handover.topic)
            kafka = {**settings.kafka, **source.kafka}
            refuse_lost_handover(handover, librdkafka_settings(kafka, prefix="kafka."))
            log.info("%s: the archive hands over to Kafka at %s", settings.app, handover.describe())

    @property
    def handovers(self) -> dict[str, Handover]:
        """Per source name, where the bootstrap goes over to Kafka; empty before its plan is made."""
        by_table = self._handovers
        catalog = self.settings.catalog
        return {
            name: by_table[table_ref(source.table_or_topic, catalog).identifier]
            for name, source in self.settings.sources.items()
            if table_ref(source.table_or_topic, catalog).identifier in by_table
        }

    def _pin_handovers(self) -> dict[str, Handover]:
        """Per source table, the newest router commit of its topic and cluster, and where it ends in Kafka."""
        settings = self.settings
        handovers = {}
        for name, source in settings.sources.items():
            ref = table_ref(source.table_or_topic, settings.catalog)
            pinned = pin_handover(settings.catalog, ref, source.topic, source.cluster)
            reads_with = isolation_level({**SOURCE_DEFAULTS, **settings.kafka_options(name)})
            handover = agreed_isolation_level(pinned, reads_with)
            refuse_rows_at_or_past(settings.catalog, handover)
            handovers[ref.identifier] = handover
        return handovers

    def _switched(self) -> bool:
        """Whether the query has logged its switch to Kafka: a hand-over offset may then be long read."""
        logged = sorted(int(name) for name in self.files.names("offsets") if name.isdigit())
        return bool(logged) and '"phase":"kafka"' in self.files.read_text(f"offsets/{logged[-1]}")


def _ending_at_the_archive(
    backfill_plan: BackfillPlan, pinned: dict[str, Any] | None, policy: Any
) -> BackfillPlan:
    """The plan of a bootstrap cut at the newest row of its pinned snapshots: every archived row below the
    hand-over is read, whatever its timestamp, and the epochs end with the archive. `pinned`: the plan
    kept beside the checkpoint, once there is one."""
    start = backfill_plan.window.start
    if pinned is not None:
        window = Window(start, int(pinned["window_end"]))
    else:
        window = archive_window(start, backfill_plan.splits)
    return replace(backfill_plan, window=window, epochs=tuple(policy.epochs(window, backfill_plan.splits)))


def _kafka_phase_plan(settings: AppSettings, pinned: dict[str, Any], policy: OrderingPolicy) -> BackfillPlan:
    """The plan of a bootstrap that has switched to Kafka, from the one kept beside its checkpoint: the same
    tables, snapshots, window and epochs, without the splits. The archive is read no more, so its snapshots
    are not looked at: released at the switch, they may have expired since."""
    start, _ = pinned["request"]["window"]
    scans = []
    for source in settings.sources.values():
        ref = table_ref(source.table_or_topic, settings.catalog)
        scans.append(TableScan(ref, pinned["snapshots"][ref.identifier], ()))
    epochs = tuple(Epoch(index, lower, upper, ()) for index, (lower, upper) in enumerate(pinned["epochs"]))
    regions = tuple(pinned["request"]["regions"])
    return BackfillPlan(Window(start, int(pinned["window_end"])), policy, regions, tuple(scans), epochs)
