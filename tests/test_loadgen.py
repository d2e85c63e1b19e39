"""The load generator's event model and malformed records, as plain data: no Kafka, no Spark."""

from __future__ import annotations

import itertools
import random
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import fastavro
import fastavro.validation
import pytest

from bergstream.loadgen.events import TOPICS, EventModel, GeneratedEvent
from bergstream.loadgen.malformed import MALFORMATIONS, malform
from bergstream.schemas.event_schema import ENCODINGS, Encoding, EventSchema, load_event_schema

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class StepClock:
    """Advances a millisecond per call and remembers what it told."""

    def __init__(self) -> None:
        self.told: list[datetime] = []

    def __call__(self) -> datetime:
        self.told.append(START + timedelta(milliseconds=len(self.told)))
        return self.told[-1]


def take(model: EventModel, topic: str, n: int) -> list[GeneratedEvent]:
    return list(itertools.islice(model.events(topic), n))


@pytest.mark.parametrize("topic", TOPICS)
def test_a_seed_and_a_clock_give_the_same_events(topic: str) -> None:
    first = take(EventModel(seed=7, late_fraction=0.1, clock=StepClock()), topic, 3000)
    again = take(EventModel(seed=7, late_fraction=0.1, clock=StepClock()), topic, 3000)
    other_seed = take(EventModel(seed=8, late_fraction=0.1, clock=StepClock()), topic, 3000)
    assert first == again
    assert [g.event for g in first] != [g.event for g in other_seed]


@pytest.mark.parametrize("topic", TOPICS)
def test_records_are_keyed_by_a_large_sparse_account_id(topic: str) -> None:
    generated = take(EventModel(seed=1), topic, 5000)
    assert all(g.key == str(g.event["account_id"]).encode("ascii") for g in generated)
    assert all(10_000_000 <= g.event["account_id"] < 1_000_000_000 for g in generated)
    assert all(1 <= g.event["profile_id"] <= 5 for g in generated)


@pytest.mark.parametrize("topic", TOPICS)
def test_a_late_fraction_of_events_is_earlier_than_the_clock(topic: str) -> None:
    clock = StepClock()
    generated = take(EventModel(seed=3, late_fraction=0.2, clock=clock), topic, 20_000)
    assert len(clock.told) == len(generated)
    late = [(g, now) for g, now in zip(generated, clock.told, strict=True) if g.late]
    assert len(late) / len(generated) == pytest.approx(0.2, abs=0.015)
    assert all(g.event["event_ts"] < now for g, now in late)
    assert all(g.event["event_ts"] == now for g, now in zip(generated, clock.told, strict=True) if not g.late)


def test_no_late_events_unless_asked() -> None:
    generated = take(EventModel(seed=3, clock=StepClock()), "impression", 5000)
    assert not any(g.late for g in generated)


@pytest.mark.parametrize("topic", TOPICS)
def test_lateness_spans_but_never_exceeds_max_lateness(topic: str) -> None:
    clock = StepClock()
    max_lateness = timedelta(seconds=2)
    model = EventModel(seed=4, late_fraction=1.0, max_lateness=max_lateness, clock=clock)
    generated = take(model, topic, 20_000)
    lateness = [now - g.event["event_ts"] for g, now in zip(generated, clock.told, strict=True)]
    assert all(g.late for g in generated)
    assert all(timedelta(0) < delay <= max_lateness for delay in lateness)
    assert max(lateness) > 0.99 * max_lateness
    assert min(lateness) < 0.01 * max_lateness


