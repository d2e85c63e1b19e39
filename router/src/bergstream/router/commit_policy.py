"""When a topic on a target lag is read and committed: the rule the driver applies once per batch, and between
batches, to every topic with records it has not read (router/driver/unread.py keeps them). Pure logic over
plain data.

A topic is due when it has no target lag (every batch), when what it has unread reaches a commit's worth
(`commit_records`, or `commit_bytes` by the size of its records so far), and when its oldest record not
archived would otherwise be older than its target lag by its next chance, up to SPREAD of the lag earlier
by the topic's own phase, so that topics that began holding records together are not all read in one
batch.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from bergstream.schemas.batch_range import BatchRange

# A topic is read and committed once this much is unread, whatever its target lag: a commit of many files
# costs about what one of a few does, and a read of a long range holds it in memory.
COMMIT_BYTES = 64 * 1024 * 1024
COMMIT_RECORDS = 500_000
# Topics are due up to this share of their target lag early, each by its own phase: hundreds of topics met
# in the same batch would otherwise all be read in one batch, every target lag.
SPREAD = 0.25


@dataclass(frozen=True)
class CommitPolicy:
    """A topic's settings for its commits: its target lag in seconds (None: a commit every batch), and how
    much unread is a commit's worth whatever the lag."""

    target_lag: float | None = None
    commit_bytes: int = COMMIT_BYTES
    commit_records: int = COMMIT_RECORDS


@dataclass
class Unread:
    """A topic's records the query went past in Kafka and has not read: from where its archive ends
    (`start`, per partition) to the newest batch's end (`end`), passed since `since` (seconds since the
    epoch: when the query met the first of them, its oldest record no older than a batch before that)."""

    start: dict[int, int]
    end: dict[int, int]
    since: float

    @property
    def range(self) -> BatchRange:
        return BatchRange(dict(self.start), dict(self.end))

    @property
    def offsets(self) -> int:
        """How many offsets it spans (records, and any transaction markers among them)."""
        return sum(max(0, end - self.start.get(p, end)) for p, end in self.end.items())

    @property
    def empty(self) -> bool:
        return self.offsets == 0


class Cadence:
    """How long from one batch of a query to the next: its trigger, or, while its batches take longer than
    the trigger (many topics, a backlog), the time the last one took from its start to its end. A topic
    commits when its oldest record would pass its target lag by the next batch, so the next batch's distance
    is this. The time between batches' starts is not it: no batch runs while no records come, and an hour
    without records says nothing of how far off the next batch is once they do."""

    def __init__(self, trigger: float) -> None:
        self.trigger = trigger
        self.seconds = trigger
        self._began: float | None = None

    def began(self, now: float) -> None:
        """A batch starts at monotonic `now`."""
        self._began = now

    def ended(self, now: float) -> None:
        """The batch begun last ends at monotonic `now`."""
        if self._began is not None:
            self.seconds = max(self.trigger, now - self._began)
            self._began = None


def phase(topic: str) -> float:
    """The topic's place in [0, 1), the same in every driver: what spreads the commits of topics that began
    holding files in the same batch."""
    return (zlib.crc32(topic.encode()) % 1024) / 1024


def due_reason(
    policy: CommitPolicy,
    cadence: float,
    unread: Unread,
    now: float,
    spread: float = 0.0,
    record_bytes: float = 0.0,
) -> str | None:
    """Why a topic of `policy` with `unread` records is read and committed now (`now`, seconds since the
    epoch, as `unread.since`); None: it waits. `cadence`: how far off its next chance is (Cadence.seconds).
    `spread` in [0, 1): the topic is due that much of SPREAD earlier than its target lag asks (its `phase`).
    `record_bytes`: the mean size of its records so far, for `commit_bytes`."""
    if policy.target_lag is None:
        return "every batch"
    records = unread.offsets
    if records >= policy.commit_records or records * record_bytes >= policy.commit_bytes:
        return "size"
    # Its oldest record may have waited a batch before the one that met it, and waits until its next chance:
    # read now unless it would pass the target lag by then.
    if now - unread.since + 2 * cadence >= policy.target_lag * (1 - SPREAD * spread):
        return "lag"
    return None
