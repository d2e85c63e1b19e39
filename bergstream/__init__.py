"""bergstream: archive Kafka topics into Apache Iceberg; backfill streaming applications from the archive."""

__version__ = "0.1.0"
