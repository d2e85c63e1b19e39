"""Named sources: an application asks for "playback" and gets a streaming DataFrame of playback events.

Live, that is the topic read with Spark's Kafka source and parsed as the router parses it; as a backfill,
it is the topic's archive table read by the `bergstream-backfill` source in lateness-bounded order. Both
yield the same columns: the typed event's fields and `__metadata__`. Records the router would dead-letter
are left out of the live stream, as they are out of the archive table. A live source over a schema-registry
topic knows its subject's versions as runtime/subject.py says.

All backfill sources of one application share one plan, so that they advance on one ingestion watermark.
The plan is kept beside the query's checkpoint: a restarted backfill reads the snapshots it started on.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bergstream.backfill.errors import BackfillConfigError, CheckpointMismatch
from bergstream.backfill.read.order import ordering
from bergstream.backfill.read.planner import BackfillPlan, plan, table_ref
from bergstream.backfill.runtime.settings import AppSettings
from bergstream.backfill.runtime.subject import LiveSubject
from bergstream.kafka_source import kafka_stream
from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.event_schema import load_event_schema
from bergstream.schemas.parse import ERROR, Parser, UnknownSchemaId, WireSchemas
from bergstream.schemas.stamp import archive_columns, metadata

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
BACKFILL_FORMAT = "bergstream-backfill"
PLAN_DIR = "bergstream-backfill"


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
        self._subjects: dict[str, LiveSubject] = {}

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
        return self._backfill(name)

    def _live(self, name: str) -> DataFrame:
        from pyspark.sql import functions as F

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
        records = kafka_stream(
            self.spark, source.topic, self.settings.kafka_options(name), self.settings.max_offsets_per_trigger
        )
        parser = Parser(layout, source.encoding, source.max_value_bytes, wire_schemas)
        parsed = parser.parse(records, metadata(source.cluster))
        return parsed.where(F.col(ERROR).isNull()).select(*archive_columns(layout))

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
        path = self._plan_dir() / f"{name}.json"
        path.write_text(json.dumps(backfill_plan.source_plan(table, name)))
        return self.spark.readStream.format(BACKFILL_FORMAT).option("plan", str(path)).load()

    def _plan_dir(self) -> Path:
        directory = Path(self.settings.checkpoint_location) / PLAN_DIR
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def plan(self) -> BackfillPlan:
        """The plan every backfill source of this run reads: made once, then read from the checkpoint."""
        if self._plan is None:
            self._plan = self._pinned_plan()
        return self._plan

    def _pinned_plan(self) -> BackfillPlan:
        from bergstream.backfill.read.batches import window_of

        settings = self.settings
        backfill = settings.backfill
        assert backfill.start is not None and backfill.end is not None, "validated by AppSettings"
        tables = [source.table_or_topic for source in settings.sources.values()]
        policy = ordering(backfill.max_misalignment, backfill.strict)
        window = window_of(backfill.start, backfill.end)
        pinned_file = self._plan_dir() / "plan.json"
        # As the checkpoint's name has them: the same regions in another order are the same request.
        regions = sorted(backfill.regions) if backfill.regions is not None else None
        request = {
            "tables": sorted(table_ref(t, settings.catalog).identifier for t in tables),
            "window": [window.start, window.end],
            "ordering": policy.name,
            "bound_us": None if policy.bound is None else policy.bound // timedelta(microseconds=1),
            "regions": regions,
        }
        snapshots: dict[str, int | None] | None = None
        if pinned_file.exists():
            pinned: dict[str, Any] = json.loads(pinned_file.read_text())
            if pinned["request"] != request:
                raise CheckpointMismatch(
                    f"checkpoint {settings.checkpoint_location} belongs to another backfill "
                    f"({_describe(pinned['request'])}) than this one ({_describe(request)}): "
                    "give this backfill a checkpoint of its own"
                )
            snapshots = pinned["snapshots"]
            log.info("resuming backfill %s from its plan in %s", settings.app, pinned_file)
        backfill_plan = plan(settings.catalog, tables, window, policy, regions, snapshots)
        if snapshots is None:
            pinned_snapshots = {scan.table.identifier: scan.snapshot_id for scan in backfill_plan.tables}
            pinned_file.write_text(json.dumps({"request": request, "snapshots": pinned_snapshots}))
        return backfill_plan


def _describe(request: dict[str, Any]) -> str:
    start, end = request["window"]
    return f"tables {', '.join(request['tables'])}, window {start}-{end} us, {request['ordering']}"
