"""Named sources: an application asks for "playback" and gets a streaming DataFrame of playback events.

Live, that is the topic read with Spark's Kafka source and parsed as the router parses it; as a backfill,
it is the topic's archive table read by the `bergstream-backfill` source in lateness-bounded order. Both
yield the same columns: the typed event's fields and `__metadata__`. Records the router would dead-letter
are left out of the live stream, as they are out of the archive table. A live source over a schema-registry
topic knows its subject's versions as runtime/subject.py says.

All backfill sources of one application share one plan, so that they advance on one ingestion watermark.
The plan is kept beside the query's checkpoint: a restarted backfill reads the snapshots it started on,
which a tag per table holds from expiry meanwhile (runtime/pins.py).

Bootstrapped (`app run --from`), a source is both, in one query: the `bergstream-hybrid` source reads the
archive from `--from` in the same aligned epochs, up to where the pinned snapshot records that the archive
ends in Kafka (backfill/read/handover.py), then Spark's own Kafka reader from exactly there. Its rows carry
Kafka's columns, or the archive row in `__archive__`; one projection parses the Kafka rows as the router does
and yields the same columns for both. Once the query has switched to Kafka, the archive is read no more and
its snapshot is released, for maintenance to expire: a restart then needs only what the first run kept beside
the checkpoint (the epochs, and the archive row's type), never the snapshot.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from bergstream.backfill.errors import BackfillConfigError, CheckpointMismatch
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
from bergstream.backfill.read.order import Epoch, OrderingPolicy, StrictOrder, Window, ordering
from bergstream.backfill.read.planner import BackfillPlan, TableScan, plan, table_ref, to_micros
from bergstream.kafka_settings import librdkafka_settings
from bergstream.kafka_source import SOURCE_DEFAULTS, isolation_level, kafka_stream
from bergstream.runtime.checkpoint import CheckpointFiles
from bergstream.runtime.pins import pin, release, tag_of
from bergstream.runtime.settings import AppSettings
from bergstream.runtime.subject import LiveSubject
from bergstream.schemas.archive import METADATA, METADATA_TYPE, ArchiveLayout
from bergstream.schemas.event_schema import load_event_schema
from bergstream.schemas.parse import ERROR, Parser
from bergstream.schemas.spark_types import optional
from bergstream.schemas.stamp import archive_columns, metadata
from bergstream.schemas.wire import UnknownSchemaId, WireSchemas
from bergstream.timeparse import parse_duration

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
BACKFILL_FORMAT = "bergstream-backfill"
HYBRID_FORMAT = "bergstream-hybrid"
PLAN_DIR = "bergstream-backfill"
PLAN_FILE = f"{PLAN_DIR}/plan.json"
# The archive row of a bootstrapped source's archive phase; null in its Kafka phase.
ARCHIVE = "__archive__"


class Sources:
    """The named sources of one run of an application, kept while its query starts again. `stopping`, set,
    ends a wait for a schema registry."""

    def __init__(
        self, spark: SparkSession, settings: AppSettings, stopping: threading.Event | None = None
    ) -> None:
        self.spark = spark
        self.settings = settings
        self._stopping = stopping or threading.Event()
        self._plan: BackfillPlan | None = None
        self._handovers: dict[str, Handover] = {}
        self._subjects: dict[str, LiveSubject] = {}
        self._files: CheckpointFiles | None = None
        # A bootstrap on a one-second trigger: its Kafka phase then waits for the trigger interval.
        self.paced = False

    @property
    def names(self) -> list[str]:
        return list(self.settings.sources)

    def stream(self, name: str) -> DataFrame:
        """The streaming DataFrame of source `name`, live or backfill as the settings say."""
        if name not in self.settings.sources:
            known = ", ".join(self.settings.sources)
            raise BackfillConfigError(
                f"application {self.settings.app} asks for source {name!r}; its settings name only {known}"
            )
        if self.settings.mode == "live":
            return self._live(name)
        if self.settings.mode == "bootstrap":
            return self._bootstrap(name)
        return self._backfill(name)

    def _live(self, name: str) -> DataFrame:
        from pyspark.sql import functions as F

        source = self.settings.sources[name]
        layout, parser = self._parser(name)
        records = kafka_stream(
            self.spark, source.topic, self.settings.kafka_options(name), self.settings.max_offsets(name)
        )
        parsed = parser.parse(records, metadata(source.cluster))
        return parsed.where(F.col(ERROR).isNull()).select(*archive_columns(layout))

    def _parser(self, name: str) -> tuple[ArchiveLayout, Parser]:
        """The layout of a live source's rows, and the parser of its topic's values, as the router's."""
        source = self.settings.sources[name]
        wire_schemas: WireSchemas | None = None
        if source.schema_registry is None:
            layout = ArchiveLayout(
                load_event_schema(source.schema_or_topic, self.settings.schema_dir), source.table_or_topic
            )
        else:
            if name not in self._subjects:
                self._subjects[name] = LiveSubject(name, source, self._stopping)
            layout = self._subjects[name].layout
            wire_schemas = self._subjects[name].wire_schemas()
        return layout, Parser(layout, source.encoding, source.max_value_bytes, wire_schemas)

    def _bootstrap(self, name: str) -> DataFrame:
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

    def recover(self, error: Exception) -> bool:
        """Whether the query that failed with `error` may start again: a batch held a schema id the query did
        not know, and the subject has been fetched again since."""
        unknown = UnknownSchemaId.find(str(error))
        if unknown is None:
            return False
        learned = [
            subject.learn(unknown.schema_id)
            for subject in self._subjects.values()
            if subject.subject == unknown.subject
        ]
        return any(learned)

    def _backfill(self, name: str) -> DataFrame:
        backfill_plan = self.plan()
        table = table_ref(self.settings.sources[name].table_or_topic, self.settings.catalog).identifier
        path = f"{PLAN_DIR}/{name}.json"
        self.files.write_text(path, json.dumps(backfill_plan.source_plan(table, name)))
        return self.spark.readStream.format(BACKFILL_FORMAT).option("plan", self.files.uri(path)).load()

    @property
    def files(self) -> CheckpointFiles:
        """The checkpoint's files, where the plans are kept beside it."""
        if self._files is None:
            self._files = CheckpointFiles(self.spark, self.settings.checkpoint_location)
        return self._files

    def plan(self) -> BackfillPlan:
        """The plan every backfill source of this run reads: made once, then read from the checkpoint."""
        if self._plan is None:
            self._plan = self._pinned_plan()
        return self._plan

    def _pinned_plan(self) -> BackfillPlan:
        from bergstream.backfill.read.batches import window_of

        settings = self.settings
        backfill = settings.backfill
        bootstrap = settings.mode == "bootstrap"
        assert backfill.start is not None, "validated by AppSettings"
        tables = [source.table_or_topic for source in settings.sources.values()]
        policy = ordering(backfill.max_misalignment, backfill.strict)
        if bootstrap:
            window = Window(to_micros(backfill.start), END_OF_TIME)
        else:
            assert backfill.end is not None, "validated by AppSettings"
            window = window_of(backfill.start, backfill.end)
        files = self.files
        # As the checkpoint's name has them: the same regions in another order are the same request.
        regions = sorted(backfill.regions) if backfill.regions is not None else None
        request: dict[str, Any] = {
            "tables": sorted(table_ref(t, settings.catalog).identifier for t in tables),
            "window": [window.start, window.end],
            "ordering": policy.name,
            "bound_us": None if policy.bound is None else policy.bound // timedelta(microseconds=1),
            "regions": regions,
        }
        if isinstance(policy, StrictOrder):
            # Its epochs' width: a strict checkpoint of another width counts its epochs on another grid.
            request["epoch_us"] = policy.max_misalignment // timedelta(microseconds=1)
        if bootstrap:
            request["mode"] = "bootstrap"
            request["regions"] = sorted({source.cluster for source in settings.sources.values()})
        snapshots: dict[str, int | None] | None = None
        pinned: dict[str, Any] | None = None
        if files.exists(PLAN_FILE):
            pinned = json.loads(files.read_text(PLAN_FILE))
            if pinned["request"] != request:
                raise CheckpointMismatch(
                    f"checkpoint {settings.checkpoint_location} belongs to another backfill "
                    f"({_describe(pinned['request'])}) than this one ({_describe(request)}): "
                    "give this backfill a checkpoint of its own"
                )
            snapshots = pinned["snapshots"]
            self._handovers = {
                table: Handover.from_json(table, handover)
                for table, handover in pinned.get("handovers", {}).items()
            }
            log.info("resuming %s %s from its plan in %s", "bootstrap" if bootstrap else "backfill",
                     settings.app, files.uri(PLAN_FILE))  # fmt: skip
        elif bootstrap:
            self._handovers = self._pin_handovers()
            for handover in self._handovers.values():
                refuse_rows_past(settings.catalog, handover)
            snapshots = {table: handover.snapshot_id for table, handover in self._handovers.items()}
        regions = request["regions"]
        if bootstrap and pinned is not None and "epochs" in pinned and self._switched():
            backfill_plan = _kafka_phase_plan(settings, pinned, policy)
        else:
            backfill_plan = plan(settings.catalog, tables, window, policy, regions, snapshots)
            if bootstrap:
                backfill_plan = _ending_at_the_archive(backfill_plan, pinned, policy)
        document: dict[str, Any] = dict(pinned) if pinned is not None else {
            "request": request,
            "snapshots": {scan.table.identifier: scan.snapshot_id for scan in backfill_plan.tables},
            "tag": tag_of(settings.checkpoint_location),
        }  # fmt: skip
        if bootstrap:
            document.setdefault("handovers", {table: h.to_json() for table, h in self._handovers.items()})
            document.setdefault("window_end", backfill_plan.window.end)
            # What the Kafka phase reads of the plan, for restarts once the snapshots may have expired (a
            # checkpoint planned without them gets them at its next start, while its snapshots last).
            document.setdefault("epochs", [[epoch.lower, epoch.upper] for epoch in backfill_plan.epochs])
        if document != pinned:
            files.write_text(PLAN_FILE, json.dumps(document))
        pinned_snapshots = {scan.table.identifier: scan.snapshot_id for scan in backfill_plan.tables}
        if bootstrap and self._switched():
            # Kafka took over: the archive is not read again.
            release(settings.catalog, pinned_snapshots, settings.checkpoint_location)
        else:
            pin(settings.catalog, pinned_snapshots, settings.checkpoint_location, settings.app)
        if bootstrap and not self._switched():
            for handover in self._handovers.values():
                source = next(s for s in settings.sources.values() if s.topic == handover.topic)
                kafka = {**settings.kafka, **source.kafka}
                refuse_lost_handover(handover, librdkafka_settings(kafka, prefix="kafka."))
                log.info("%s: the archive hands over to Kafka at %s", settings.app, handover.describe())
        return backfill_plan

    @property
    def handovers(self) -> dict[str, Handover]:
        """Per source name, where a bootstrap goes over to Kafka; empty before its plan is made."""
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


def _describe(request: dict[str, Any]) -> str:
    start, end = request["window"]
    return f"tables {', '.join(request['tables'])}, window {start}-{end} us, {request['ordering']}"
