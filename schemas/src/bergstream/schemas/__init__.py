"""What the archive looks like: event schemas per topic and the archive table's layout."""

from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.event_schema import EventSchema, load_event_schema

__all__ = ["ArchiveLayout", "EventSchema", "load_event_schema"]
