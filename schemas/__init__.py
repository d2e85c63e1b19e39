"""What the archive looks like: event schemas per topic and the archive table's layout."""

from schemas.archive import ArchiveLayout
from schemas.registry import EventSchema, load_event_schema

__all__ = ["ArchiveLayout", "EventSchema", "load_event_schema"]
