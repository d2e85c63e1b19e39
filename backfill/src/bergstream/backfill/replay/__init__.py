"""`bergstream backfill replay`: a window of the archive republished into a Kafka topic, in backfill order,
exactly once for consumers that read with isolation.level=read_committed.

For consumers not written in Spark. Each record keeps its original key and headers; its value is encoded
as the original topic encodes it (JSON or Avro, from the table's `bergstream.encoding` and
`bergstream.schema` properties; for a topic with a schema registry, in the wire format with the value's
original schema id, the writer's schema fetched from the registry by that id); its timestamp is its
original ingestion time; and headers name where it came from (`bergstream.source.topic`, `.partition`,
`.offset`). With dead letters, the raw bytes go out as they came in, with the reason in
`bergstream.dead-letter.reason`.

The roles: `encode.py` turns rows into records, `order.py` puts an epoch's rows in the order they go out
in, `state.py` is what the replay is and how far it went, kept in Kafka, and `run.py` sends epoch by
epoch in transactions.
"""

from bergstream.backfill.replay.encode import (
    DEAD_LETTER_REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    table_encoder,
)
from bergstream.backfill.replay.run import ReplayReport, replay

__all__ = [
    "DEAD_LETTER_REASON",
    "SOURCE_OFFSET",
    "SOURCE_PARTITION",
    "SOURCE_TOPIC",
    "ReplayReport",
    "replay",
    "table_encoder",
]
