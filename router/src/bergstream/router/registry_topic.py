"""A topic whose values are in a schema registry's wire format: the router's view of its subject.

The driver asks the registry, before each micro-batch, for versions registered since the last batch (one
request when there are none). Spark fixed the batch's offsets before that, and a producer registers a
schema before it writes a value with its id, so every id of the subject that a batch holds is known when
the batch is parsed; the executors never call the registry, and a replayed batch is parsed the same way.

When the registry does not answer, the batch is parsed with what is known if that covers its ids (read
from the batch, only then). Otherwise the batch waits with backoff for the registry to come back; once
the outage has lasted `give_up_after_seconds`, the values whose ids are still unknown go to the
dead-letter table with a reason naming the id and the outage, and the router goes on. Nothing is lost:
`bergstream router redrive` archives them once the registry answers.

A new newest version (a compatible evolution, checked by the registry) evolves the table at once, as a
new schema file does at the router's start.

`topic_parser` gives the router and the redrive the same parser: the registry's, or one from the topic's
schema file.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from bergstream.router.config import RouterConfig
from bergstream.router.transform import RecordSplitter, shared_splitter
from bergstream.schemas import wire
from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.event_schema import load_event_schema
from bergstream.schemas.schema_registry import (
    Outage,
    RegistryUnavailable,
    SubjectSchemas,
    refresh_waiting,
)
from bergstream.schemas.wire import WireSchemas

log = logging.getLogger("bergstream.router")


def topic_parser(
    config: RouterConfig, stop: threading.Event | None = None
) -> tuple[ArchiveLayout, RecordSplitter, RegistryTopic | None]:
    """The table's layout and the parser of the topic's values: from the newest version of the topic's
    subject in its schema registry, with the RegistryTopic that follows the subject; or from its schema
    file, without one."""
    settings = config.settings
    if settings.schema_registry is not None:
        registry = RegistryTopic(config, stop)
        return registry.layout, registry.splitter, registry
    layout = ArchiveLayout(load_event_schema(settings.schema_name, settings.schema_dir), settings.table)
    splitter = shared_splitter(layout, settings.encoding, config.query.cluster, settings.max_value_bytes)
    return layout, splitter, None


class RegistryTopic:
    """The subject's schemas, the table's layout from its newest version, and the RecordSplitter that parses
    the topic's values with them."""

    def __init__(self, config: RouterConfig, stop: threading.Event | None = None) -> None:
        registry = config.settings.schema_registry
        assert registry is not None and config.settings.subject is not None
        # The topic's own settings, and the cluster of the query that reads it.
        self.settings = config.settings
        self.cluster = config.query.cluster
        self.registry = registry
        self.subject = config.settings.subject
        self._stop = stop or threading.Event()
        self._schemas = SubjectSchemas(registry, self.subject, self.settings.encoding)
        self._unresolved: dict[int, str] = {}
        self._outage = Outage(registry, self._stop, self.settings.topic)
        # The first look at the subject, waited for as long as a batch would wait.
        refresh_waiting(self._schemas, self._outage, "starting")
        self.layout = self._newest_layout()
        self.splitter = self._new_splitter()

    def _newest_layout(self) -> ArchiveLayout:
        return ArchiveLayout(self._schemas.event_schema(self.settings.schema_name), self.settings.table)

    def _new_splitter(self) -> RecordSplitter:
        name = self.settings.schema_name
        writers = {schema_id: schema.avro_text(name) for schema_id, schema in self._schemas.by_id.items()}
        wire_schemas = WireSchemas(self.subject, writers, dict(self._unresolved))
        settings = self.settings
        return RecordSplitter(
            self.layout, settings.encoding, self.cluster, settings.max_value_bytes, wire_schemas
        )

    def before_batch(
        self, records: DataFrame, batch_id: int, evolve: Callable[[ArchiveLayout], None]
    ) -> None:
        """Bring the known versions up to date for this batch; `evolve` the table when the newest changed."""
        unresolved_before = dict(self._unresolved)
        known_before = set(self._schemas.by_id)
        try:
            self._schemas.refresh()
            self._back(batch_id)
        except RegistryUnavailable as error:
            self._wait_for(records, batch_id, error)
        if set(self._schemas.by_id) == known_before and self._unresolved == unresolved_before:
            return
        newest = self._newest_layout()
        if newest.event != self.layout.event:
            evolve(newest)
            log.info("%s: the table's schema is now %s", self.settings.topic, newest.event.source)
            self.layout = newest
        self.splitter = self._new_splitter()

    def _back(self, batch_id: int) -> None:
        lasted = self._outage.end()
        if lasted is not None:
            log.warning("%s batch %d: the schema registry at %s answers again after %.0fs",
                        self.settings.topic, batch_id, self.registry.url, lasted)  # fmt: skip
        self._unresolved.clear()

    def _batch_ids(self, records: DataFrame) -> set[int]:
        """The schema ids in a batch's values (read from Kafka for it: only while the registry is out)."""
        ids = records.select(wire.schema_id(F.col("value")).alias("id")).where(F.col("id").isNotNull())
        return {int(row.id) for row in ids.distinct().collect()}

    def _wait_for(self, records: DataFrame, batch_id: int, error: RegistryUnavailable) -> None:
        missing = self._batch_ids(records) - set(self._schemas.by_id) - set(self._unresolved)
        if not missing:
            log.warning("%s batch %d: %s; its schema ids are known", self.settings.topic, batch_id, error)
            return
        while True:
            if not self._outage.wait(error, f"batch {batch_id} needs schema ids {sorted(missing)}"):
                reason = (
                    f"the schema registry at {self.registry.url} did not answer for "
                    f"{self._outage.elapsed:.0f}s ({error})"
                )
                log.error("%s batch %d: schema ids %s dead-lettered: %s", self.settings.topic, batch_id,
                          sorted(missing), reason)  # fmt: skip
                self._unresolved.update(dict.fromkeys(missing, reason))
                return
            try:
                self._schemas.refresh()
            except RegistryUnavailable as again:
                error = again
                continue
            self._back(batch_id)
            return
