"""When a topic on a target lag is read and committed (router/commit_policy.py), and what it has unread: pure
logic, plain data. The settings that refuse a target lag: test_router_config.py."""

from __future__ import annotations

from bergstream.router.commit_policy import (
    COMMIT_RECORDS,
    SPREAD,
    Cadence,
    CommitPolicy,
    Unread,
    due_reason,
    phase,
)
from bergstream.schemas.batch_range import BatchRange


def unread(since: float, records: int = 10) -> Unread:
    return Unread({0: 100, 1: 7}, {0: 100 + records, 1: 7}, since)


def test_a_topic_without_a_target_lag_is_due_every_batch() -> None:
    assert due_reason(CommitPolicy(), 10, unread(0), now=1) == "every batch"


def test_a_topic_is_read_once_its_oldest_record_would_pass_the_lag_by_its_next_chance() -> None:
    # 60 s lag, 10 s between batches: unread since 100, it waits at 130 (30 + 2 x 10 < 60), due at 140.
    assert due_reason(CommitPolicy(60), 10, unread(100), now=130) is None
    assert due_reason(CommitPolicy(60), 10, unread(100), now=140) == "lag"
    # A target lag under two batches is due every batch.
    assert due_reason(CommitPolicy(15), 10, unread(100), now=100) == "lag"


def test_a_topic_is_read_once_a_commit_s_worth_is_unread() -> None:
    hour = CommitPolicy(3600)
    assert due_reason(hour, 1, unread(0, records=COMMIT_RECORDS), now=1) == "size"
    assert due_reason(hour, 1, unread(0, records=COMMIT_RECORDS - 1), now=1) is None
    small = CommitPolicy(3600, commit_bytes=5000, commit_records=50)
    assert due_reason(small, 1, unread(0, records=50), now=1) == "size"
    assert due_reason(small, 1, unread(0, records=49), now=1) is None
    # By size: 40 records of 100 bytes each are under 5,000 bytes, 50 of them are not.
    by_size = CommitPolicy(3600, commit_bytes=5000)
    assert due_reason(by_size, 1, unread(0, records=40), now=1, record_bytes=100) is None
    assert due_reason(by_size, 1, unread(0, records=50), now=1, record_bytes=100) == "size"


def test_what_a_topic_has_unread_spans_its_partitions_from_where_its_archive_ends() -> None:
    left = Unread({0: 100, 1: 50}, {0: 120, 1: 50, 2: 5}, 0.0)
    assert left.offsets == 20 + 0 + 0, "a partition its archive does not start yet counts from its end"
    assert left.range == BatchRange({0: 100, 1: 50}, {0: 120, 1: 50, 2: 5})
    assert Unread({0: 3}, {0: 3}, 0.0).empty


def test_topics_met_together_are_due_spread_over_the_last_part_of_their_lag() -> None:
    phases = [phase(f"playback.{number}") for number in range(100)]
    assert min(phases) < 0.1 and max(phases) > 0.9, "phases spread over [0, 1)"
    assert phase("playback.1") == phase("playback.1")
    # 60 s lag, 10 s between batches, unread since 0: a topic of phase 0 is due at 40 s, one of 0.99 at 25 s.
    assert due_reason(CommitPolicy(60), 10, unread(0), now=39, spread=0.0) is None
    assert due_reason(CommitPolicy(60), 10, unread(0), now=40, spread=0.0) == "lag"
    early = 60 * (1 - SPREAD * 0.99) - 20
    assert due_reason(CommitPolicy(60), 10, unread(0), now=early - 1, spread=0.99) is None
    assert due_reason(CommitPolicy(60), 10, unread(0), now=early, spread=0.99) == "lag"


def test_batches_longer_than_the_trigger_put_the_next_one_further_off_and_a_topic_due_sooner() -> None:
    cadence = Cadence(10)
    assert cadence.seconds == 10, "no batch yet: the trigger"
    cadence.began(100)
    cadence.ended(125)
    assert cadence.seconds == 25, "the last batch took 25 s"
    lag = CommitPolicy(target_lag=60)
    # Unread for 20 s: it waits on a 10 s cadence (20 + 2 x 10 < 60), due on a 25 s one (20 + 2 x 25 >= 60).
    assert due_reason(lag, 10, unread(since=105), now=125) is None
    assert due_reason(lag, cadence.seconds, unread(since=105), now=125) == "lag"
    cadence.began(131)
    cadence.ended(134)
    assert cadence.seconds == 10, "batches on the trigger again: never shorter than it"


def test_time_without_batches_is_not_taken_for_a_long_batch() -> None:
    cadence = Cadence(1)
    cadence.began(100)
    cadence.ended(102)
    # No records for an hour: no batch ran. The next one is as far off as the last one took, not an hour.
    cadence.began(3700)
    assert cadence.seconds == 2
    cadence.ended(3701)
    assert cadence.seconds == 1
