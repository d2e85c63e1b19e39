"""The scenarios the corrections' tests share: topics with a late partition, archived, and the rows each
application should write, computed here from every event sent.

Partition 0 of each application's first topic holds events of its first hour only, read by a live
application beside partitions 1 and 2 that run five hours ahead (Spark's Kafka source reads each partition's
backlog at the same pace in offsets), so that the live query drops most of partition 0's events behind its
watermark; read back from the archive in ingestion order, none is dropped.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyiceberg.exceptions import NoSuchTableError

from bergstream.loadgen.events import EventModel
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.runtime.correct.edges import EDGES
from bergstream.runtime.correct.state import QUERY_ID, recorded
from bergstream.runtime.correct.writer import COPIED
from bergstream.schemas.event_schema import load_event_schema
from tests.commands import Ran, run_in_process
from tests.routers import eventually
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).parent.parent
GAP = timedelta(minutes=30)
ATTRIBUTION_WINDOW = timedelta(minutes=30)
# Few events an account: most sessions are one or two events long, all shorter than the settle below.
ACCOUNTS = 20_000
SHOWS = 40
Row = tuple[tuple[Any, ...], tuple[Any, ...]]
Event = dict[str, Any]


class Killed(Exception):
    """A kill of a run at the step a test puts it in: nothing after it is done."""


def killed(*_: Any, **__: Any) -> None:
    raise Killed


def send(
    bootstrap: str,
    topic: str,
    kind: str,
    partition: int,
    times: list[datetime],
    seed: int,
    made: Callable[[Event, datetime, random.Random], None],
) -> list[Event]:
    """Events of `kind` at `times` (their Kafka timestamps) into one partition, each made by `made` from a
    generated one; what was sent."""
    clock = [times[0]]
    events = EventModel(seed=seed, clock=lambda: clock[0]).events(kind)
    schema = load_event_schema(kind)
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap})
    sent = []
    for at in times:
        clock[0] = at
        event = dict(next(events).event)
        event["event_ts"] = at
        made(event, at, rng)
        producer.produce(topic, schema.encode(event, "json"), partition=partition,
                         timestamp=int(event["event_ts"].timestamp() * 1000))  # fmt: skip
        sent.append({**event, "_at": f"{topic}/{partition}"})
    assert producer.flush(60) == 0
    return sent


def resend(bootstrap: str, topic: str, kind: str, partition: int, events: list[Event]) -> list[Event]:
    """Events sent before, into another topic's partition: what was sent."""
    schema = load_event_schema(kind)
    producer = Producer({"bootstrap.servers": bootstrap})
    sent = []
    for sent_before in events:
        event = {name: value for name, value in sent_before.items() if name != "_at"}
        producer.produce(topic, schema.encode(event, "json"), partition=partition,
                         timestamp=int(event["event_ts"].timestamp() * 1000))  # fmt: skip
        sent.append({**event, "_at": f"{topic}/{partition}"})
    assert producer.flush(60) == 0
    return sent


def spread(start: datetime, span: timedelta, count: int) -> list[datetime]:
    return [start + span * index / count for index in range(count)]


def any_account(event: Event, at: datetime, rng: random.Random) -> None:
    event["account_id"] = 10_000_000 + rng.randrange(ACCOUNTS)


def any_show(event: Event, at: datetime, rng: random.Random) -> None:
    any_account(event, at, rng)
    event["show_id"] = 1_000 + rng.randrange(SHOWS)


