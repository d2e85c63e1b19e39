"""Time lag from samples of the log end: how long the first record not yet archived has waited; and the
Kafka timestamps of the records a backlog starts at."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.consumer_group import GroupCommitter
from bergstream.router.offsets import LogEndSamples, time_lag
from tests.services import Services


def samples(*points: tuple[int, float]) -> LogEndSamples:
    table = LogEndSamples()
    for offset, seen_at in points:
        table.observe(offset, seen_at)
    return table


def test_a_caught_up_partition_has_no_time_lag_however_old_its_last_record() -> None:
    quiet = samples((500, 0.0), (500, 3600.0))
    assert time_lag(500, 500, quiet, record_timestamp=None, now=7200.0) == 0.0


def test_the_first_unarchived_record_is_dated_between_the_samples_that_bracket_it() -> None:
    # 100 records produced evenly between t=10 and t=20: record 50 (the 51st) came at t=15.1.
    table = samples((0, 10.0), (100, 20.0))
    assert table.produced_at(50) == pytest.approx(15.1)
    assert time_lag(50, 100, table, record_timestamp=None, now=30.0) == pytest.approx(14.9)


def test_a_stopped_router_lags_more_every_second() -> None:
    # The router archived everything up to 1000 and stopped; records kept coming from t=60 on.
    table = samples((1000, 0.0), (1000, 60.0), (1100, 61.0), (1200, 62.0))
    lags = [time_lag(1000, 1200, table, None, now) for now in (62.0, 72.0, 82.0)]
    assert lags == pytest.approx([1.99, 11.99, 21.99])  # record 1000 came at t=60.01


def test_a_quiet_run_keeps_its_first_and_last_sighting_only() -> None:
    table = samples(*[(7, float(t)) for t in range(10)], (9, 10.0))
    assert table.samples == [(7, 0.0), (7, 9.0), (9, 10.0)]
    assert table.produced_at(7) == pytest.approx(9.5)


def test_a_backlog_older_than_the_samples_is_dated_by_its_record_timestamp() -> None:
    # The router started at t=1000 and found 5,000 records waiting; the first was produced at t=400.
    table = samples((5000, 1000.0), (5100, 1010.0))
    assert table.produced_at(0) is None
    assert time_lag(0, 5100, table, record_timestamp=400.0, now=1020.0) == pytest.approx(620.0)
    # A producer clock ahead of ours cannot make the record younger than the first sighting of it.
    assert time_lag(0, 5100, table, record_timestamp=1015.0, now=1020.0) == pytest.approx(20.0)
    # Without its timestamp, the first sighting gives the least it has waited.
    assert time_lag(0, 5100, table, record_timestamp=None, now=1020.0) == pytest.approx(20.0)


def test_samples_no_record_needs_are_forgotten() -> None:
    table = samples((0, 0.0), (100, 1.0), (200, 2.0), (300, 3.0))
    table.forget_before(250)
    assert table.samples == [(200, 2.0), (300, 3.0)]
    assert table.produced_at(250) == pytest.approx(2.51)


def test_a_partition_made_again_starts_a_new_table() -> None:
    table = samples((900, 0.0), (1000, 1.0), (3, 2.0))
    assert table.samples == [(3, 2.0)]


def test_a_long_table_is_thinned_in_its_older_half_and_keeps_its_ends() -> None:
    table = LogEndSamples(limit=10)
    for n in range(11):
        table.observe(100 * n, float(n))
    assert len(table.samples) <= 10
    assert table.samples[0] == (0, 0.0) and table.samples[-1] == (1000, 10.0)
    assert table.produced_at(450) == pytest.approx(4.51)


@pytest.mark.integration
def test_record_timestamps_at_offsets_deep_in_a_backlog_come_from_those_records(
    stack: Services, topic_name: str
) -> None:
    partitions, events = 4, 400_000
    backlog = ProduceRequest(
        topic=topic_name, schema="playback", count=events, partitions=partitions, late_fraction=0.05, seed=5
    )
    produce(
        backlog, stack.bootstrap_servers, producer_config={"compression.type": "lz4"}, show_progress=False
    )
    client = {"bootstrap.servers": stack.bootstrap_servers}

    def read_one_by_one(positions: dict[int, int]) -> dict[int, float]:
        """The timestamp of the record at each position, read by a consumer of its own, partition by
        partition."""
        consumer = Consumer({**client, "group.id": f"{topic_name}-check", "enable.auto.commit": False})
        try:
            found = {}
            for partition, offset in positions.items():
                consumer.assign([TopicPartition(topic_name, partition, offset)])
                message = consumer.poll(30)
                assert message is not None and message.error() is None, (partition, offset)
                found[partition] = message.timestamp()[1] / 1000
                consumer.unassign()
            return found
        finally:
            consumer.close()

    kafka = GroupCommitter(topic_name, f"{topic_name}-group", client)
    try:
        ends = {partition: high for partition, (_, high) in kafka.watermarks().items()}
        # Read again and again, as a router catching up does, each time at another depth of the backlog,
        # within the time the router allows it.
        for depth in (0.0, 0.5, 0.9, 0.3):
            positions = {p: int(depth * end) + 7 * p for p, end in ends.items()}
            assert kafka.record_timestamps(positions) == read_one_by_one(positions), depth
        # A partition with nothing at its position is left out; the others are still read.
        positions = {0: ends[0], 1: 123, 2: ends[2] - 1}
        found = kafka.record_timestamps(positions, timeout=2)
        assert found == read_one_by_one({1: 123, 2: ends[2] - 1})
    finally:
        kafka.close()
