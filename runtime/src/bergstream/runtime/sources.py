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

A run's sources are of its mode: `Sources(spark, settings)` gives LiveSources (here), BackfillSources
(sources_backfill.py) or BootstrapSources (sources_bootstrap.py).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from bergstream.backfill.errors import BackfillConfigError
from bergstream.backfill.read.handover import Handover
from bergstream.kafka_source import kafka_stream
from bergstream.runtime.checkpoint import CheckpointFiles
from bergstream.runtime.settings import AppSettings
from bergstream.runtime.subject import LiveSubject
from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.event_schema import load_event_schema
from bergstream.schemas.parse import ERROR, Parser
from bergstream.schemas.stamp import archive_columns, metadata
from bergstream.schemas.wire import UnknownSchemaId, WireSchemas

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from bergstream.backfill.read.planner import BackfillPlan

log = logging.getLogger(__name__)
BACKFILL_FORMAT = "bergstream-backfill"
HYBRID_FORMAT = "bergstream-hybrid"
PLAN_DIR = "bergstream-backfill"
PLAN_FILE = f"{PLAN_DIR}/plan.json"
# The archive row of a bootstrapped source's archive phase; null in its Kafka phase.
ARCHIVE = "__archive__"


class Sources:
    """The named sources of one run of an application, kept while its query starts again, of the class of its
    mode (Sources(spark, settings) gives it). `stopping`, set, ends a wait for a schema registry."""

    def __new__(
        cls, spark: SparkSession, settings: AppSettings, stopping: threading.Event | None = None
    ) -> Sources:
        if cls is Sources:
            cls = _of_mode(settings.mode)
        return super().__new__(cls)

    def __init__(
        self, spark: SparkSession, settings: AppSettings, stopping: threading.Event | None = None
    ) -> None:
        self.spark = spark
        self.settings = settings
        self._stopping = stopping or threading.Event()
        self._subjects: dict[str, LiveSubject] = {}
        self._files: CheckpointFiles | None = None
        # A bootstrap on a one-second trigger: its Kafka phase then waits for the trigger interval.
        self.paced = False

    @property
    def names(self) -> list[str]:
        return list(self.settings.sources)

    def stream(self, name: str) -> DataFrame:
        """The streaming DataFrame of source `name`, as the run's mode reads it."""
        if name not in self.settings.sources:
            known = ", ".join(self.settings.sources)
            raise BackfillConfigError(
                f"application {self.settings.app} asks for source {name!r}; its settings name only {known}"
            )
        return self._stream(name)

    def _stream(self, name: str) -> DataFrame:
        raise NotImplementedError

    def plan(self) -> BackfillPlan:
        """The plan every archive source of this run reads (a backfill's, a bootstrap's)."""
        raise BackfillConfigError(
            f"application {self.settings.app} runs live: it reads no archive, by no plan"
        )

    @property
    def handovers(self) -> dict[str, Handover]:
        """Per source name, where a bootstrap goes over to Kafka: none but a bootstrap's."""
        return {}

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

    @property
    def files(self) -> CheckpointFiles:
        """The checkpoint's files, where the plans are kept beside it."""
        if self._files is None:
            self._files = CheckpointFiles(self.spark, self.settings.checkpoint_location)
        return self._files


class LiveSources(Sources):
    """A live run's sources: each topic read with Spark's Kafka source, parsed as the router parses it."""

    def _stream(self, name: str) -> DataFrame:
        from pyspark.sql import functions as F

        source = self.settings.sources[name]
        layout, parser = self._parser(name)
        records = kafka_stream(
            self.spark, source.topic, self.settings.kafka_options(name), self.settings.max_offsets(name)
        )
        parsed = parser.parse(records, metadata(source.cluster))
        return parsed.where(F.col(ERROR).isNull()).select(*archive_columns(layout))


def _of_mode(mode: str) -> type[Sources]:
    """The class of a run's sources in `mode`."""
    if mode == "live":
        return LiveSources
    from bergstream.runtime.sources_backfill import BackfillSources
    from bergstream.runtime.sources_bootstrap import BootstrapSources

    return BootstrapSources if mode == "bootstrap" else BackfillSources