@dataclass(frozen=True)
class Scenario:
    """An application over topics with a late partition, and the rows it should write."""

    app: str
    start: datetime
    topics: dict[str, str]  # source -> topic, its archive table of the same name
    ends: dict[str, int]  # topic/partition -> the end offset of what was sent first
    events: dict[str, list[Event]]  # source -> every event sent
    time_column: str
    key: tuple[str, ...]
    values: tuple[str, ...]
    output: dict[str, Any]
    options: dict[str, Any]
    rows: Callable[[dict[str, list[Event]]], dict[tuple[Any, ...], tuple[Any, ...]]]
    more: Callable[[datetime], dict[str, list[Event]]]  # new events at a time, per source

    def expected(self, start: datetime, end: datetime) -> Counter[Row]:
        """The rows whose time is in [start, end), each once."""
        at = self.key.index(self.time_column)
        return Counter((key, row) for key, row in self.rows(self.events).items() if start <= key[at] < end)

    def in_window(self, start: datetime, end: datetime) -> str:
        column = self.time_column
        return f"{column} >= TIMESTAMP '{start.isoformat()}' AND {column} < TIMESTAMP '{end.isoformat()}'"


def sessions(events: dict[str, list[Event]]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """The sessionizer's rows: (account, session start) -> (end, events, plays, longest view)."""
    by_account: dict[int, list[Event]] = defaultdict(list)
    for event in events["playback"]:
        by_account[event["account_id"]].append(event)
    found = {}
    for account, own in by_account.items():
        own.sort(key=lambda event: event["event_ts"])
        current: list[Event] = []
        for event in [*own, None]:
            if current and (event is None or event["event_ts"] >= current[-1]["event_ts"] + GAP):
                found[(account, current[0]["event_ts"])] = (
                    current[-1]["event_ts"] + GAP, len(current),
                    sum(1 for e in current if e["event_type"] == "START"),
                    max(e["view_duration_sec"] for e in current),
                )  # fmt: skip
                current = []
            if event is not None:
                current.append(event)
    return found


def take_rates(events: dict[str, list[Event]]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """The attribution's rows: (hour, show) -> (hour's end, impressions, plays, take rate); an impression
    that led to several plays counts once for each, as the application's outer join does."""
    plays: dict[tuple[int, int], list[datetime]] = defaultdict(list)
    for play in events["playback"]:
        if play["event_type"] == "START":
            plays[(play["account_id"], play["show_id"])].append(play["event_ts"])
    counts: dict[tuple[datetime, int], list[int]] = defaultdict(lambda: [0, 0])
    for impression in events["impression"]:
        at = impression["event_ts"]
        led = [ts for ts in plays[(impression["account_id"], impression["show_id"])]
               if at <= ts <= at + ATTRIBUTION_WINDOW]  # fmt: skip
        hour = at.replace(minute=0, second=0, microsecond=0)
        counts[(hour, impression["show_id"])][0] += max(1, len(led))
        counts[(hour, impression["show_id"])][1] += len(led)
    return {
        key: (key[0] + timedelta(hours=1), shown, played, round(played / shown, 9))
        for key, (shown, played) in counts.items()
    }


def table_rows(
    spark: SparkSession, scenario: Scenario, table: str, where: str, version: str | int | None = None
) -> Counter[Row]:
    """The table's rows `where`, at `version` (a tag, a snapshot) or now, as `Scenario.rows` makes them."""
    source = table
    if version is not None:
        source += f" VERSION AS OF '{version}'" if isinstance(version, str) else f" VERSION AS OF {version}"
    columns = ", ".join((*scenario.key, *scenario.values))
    return Counter(
        (tuple(_plain(row[c]) for c in scenario.key), tuple(_plain(row[c]) for c in scenario.values))
        for row in spark.sql(f"SELECT {columns} FROM {source} WHERE {where}").collect()
    )


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return round(value, 9) if isinstance(value, float) else value


def make_topic(stack: Services, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def archive(
    stack: Services, spark: SparkSession, topic: str, kind: str, checkpoint: Path, count: int
) -> None:
    config = RouterConfig.flat(
        topic=topic, schema=kind, encoding="json", table=topic,
        kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        checkpoint_location=str(checkpoint), catalog=stack.catalog,
    )  # fmt: skip
    assert archive_available_now(spark, config).read == count


def eight_hours_ago() -> datetime:
    return datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=8)


def late_plays(stack: Services, spark: SparkSession, home: Path, name: str = "late_plays") -> Scenario:
    """Plays: partition 0 the first hour (300), partitions 1 and 2 five hours (1,500 each), into the topic
    `name`; the router's checkpoint under `home`."""
    topic, start, bootstrap = f"{name}_{os.getpid()}", eight_hours_ago(), stack.bootstrap_servers
    make_topic(stack, topic, 3)
    plays = send(bootstrap, topic, "playback", 0, spread(start, timedelta(hours=1), 300), 1, any_account)
    for partition in (1, 2):
        times = spread(start, timedelta(hours=5), 1500)
        plays += send(bootstrap, topic, "playback", partition, times, partition + 1, any_account)
    archive(stack, spark, topic, "playback", home / "router", len(plays))

    def more(at: datetime) -> dict[str, list[Event]]:
        times = spread(at, timedelta(minutes=1), 20)
        return {"playback": send(bootstrap, topic, "playback", 1, times, int(at.timestamp()), any_account)}

    return Scenario(
        app="sessionizer", start=start, topics={"playback": topic},
        ends=dict(Counter(event["_at"] for event in plays)), events={"playback": plays},
        time_column="session_start", key=("account_id", "session_start"),
        values=("session_end", "events", "plays", "longest_view_sec"),
        output={"end_column": "session_end", "warm_up": "1h", "settle": "3h"},
        options={"gap": "30 minutes", "watermark_delay": "1 hour"}, rows=sessions, more=more,
    )  # fmt: skip


@dataclass(frozen=True)
class Edges:
    """Sessions that cross a window's start and end, and a live topic that lacks one event of each."""

    scenario: Scenario  # its topic: every event, archived
    live_topic: str  # every event but the dropped ones
    window: tuple[datetime, datetime]
    dropped: list[Event]


def edge_plays(stack: Services, spark: SparkSession, home: Path) -> Edges:
    """Plays of random accounts over six hours in two partitions, and on partition 0, accounts whose sessions
    cross the window [t0 + 2h, t0 + 3h): without the events marked (dropped by the live topic), each of them
    is two sessions, split across the window's edge:
    - 1: S-20m, S-5m*, S+12m: one session from before S into the window;
    - 2: E-10m, E+5m*, E+25m: one session from the window past E;
    - 3: S-45m, S-20m*, S+5m: as 1, starting earlier;
    - 4: S-80m, S-55m, S-30m*, S-5m, S+15m: from before S - 1h, past a warm-up of an hour.
    """
    start, bootstrap = eight_hours_ago(), stack.bootstrap_servers
    window = (start + timedelta(hours=2), start + timedelta(hours=3))
    begin, end = window
    minutes = lambda at, count: at + timedelta(minutes=count)  # noqa: E731
    designed = {
        1: [(minutes(begin, -20), False), (minutes(begin, -5), True), (minutes(begin, 12), False)],
        2: [(minutes(end, -10), False), (minutes(end, 5), True), (minutes(end, 25), False)],
        3: [(minutes(begin, -45), False), (minutes(begin, -20), True), (minutes(begin, 5), False)],
        4: [(minutes(begin, -80), False), (minutes(begin, -55), False), (minutes(begin, -30), True),
            (minutes(begin, -5), False), (minutes(begin, 15), False)],
    }  # fmt: skip
    marks = sorted((at, account, drop) for account, events in designed.items() for at, drop in events)
    every, live = f"edge_plays_{os.getpid()}", f"edge_plays_live_{os.getpid()}"
    for topic in (every, live):
        make_topic(stack, topic, 2)
    # Partition 0: the designed accounts' events among others, in time order; the live topic gets the same
    # events but the dropped ones. Partition 1: others only, the same in both.
    background = spread(start, timedelta(hours=6), 400)
    designed_at: dict[datetime, list[int]] = defaultdict(list)
    for at, account, _ in marks:
        designed_at[at].append(account)

    def designed_first(event: Event, at: datetime, rng: random.Random) -> None:
        accounts = designed_at.get(at)
        if accounts:
            event["account_id"] = accounts.pop(0)
        else:
            any_account(event, at, rng)

    times = sorted([*background, *(at for at, _, _ in marks)])
    first = send(bootstrap, every, "playback", 0, times, 7, designed_first)
    drops = {(at, account) for at, account, drop in marks if drop}
    dropped = [event for event in first if (event["event_ts"], event["account_id"]) in drops]
    kept = [event for event in first if (event["event_ts"], event["account_id"]) not in drops]
    sent = {every: first, live: resend(bootstrap, live, "playback", 0, kept)}
    for topic in (every, live):
        sent[topic] += send(bootstrap, topic, "playback", 1, background, 31, any_account)
    archive(stack, spark, every, "playback", home / "router", len(sent[every]))
    scenario = Scenario(
        app="sessionizer", start=start, topics={"playback": every},
        ends=dict(Counter(event["_at"] for event in sent[every])), events={"playback": sent[every]},
        time_column="session_start", key=("account_id", "session_start"),
        values=("session_end", "events", "plays", "longest_view_sec"),
        output={"end_column": "session_end", "warm_up": "1h", "settle": "3h"},
        options={"gap": "30 minutes", "watermark_delay": "1 hour"}, rows=sessions, more=lambda _: {},
    )  # fmt: skip
    return Edges(scenario, live, window, dropped)


def late_impressions(
    stack: Services, spark: SparkSession, home: Path, name: str = "late_impressions"
) -> Scenario:
    """Impressions as the plays above, into the topic `name`; half of them lead to a play of their account
    and title within 20 minutes, in a topic of two partitions that runs in step. The routers' checkpoints
    under `home` (impressions, plays)."""
    start, bootstrap = eight_hours_ago(), stack.bootstrap_servers
    impressions_topic, plays_topic = f"{name}_{os.getpid()}", f"plays_of_{name}_{os.getpid()}"
    make_topic(stack, impressions_topic, 3)
    make_topic(stack, plays_topic, 2)

    def impressions_at(partition: int, times: list[datetime], seed: int) -> list[Event]:
        return send(bootstrap, impressions_topic, "impression", partition, times, seed, any_show)

    def plays_of(impressions: list[Event], seed: int) -> list[Event]:
        rng = random.Random(seed)
        led = sorted(
            ((impression["event_ts"] + timedelta(seconds=rng.randrange(0, 1200)), impression)
             for impression in impressions if rng.random() < 0.5),
            key=lambda pair: pair[0],
        )  # fmt: skip
        sent = []
        for partition in (0, 1):
            own = led[partition::2]
            if not own:
                continue

            def follow(event: Event, at: datetime, _: random.Random, own: list[Any] = own) -> None:
                impression = next(i for t, i in own if t == at)
                event.update(account_id=impression["account_id"], show_id=impression["show_id"],
                             event_type="START")  # fmt: skip

            sent += send(bootstrap, plays_topic, "playback", partition, [t for t, _ in own], seed + partition,
                         follow)  # fmt: skip
        return sent

    impressions = impressions_at(0, spread(start, timedelta(hours=1), 300), 11)
    for partition in (1, 2):
        impressions += impressions_at(partition, spread(start, timedelta(hours=5), 1500), 11 + partition)
    plays = plays_of(impressions, 21)
    archive(stack, spark, impressions_topic, "impression", home / "impressions", len(impressions))
    archive(stack, spark, plays_topic, "playback", home / "plays", len(plays))
    ends = dict(Counter(event["_at"] for event in [*impressions, *plays]))

    def more(at: datetime) -> dict[str, list[Event]]:
        shown = impressions_at(1, spread(at, timedelta(minutes=1), 20), int(at.timestamp()))
        return {"impression": shown, "playback": plays_of(shown, int(at.timestamp()))}

    return Scenario(
        app="attribution", start=start, topics={"impression": impressions_topic, "playback": plays_topic},
        ends=ends, events={"impression": impressions, "playback": plays},
        time_column="period_start", key=("period_start", "show_id"),
        values=("period_end", "impressions", "plays", "take_rate"),
        output={"end_column": "period_end", "warm_up": "30m", "settle": "3h"},
        options={"attribution_window": "30 minutes", "watermark_delay": "1 hour", "period": "1 hour"},
        rows=take_rates, more=more,
    )  # fmt: skip


def last_offsets(checkpoint: Path) -> dict[str, int]:
    """The end offsets of the newest micro-batch the live query committed: topic/partition -> offset."""
    commits = [int(path.name) for path in (checkpoint / "commits").glob("[0-9]*")]
    if not commits:
        return {}
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    found = {}
    for line in lines[2:]:
        for topic, offsets in json.loads(line).items():
            found.update({f"{topic}/{partition}": int(offset) for partition, offset in offsets.items()})
    return found


def correct_live(
    stack: Services, spark: SparkSession, tmp_path: Path, scenario: Scenario, own_processes: bool = False
) -> None:
    """The proof for `scenario`'s application (the attribution's in test_corrections_two_sources.py, so
    that the two run side by side). With `own_processes`, the audit that falls below its match runs as an
    operator's script runs it, a process and a driver of its own whose exit code says so; the other commands
    the proof runs whole (the resumed run too) run in this process, on its session."""
    t0 = scenario.start
    output = f"{scenario.app}_{next(iter(scenario.topics.values()))}"
    identifier = f"{stack.catalog.name}.apps.{output}"
    window = (t0, t0 + timedelta(hours=1))
    settings = {
        "app": scenario.app,
        "entry": f"bergstream.apps.{scenario.app}:{scenario.app}",
        "sources": {
            kind: {"topic": topic, "table": topic, "schema": kind} for kind, topic in scenario.topics.items()
        },
        "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
        "checkpoint_location": str(tmp_path / "live"),
        "trigger_interval": "2 seconds",
        "max_offsets_per_trigger": 150 * len(scenario.topics),
        "output_table": f"apps.{output}",
        "backfill": {"max_misalignment": "10m"},
        "output": {"time_column": scenario.time_column, "key": list(scenario.key), **scenario.output},
        "options": scenario.options,
        "spark": {"master": "local[2]"},
    }  # fmt: skip
    config = tmp_path / f"{scenario.app}.yaml"
    config.write_text(yaml.safe_dump(settings))
    app = ["--app", scenario.app, "--config", str(config)]
    in_window = scenario.in_window(*window)

    def rows(table: str, where: str, version: str | int | None = None) -> Counter[Row]:
        return table_rows(spark, scenario, table, where, version)

    def in_process(*arguments: str) -> Ran:
        """A command the proof runs whole, on this process's Spark session; the live query, the killed run
        and its resumption are commands of their own."""
        return run_in_process(spark, *arguments)

    def as_operator(*arguments: str) -> Ran | subprocess.CompletedProcess[str]:
        if not own_processes:
            return in_process(*arguments)
        return subprocess.run([sys.executable, "-m", "bergstream", *arguments], cwd=ROOT, capture_output=True,
                              text=True, timeout=600, check=False)  # fmt: skip

    live_log = tmp_path / "live.log"
    with live_log.open("wb") as out:
        live = subprocess.Popen([sys.executable, "-m", "bergstream", "app", "run", *app], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    producing = threading.Event()
    try:
        # The live query reads the topics' backlog, dropping partition 0's events behind its watermark.
        eventually(lambda: last_offsets(tmp_path / "live") == scenario.ends, "the live query read the topics",
                   timeout=300)  # fmt: skip
        expected = scenario.expected(*window)
        lived = rows(identifier, in_window)
        assert lived != expected, "the live query dropped none of partition 0's events"

        # The correction, killed once while it writes its branch, then resumed by the same command.
        start, end = (instant.isoformat() for instant in window)
        command = [sys.executable, "-m", "bergstream", "backfill", "run", *app, "--start", start,
                   "--end", end, "--branch", "fix"]  # fmt: skip
        catalog = stack.catalog.load()
        table = catalog.load_table(("apps", output))
        # Made by the live query, partitioned by the hour of the time column: the window holds whole files.
        source = table.schema().find_field(scenario.time_column).field_id
        partitioning = [(str(field.transform), field.source_id) for field in table.spec().fields]
        assert partitioning == [("hour", source)]

        def run_batches() -> int:
            """The batches the run has written into its table beside the output."""
            try:
                written = catalog.load_table(("apps", f"{output}__correction_fix"))
            except NoSuchTableError:
                return 0
            return sum(QUERY_ID in (snapshot.summary.additional_properties if snapshot.summary else {})
                       for snapshot in written.snapshots())  # fmt: skip

        killed_log = tmp_path / "killed.log"
        with killed_log.open("wb") as out:
            first = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        eventually(lambda: run_batches() >= 1 or first.poll() is not None, "a batch of the run written")
        assert first.poll() is None, killed_log.read_text()[-3000:]
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        resumed = in_process(*command[3:], "--json")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert json.loads(resumed.stdout)["ok"] is True
        # The branch: main as it was made from, its window's rows the true ones, each once.
        branch_rows = rows(f"{identifier}.branch_fix", in_window)
        assert branch_rows == expected, (
            sorted(branch_rows - expected)[:5], sorted(expected - branch_rows)[:5],
            len(branch_rows), len(expected),
        )  # fmt: skip
        correction = recorded(dict(catalog.load_table(("apps", output)).properties), "fix")
        assert correction is not None and correction.complete
        # The application's watermark passed the window's end: its rows of the window were all written.
        assert correction.watermark is not None and correction.watermark >= correction.end, correction
        # Outside the window widened to the rows that cross its edges (edges.py), main's rows as they were.
        outside = f"NOT ({scenario.in_window(*correction.replaced)})"
        beside = f"({scenario.in_window(*correction.replaced)}) AND NOT ({in_window})"
        assert rows(f"{identifier}.branch_fix", outside) == rows(identifier, outside, version=correction.base)
        # Its commits since main's snapshot: the clearing of main's window first, then the run's rows of the
        # window in one, then, where rows cross the window's edges, main's beside it removed, the run's added.
        table.refresh()
        since: list[dict[str, str]] = []  # newest first
        snapshot = table.snapshot_by_id(table.metadata.refs["fix"].snapshot_id)
        while snapshot is not None and snapshot.snapshot_id != correction.base:
            since.append(snapshot.summary.additional_properties if snapshot.summary else {})
            snapshot = (
                table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
            )
        *edges, copied, clearing = since
        assert snapshot is not None and COPIED not in clearing and COPIED in copied, since
        assert len(edges) <= 2 and all(EDGES in found for found in edges[: len(edges) - 1]), since

        # The audit, against counts made here from main's rows and the true ones.
        audited = in_process("backfill", "audit", *app, "--branch", "fix", "--json")
        assert audited.returncode == 0, audited.stderr[-3000:]
        report = json.loads(audited.stdout)
        assert max(lived.values()) == 1 and max(expected.values()) == 1
        main_rows, truth_rows = dict(lived.keys()), dict(expected.keys())
        counts = {
            "equal": sum(1 for key in main_rows if key in truth_rows and main_rows[key] == truth_rows[key]),
            "changed": sum(1 for key in main_rows if key in truth_rows and main_rows[key] != truth_rows[key]),
            "only_main": sum(1 for key in main_rows if key not in truth_rows),
            "only_branch": sum(1 for key in truth_rows if key not in main_rows),
        }
        assert report["counts"] == counts
        assert report["match"] == pytest.approx(counts["equal"] / sum(counts.values()))
        below = as_operator("backfill", "audit", *app, "--branch", "fix", "--min-match", "0.999")
        assert below.returncode != 0 and "below --min-match" in below.stderr

        # Published while the live query goes on reading new events and committing.
        failures: list[BaseException] = []

        def keep_producing() -> None:
            # New events, hours after the window and never ahead of now (the broker refuses timestamps
            # more than an hour ahead of its clock): the live query's watermark moves on and it commits.
            at = t0 + timedelta(hours=6)
            try:
                while not producing.is_set():
                    scenario.more(at)
                    at = min(at + timedelta(minutes=5), datetime.now(UTC) - timedelta(minutes=5))
                    time.sleep(0.5)
            except BaseException as error:
                failures.append(error)
                raise

        def live_commits() -> int:
            return len(list((tmp_path / "live" / "commits").glob("[0-9]*")))

        before = live_commits()
        producer = threading.Thread(target=keep_producing, daemon=True)
        producer.start()
        eventually(lambda: live_commits() >= before + 2, "the live query committing new batches")
        published = in_process("backfill", "publish", *app, "--branch", "fix", "--json")
        assert published.returncode == 0, published.stderr[-3000:]
        publish = json.loads(published.stdout)
        after = live_commits()
        eventually(lambda: live_commits() >= after + 2, "the live query committing after the publish")
        producing.set()
        producer.join()
        assert not failures, failures
        again = in_process("backfill", "publish", *app, "--branch", "fix", "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["already"] is True, again.stderr[-3000:]
    finally:
        producing.set()
        live.send_signal(signal.SIGINT)
        live.wait(120)
    tag = publish["tag"]
    # Main: the window's rows are the true ones; outside it, exactly what the live query wrote, once.
    assert rows(identifier, in_window) == expected
    assert rows(identifier, beside) == rows(f"{identifier}.branch_fix", beside)
    tagged = spark.sql(f"SELECT snapshot_id FROM {identifier}.refs WHERE name = '{tag}'").first()
    assert tagged is not None
    since = spark.read.format("iceberg").option("start-snapshot-id", str(tagged.snapshot_id)).load(identifier)
    since.where(outside).createOrReplaceTempView("appended_since_the_tag")
    live_outside = rows(identifier, outside, version=tag) + rows("appended_since_the_tag", "true")
    assert rows(identifier, outside) == live_outside
    assert max(rows(identifier, "true").values()) == 1, "a row twice"

    # Unpublished: the window's rows are the live query's again, what it appended since kept.
    undone = in_process("backfill", "unpublish", *app, "--branch", "fix", "--json")
    assert undone.returncode == 0, undone.stderr[-3000:]
    assert rows(identifier, in_window) == lived
    assert rows(identifier, outside) == live_outside

    # Published again, then released: the branch, the tags and the record go; what is published stays.
    republished = in_process("backfill", "publish", *app, "--branch", "fix", "--json")
    assert republished.returncode == 0, republished.stderr[-3000:]
    assert json.loads(republished.stdout)["tag"] != tag
    assert rows(identifier, in_window) == expected
    assert rows(identifier, outside) == live_outside
    released = in_process("backfill", "release", *app[:2], "--branch", "fix", "--config", str(config))
    assert released.returncode == 0, released.stderr[-3000:]
    table = stack.catalog.load().load_table(("apps", output))
    assert sorted(table.metadata.refs) == ["main"]
    assert recorded(dict(table.properties), "fix") is None
    with pytest.raises(NoSuchTableError):
        stack.catalog.load().load_table(("apps", f"{output}__correction_fix"))
    assert rows(identifier, in_window) == expected
