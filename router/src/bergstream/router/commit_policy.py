"""When a topic on a target lag commits: the rule the driver applies once per batch to every topic the batch
wrote (router/pending.py keeps the files meanwhile). Pure logic over plain data.

A topic commits when it has no target lag (a commit every batch), when its rows' plan changed (a schema
change), when what it has pending reaches a commit's worth (`commit_bytes`, `commit_records`), and when its
oldest record not committed would otherwise be older than its target lag at the next batch, up to SPREAD of
the lag earlier by the topic's own phase, so that topics that began holding files together do not all
commit in one batch.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from bergstream.schemas.batch_range import BatchRange

# A topic's files are committed once this much is pending, whatever its target lag: a commit of many files
# costs about what one of a few does, and a crash replays less.
COMMIT_BYTES = 64 * 1024 * 1024
COMMIT_RECORDS = 500_000
# Topics commit up to this share of their target lag early, each by its own phase: hundreds of topics that
# began holding files in the same batch would otherwise all commit in one batch, every target lag.
SPREAD = 0.25


@dataclass(frozen=True)
class CommitPolicy:
    """A topic's settings for its commits: its target lag in seconds (None: a commit every batch), and how
    much pending is a commit's worth whatever the lag."""

    target_lag: float | None = None
    commit_bytes: int = COMMIT_BYTES
    commit_records: int = COMMIT_RECORDS


@dataclass
class Held:
    """What a topic has written and not committed."""

    range: BatchRange  # from its oldest pending batch's start to its newest's end
    properties: dict[str, str]  # the summary its commit carries: the newest batch's, widened to `range`
    since: float  # monotonic: when its oldest pending batch was written
    written_at: float  # the same, in seconds since the epoch
    tables: set[str] = field(default_factory=set)
    records: int = 0
    bytes: int = 0
    oldest: float | None = None  # the oldest ingestion time pending, seconds since the epoch
    newest: float | None = None
    batches: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Written:
    """What a batch wrote for a topic, as the driver weighs it."""

    records: int
    bytes: int
    oldest: float | None
    newest: float | None
    plan: str  # the id of its rows' plan: another one is a schema change


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


def commit_reason(
    policy: CommitPolicy,
    trigger: float,
    held: Held | None,
    written: Written,
    previous_plan: str | None,
    now: float,
    spread: float = 0.0,
) -> str | None:
    """Why a topic of `policy` that wrote `written` in this batch, with `held` pending since before it,
    commits now (at monotonic `now`); None: its files are held. `previous_plan`: its rows' plan in its last
    batch. `spread` in [0, 1): the topic commits that much of SPREAD earlier than its target lag asks (its
    `phase`), so that topics that started together do not all commit in one batch, a burst that batch would
    wait for."""
    if policy.target_lag is None:
        return "every batch"
    records = written.records + (held.records if held else 0)
    size = written.bytes + (held.bytes if held else 0)
    if held is not None and previous_plan is not None and previous_plan != written.plan:
        return "schema"
    if size >= policy.commit_bytes or records >= policy.commit_records:
        return "size"
    since = now if held is None else held.since
    # Its oldest record may have waited a trigger before the batch that read it, and waits one more for the
    # next batch: committed now unless it would pass the target lag by then.
    if now - since + 2 * trigger >= policy.target_lag * (1 - SPREAD * spread):
        return "lag"
    return None


def overdue(target_lag: float | None, trigger: float, since: float, now: float, spread: float) -> bool:
    """Whether files pending since `since` (monotonic) of a topic that wrote nothing in this batch are due
    now: its next chance is a trigger away."""
    return target_lag is None or now - since + trigger >= target_lag * (1 - SPREAD * spread)


def written_of(totals: list[int], plan: str) -> Written:
    """What a topic's outcome (BatchWrite.json's totals) says it wrote."""
    archived, dead_lettered, _, archive_bytes, _, dead_bytes, newest, *rest = totals
    oldest = rest[2]
    return Written(
        records=archived + dead_lettered,
        bytes=archive_bytes + dead_bytes,
        oldest=None if oldest is None or oldest == 2**63 - 1 else oldest / 1e6,
        newest=None if newest == -(2**63) else newest / 1e6,
        plan=plan,
    )