@pytest.mark.parametrize(("field", "population"), [("account_id", 10_000), ("show_id", 20_000)])
def test_a_few_accounts_and_shows_dominate(field: str, population: int) -> None:
    generated = take(EventModel(seed=5, accounts=10_000, shows=20_000), "impression", 20_000)
    counts = Counter(g.event[field] for g in generated)
    top_percent = sum(n for _, n in counts.most_common(population // 100))
    # Uniform ids would give the top 1% about 2-3% of the events.
    assert top_percent / len(generated) > 0.2


def test_plays_go_start_heartbeats_stop_interleaved() -> None:
    plays: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    most_active = active = 0
    for generated in take(EventModel(seed=6), "playback", 20_000):
        event = generated.event
        plays[event["playback_id"]].append(event)
        active += {"START": 1, "HEARTBEAT": 0, "STOP": -1}[event["event_type"]]
        most_active = max(most_active, active)

    assert most_active > 10
    finished = 0
    for events in plays.values():
        types = [e["event_type"] for e in events]
        assert types[0] == "START"
        assert set(types[1:-1]) <= {"HEARTBEAT"}
        assert len(types) == 1 or types[-1] in ("HEARTBEAT", "STOP")
        finished += types[-1] == "STOP"
        assert events[0]["view_duration_sec"] == 0
        assert events[0]["bitrate_kbps"] is None
        for before, after in itertools.pairwise(events):
            assert after["position_sec"] >= before["position_sec"]
            assert after["view_duration_sec"] - before["view_duration_sec"] == (
                after["position_sec"] - before["position_sec"]
            )
            if after["event_type"] == "HEARTBEAT":
                assert after["position_sec"] - before["position_sec"] == 60
        assert len({(e["account_id"], e["profile_id"], e["show_id"], e["country"]) for e in events}) == 1
    assert finished > 300


def _attribution(impression_seed: int, playback_seed: int) -> tuple[float, float]:
    """The share of plays that follow an impression of their account and show, and the take rate: the share
    of impressions, up to the last one followed, that led to a play."""
    clock = StepClock()
    impressions = take(EventModel(seed=impression_seed, clock=clock), "impression", 20_000)
    playbacks = take(EventModel(seed=playback_seed, clock=clock), "playback", 5000)
    first_seen: dict[tuple[int, int], tuple[int, datetime]] = {}
    for index, g in enumerate(impressions):
        first_seen.setdefault((g.event["account_id"], g.event["show_id"]), (index, g.event["event_ts"]))
    starts = [g.event for g in playbacks if g.event["event_type"] == "START"]
    followed = [
        seen[0]
        for e in starts
        if (seen := first_seen.get((e["account_id"], e["show_id"]))) is not None and seen[1] < e["event_ts"]
    ]
    return len(followed) / len(starts), len(followed) / (max(followed, default=0) + 1)


def test_most_plays_follow_an_impression_of_the_same_seed() -> None:
    attributed, take_rate = _attribution(11, 11)
    # Not all: some plays start from continue watching and the like, without an impression.
    assert 0.6 < attributed < 0.95
    assert 0.05 < take_rate < 0.10
    assert _attribution(11, 12)[0] < 0.2


@pytest.mark.parametrize("topic", TOPICS)
def test_every_event_encodes_and_decodes_in_both_encodings(topic: str) -> None:
    schema = load_event_schema(topic)
    names = [f["name"] for f in schema.fields]
    generated = take(EventModel(seed=9, late_fraction=0.3), topic, 3000)
    nulls: Counter[str] = Counter()
    for g in generated:
        event = g.event
        assert list(event) == names
        assert event["event_ts"].utcoffset() == timedelta(0)
        nulls.update(name for name, value in event.items() if value is None)
        in_millis = event["event_ts"].replace(microsecond=event["event_ts"].microsecond // 1000 * 1000)
        assert schema.decode(schema.encode(event, "avro"), "avro") == {**event, "event_ts": in_millis}
        iso = in_millis.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        assert schema.decode(schema.encode(event, "json"), "json") == {**event, "event_ts": iso}
    optional = {"playback": "bitrate_kbps", "impression": "artwork_id"}[topic]
    assert 0 < nulls[optional] < len(generated) / 2


def _is_valid_event(value: bytes | None, schema: EventSchema, encoding: Encoding) -> bool:
    if value is None:
        return False
    try:
        record = schema.decode(value, encoding)
    except Exception:  # whatever the decoder raises, the value is not an event
        return False
    if not isinstance(record, dict):
        return False
    if encoding == "json" and isinstance(record.get("event_ts"), str):
        record = {**record, "event_ts": datetime.fromisoformat(record["event_ts"])}
    valid: bool = fastavro.validation.validate(record, fastavro.parse_schema(schema.avro), raise_errors=False)
    return valid


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("topic", TOPICS)
def test_every_malformation_is_produced_and_invalid(topic: str, encoding: Encoding) -> None:
    schema = load_event_schema(topic)
    rng = random.Random(13)
    kinds: Counter[str] = Counter()
    for g in take(EventModel(seed=13), topic, 400):
        assert _is_valid_event(schema.encode(g.event, encoding), schema, encoding)
        bad = malform(g.event, schema, encoding, rng)
        kinds[bad.kind] += 1
        assert not _is_valid_event(bad.value, schema, encoding), (bad.kind, bad.value)
        assert (bad.value is None) == (bad.kind == "null_value")
    assert set(kinds) == set(MALFORMATIONS[encoding])
    # Chosen uniformly: no kind far from its share.
    assert min(kinds.values()) > 400 / len(kinds) / 2


def test_malform_is_deterministic_for_an_rng_state() -> None:
    schema = load_event_schema("impression")
    events = [g.event for g in take(EventModel(seed=2, clock=StepClock()), "impression", 200)]
    first = [malform(e, schema, "json", random.Random(1)) for e in events]
    again = [malform(e, schema, "json", random.Random(1)) for e in events]
    assert first == again


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"late_fraction": 1.5}, r"late_fraction must be between 0 and 1, got 1\.5"),
        ({"late_fraction": -0.1}, r"late_fraction must be between 0 and 1, got -0\.1"),
        ({"accounts": 0}, r"accounts must be between 1 and \d+, got 0"),
        ({"shows": -3}, r"shows must be between 1 and \d+, got -3"),
        ({"max_lateness": timedelta(0)}, "max_lateness must be positive, got 0:00:00"),
    ],
)
def test_bad_arguments_are_refused(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        EventModel(**arguments)


def test_an_unknown_topic_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown topic 'clicks'; known topics: playback, impression"):
        EventModel().events("clicks")
