"""Where a replay stands, kept in Kafka beside what it delivered.

A replay is known by its identity: a digest of its tables, window, ordering policy, regions and target
topic. Its producer's `transactional.id` is `bergstream-replay-<identity>`, so that a new run fences any
earlier one still alive (a process killed with SIGKILL) and aborts its open transaction. Its progress (the
snapshot of every table, the epochs delivered whole, the records delivered of the next one) is a record
keyed by the identity in the compacted topic `bergstream-replay.<target>`, written in the same transaction
as the records it counts: a read_committed reader sees both or neither.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any

from bergstream.backfill.errors import BackfillError
from bergstream.backfill.read.order import MICROSECOND, OrderingPolicy, Window
from bergstream.backfill.read.planner import from_micros
from bergstream.kafka_topics import ensure_topic, last_committed_value
from bergstream.timeparse import format_instant

PROGRESS_FORMAT = 1
# One prefix for every replay's progress topic: one prefixed ACL grants them all.
STATE_TOPIC_PREFIX = "bergstream-replay."
TRANSACTIONAL_ID_PREFIX = "bergstream-replay-"
# A compacted topic keeps the newest progress of every replay for good; offsets of a consumer group
# would be deleted after `offsets.retention.minutes` without a member.
STATE_TOPIC_CONFIG = {"cleanup.policy": "compact"}
READ_SECONDS = 120.0


@dataclass(frozen=True)
class ReplayIdentity:
    """What makes two runs the same replay: the same rows, in the same order, into the same topic."""

    tables: tuple[str, ...]
    window: Window
    policy: OrderingPolicy
    regions: tuple[str, ...] | None
    to_topic: str

    def describe(self) -> dict[str, Any]:
        bound = self.policy.bound
        return {
            "tables": list(self.tables),
            "window": [format_instant(from_micros(self.window.start)),
                       format_instant(from_micros(self.window.end))],
            "ordering": self.policy.name,
            "bound_us": None if bound is None else bound // MICROSECOND,
            "regions": sorted(self.regions) if self.regions is not None else None,
            "to_topic": self.to_topic,
        }  # fmt: skip

    @property
    def digest(self) -> str:
        canonical = json.dumps(self.describe(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:24]

    @property
    def transactional_id(self) -> str:
        return f"{TRANSACTIONAL_ID_PREFIX}{self.digest}"

    @property
    def state_topic(self) -> str:
        return f"{STATE_TOPIC_PREFIX}{self.to_topic}"


@dataclass(frozen=True)
class ReplayProgress:
    """The epochs before `epoch` are delivered whole, and the first `sent` records of `epoch` in the
    replay's order; every table is read at its snapshot in `snapshots`."""

    snapshots: dict[str, int | None]
    epochs: int
    epoch: int = 0
    sent: int = 0

    @property
    def complete(self) -> bool:
        return self.epoch >= self.epochs

    def at(self, epoch: int, sent: int) -> ReplayProgress:
        return replace(self, epoch=epoch, sent=sent)

    def dumps(self, identity: ReplayIdentity) -> bytes:
        return json.dumps(
            {"format": PROGRESS_FORMAT, "replay": identity.describe(), "snapshots": self.snapshots,
             "epochs": self.epochs, "epoch": self.epoch, "sent": self.sent}
        ).encode()  # fmt: skip


def recorded_progress(client_config: dict[str, Any], identity: ReplayIdentity) -> ReplayProgress | None:
    """The progress the last committed transaction of the replay recorded; None for a replay never begun.

    Read after the producer's `init_transactions`, which has aborted an earlier run's open transaction."""
    ensure_topic(client_config, identity.state_topic, 1, STATE_TOPIC_CONFIG)
    value = last_committed_value(
        client_config, identity.state_topic, identity.digest.encode(), identity.transactional_id, READ_SECONDS
    )
    if value is None:
        return None
    try:
        recorded = json.loads(value)
        if recorded.get("format") != PROGRESS_FORMAT:
            raise ValueError(f"format {recorded.get('format')!r}, not {PROGRESS_FORMAT}")
        return ReplayProgress(
            {table: snapshot for table, snapshot in recorded["snapshots"].items()},
            int(recorded["epochs"]), int(recorded["epoch"]), int(recorded["sent"]),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise BackfillError(
            f"the progress of replay {identity.digest} in topic {identity.state_topic} cannot be read "
            f"({error}): delete the topic to start the replays into {identity.to_topic} over"
        ) from error
