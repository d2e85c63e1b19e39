"""A live named source over a schema-registry topic: its subject's versions as the application's query knows
them.

The router looks for new versions before each micro-batch; an application's query has no such moment
between Spark's Kafka source and the parser. So a live source fetches the subject's versions when the run
starts, and a value whose id its query does not know fails its batch (`UnknownSchemaId`). The runtime then
fetches the subject again and starts the query again from its checkpoint, which reads the failed batch
again with the new version known. An id that is still no version of the subject is one the router
dead-letters: its values are left out of the source from then on, as they are out of the archive.

The source's columns are the subject's newest version when the run started, for the whole run: a query's
schema cannot change while it runs. Avro values of a later version are resolved to those columns (Avro's
schema resolution); the next run reads the newer columns.
"""

from __future__ import annotations

import logging
import threading

from bergstream.backfill.errors import BackfillConfigError
from bergstream.errors import ConfigError
from bergstream.runtime.settings import SourceSettings
from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.schema_registry import Outage, SubjectSchemas, refresh_waiting
from bergstream.schemas.wire import WireSchemas

log = logging.getLogger("bergstream.backfill")


class LiveSubject:
    """The subject of one live source: its versions, the source's columns, the ids found to be none."""

    def __init__(self, name: str, source: SourceSettings, stop: threading.Event) -> None:
        settings = source.schema_registry
        assert settings is not None, "a source with schema_registry"
        self.who = f"source {name} (topic {source.topic})"
        self.subject = settings.subject_of(source.topic)
        self._schema_name = source.schema_or_topic
        self._schemas = SubjectSchemas(settings, self.subject, source.encoding)
        self._outage = Outage(settings, stop, self.who)
        self._not_versions: dict[int, str] = {}
        refresh_waiting(self._schemas, self._outage, "starting")
        try:
            event = self._schemas.event_schema(self._schema_name)
        except ConfigError as error:
            raise BackfillConfigError(f"{self.who}: {error}") from error
        self.layout = ArchiveLayout(event, source.table_or_topic)

    def wire_schemas(self) -> WireSchemas:
        """What the source's parser knows now; an id it does not know fails the batch."""
        writers = {
            schema_id: schema.avro_text(self._schema_name)
            for schema_id, schema in self._schemas.by_id.items()
        }
        return WireSchemas(self.subject, writers, dict(self._not_versions), fail_on_unknown=True)

    def learn(self, schema_id: int) -> bool:
        """A batch failed on `schema_id`: fetch the subject again, and leave the id's values out if it is
        still no version of it. False when the id was met before: starting again would fail the same way."""
        if schema_id in self._not_versions or schema_id in self._schemas.by_id:
            return False
        refresh_waiting(self._schemas, self._outage, f"a batch holds schema id {schema_id}")
        if schema_id in self._schemas.by_id:
            log.info("%s: schema id %d is a version of subject %s registered after the query started; "
                     "starting the query again with it", self.who, schema_id, self.subject)  # fmt: skip
        else:
            reason = f"is not a version of subject {self.subject} in the schema registry"
            self._not_versions[schema_id] = reason
            log.warning("%s: schema id %d %s: its values are left out, as the router dead-letters them; "
                        "starting the query again", self.who, schema_id, reason)  # fmt: skip
        return True
