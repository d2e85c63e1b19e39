"""`bergstream router redrive`: dead letters that parse now go into the archive table, exactly once.

After a fix to a topic's schema or parser settings, the dead letters of the topic are parsed again by the
router's own parser (`RecordSplitter`). Those that parse now are appended to the archive table with their
original `__metadata__`, so that they land in the hour they were ingested in and a backfill finds them
there; `router_write_ts` says when the redrive wrote them. They are then marked in the dead-letter table
(`redriven_at`, `redrive_id`), and a redrive never examines a marked row again. Rows that still fail stay,
with the reason the parser gives now.

Two commits, each atomic, and the first is named in the second:
1. the archive append carries the redrive's id, the dead-letter snapshot it read and its counts as
   snapshot properties;
2. one MERGE into the dead-letter table marks the rows and updates the reasons, with the same properties.
A redrive killed between the two leaves an archive snapshot whose id no dead-letter snapshot carries: the
next redrive first marks the rows that snapshot added, without appending them again. Killed during either
commit, Iceberg has committed all of it or nothing. A pending dead letter whose record the archive already
holds (its marking lost with an expired snapshot) is marked and not appended. Redrives of one topic run one
at a time.

`run` does one redrive; `classify` parses the dead letters again and says what becomes of each; `commit`
makes the two commits and finishes an interrupted redrive; `snapshots` finds the commits of redrives;
`outcomes` and `report` say what a redrive did, `stage_progress` how far it is.
"""

from bergstream.router.redrive.outcomes import (
    ALREADY_ARCHIVED,
    REDRIVEN,
    STILL_FAILING,
    ReasonCounts,
    RedriveCounts,
)
from bergstream.router.redrive.report import FinishedRedrive, RedriveReport
from bergstream.router.redrive.run import redrive
from bergstream.router.redrive.snapshots import (
    FINISHED_LATER_PROPERTY,
    ID_PROPERTY,
    RedriveError,
    RedriveSnapshot,
    new_redrive_id,
    unfinished,
)

__all__ = [
    "ALREADY_ARCHIVED",
    "FINISHED_LATER_PROPERTY",
    "ID_PROPERTY",
    "REDRIVEN",
    "STILL_FAILING",
    "FinishedRedrive",
    "ReasonCounts",
    "RedriveCounts",
    "RedriveError",
    "RedriveReport",
    "RedriveSnapshot",
    "new_redrive_id",
    "redrive",
    "unfinished",
]
