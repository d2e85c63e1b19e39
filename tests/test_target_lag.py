"""When a topic on a target lag commits (router/commit_policy.py), and the range a commit of several batches
records: pure logic, plain data. The settings that refuse a target lag: test_router_config.py."""

from __future__ import annotations

from bergstream.router.commit_policy import (
    COMMIT_BYTES,
    COMMIT_RECORDS,
    SPREAD,
    Cadence,
    CommitPolicy,
    Held,
    Written,
    commit_reason,
    overdue,
    phase,
)
from bergstream.schemas.batch_range import BatchRange


def held(since: float, records: int = 10, size: int = 1000) -> Held:
    return Held(BatchRange({0: 0}, {0: 10}), {}, since, 0.0, records=records, bytes=size)


def written(records: int = 10, size: int = 1000, plan: str = "p1") -> Written:
    return Written(records, size, None, None, plan)


def test_a_topic_without_a_target_lag_commits_every_batch() -> None:
    assert commit_reason(CommitPolicy(), 10, held(0), written(), "p1", now=1) == "every batch"
    assert commit_reason(CommitPolicy(), 10, None, written(), None, now=1) == "every batch"


def test_a_topic_holds_its_files_until_its_oldest_would_pass_the_lag_at_the_next_batch() -> None:
    # 60 s lag, 10 s trigger: nothing pending, the batch's files are held.
    assert commit_reason(CommitPolicy(60), 10, None, written(), None, now=100) is None
    # Pending since 100: held at 130 (30 + 2 triggers < 60), committed at 140 (40 + 20 = 60).
    assert commit_reason(CommitPolicy(60), 10, held(100), written(), "p1", now=130) is None
    assert commit_reason(CommitPolicy(60), 10, held(100), written(), "p1", now=140) == "lag"
    # A target lag under two triggers commits every batch.
    assert commit_reason(CommitPolicy(15), 10, None, written(), None, now=100) == "lag"


def test_a_topic_commits_once_a_commit_s_worth_is_pending_and_at_a_schema_change() -> None:
    hour = CommitPolicy(3600)
    assert commit_reason(hour, 1, held(0, size=COMMIT_BYTES - 10), written(size=10), "p1", now=1) == "size"
    full = held(0, records=COMMIT_RECORDS - 1)
    assert commit_reason(hour, 1, full, written(records=1), "p1", now=1) == "size"
    # A topic's own commit's worth.
    small = CommitPolicy(3600, commit_bytes=5000, commit_records=50)
    assert commit_reason(small, 1, held(0, records=40), written(records=10), "p1", now=1) == "size"
    assert commit_reason(small, 1, held(0, records=30), written(records=10), "p1", now=1) is None
    assert commit_reason(small, 1, held(0, size=4000), written(size=1000), "p1", now=1) == "size"
    assert commit_reason(CommitPolicy(3600), 1, held(0), written(), "p1", now=1) is None
    # The rows' plan changed (a schema registry's new version): what is pending goes with this batch's.
    assert commit_reason(CommitPolicy(3600), 1, held(0), written(plan="p2"), "p1", now=1) == "schema"
    assert commit_reason(CommitPolicy(3600), 1, None, written(plan="p2"), "p1", now=1) is None


def test_a_commit_of_several_batches_records_the_oldest_start_and_the_newest_end() -> None:
    first = BatchRange({0: 100, 1: 50}, {0: 120, 1: 60})
    later = BatchRange({0: 130, 1: 60, 2: 0}, {0: 150, 1: 70, 2: 5})
    assert later.after(first) == BatchRange({0: 100, 1: 50, 2: 0}, {0: 150, 1: 70, 2: 5})
    assert later.after(BatchRange("earliest", {0: 120})) == BatchRange("earliest", {0: 150, 1: 70, 2: 5})


def test_topics_that_began_holding_together_commit_spread_over_the_last_part_of_their_lag() -> None:
    phases = [phase(f"playback.{number}") for number in range(100)]
    assert min(phases) < 0.1 and max(phases) > 0.9, "phases spread over [0, 1)"
    assert phase("playback.1") == phase("playback.1")
    # 60 s lag, 10 s trigger, pending since 0: a topic of phase 0 commits at 40 s, one of phase 0.99 at 25 s.
    assert commit_reason(CommitPolicy(60), 10, held(0), written(), "p1", now=39, spread=0.0) is None
    assert commit_reason(CommitPolicy(60), 10, held(0), written(), "p1", now=40, spread=0.0) == "lag"
    early = 60 * (1 - SPREAD * 0.99) - 20
    assert commit_reason(CommitPolicy(60), 10, held(0), written(), "p1", now=early - 1, spread=0.99) is None
    assert commit_reason(CommitPolicy(60), 10, held(0), written(), "p1", now=early, spread=0.99) == "lag"


def test_a_quiet_topic_s_files_are_committed_a_trigger_before_they_would_pass_its_lag() -> None:
    # 60 s lag, 10 s trigger, pending since 0: its next chance is at 60 s, so it commits at 50 s.
    assert not overdue(60, 10, since=0, now=49, spread=0.0)
    assert overdue(60, 10, since=0, now=50, spread=0.0)
    assert overdue(None, 10, since=0, now=0, spread=0.0), "a topic without a lag never waits"
    assert overdue(60, 10, since=0, now=60 * (1 - SPREAD * 0.5) - 10, spread=0.5)


def test_batches_longer_than_the_trigger_put_the_next_one_and_a_topic_s_commit_further_off() -> None:
    cadence = Cadence(10)
    assert cadence.seconds == 10, "no batch yet: the trigger"
    cadence.began(100)
    cadence.ended(125)
    assert cadence.seconds == 25, "the last batch took 25 s"
    lag = CommitPolicy(target_lag=60)
    # Pending for 20 s: held on a 10 s cadence (20 + 2 x 10 < 60), due on a 25 s one (20 + 2 x 25 >= 60).
    assert commit_reason(lag, 10, held(since=105), written(), "p1", now=125) is None
    assert commit_reason(lag, cadence.seconds, held(since=105), written(), "p1", now=125) == "lag"
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
