"""A past window corrected with a live application running: backfilled into a branch (killed once and
resumed), audited against main, published while the live query commits, unpublished, released.

The topic is the one the correction exists for: its partition 0 holds events of its first hour only, read by
a live application beside partitions 1 and 2 that run five hours ahead (Spark's Kafka source reads each
partition's backlog at the same pace in offsets), so that the live sessionizer drops most of partition 0's
events behind its watermark; read back from the archive in ingestion order, none is dropped.
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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bergstream.loadgen.events import EventModel
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.runtime.correct.state import QUERY_ID, recorded
from bergstream.schemas.event_schema import load_event_schema
from tests.routers import eventually
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parent.parent
GAP = timedelta(minutes=30)
# Few events an account: most sessions are one or two events long, all shorter than the settle below.
ACCOUNTS = 20_000


@dataclass(frozen=True)
class Event:
    account_id: int
    event_ts: datetime
    event_type: str
    view_duration_sec: int


@dataclass(frozen=True)
class LateTopic:
    topic: str
    start: datetime
    events: list[Event]


def send(bootstrap: str, topic: str, partition: int, times: list[datetime], seed: int) -> list[Event]:
    """Playback events at `times` (their Kafka timestamps and their event times) into one partition."""
    clock = [times[0]]
    events = EventModel(seed=seed, clock=lambda: clock[0]).events("playback")
    schema = load_event_schema("playback")
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap})
    sent = []
    for at in times:
        clock[0] = at
        event = dict(next(events).event)
        event["account_id"] = 10_000_000 + rng.randrange(ACCOUNTS)
        event["event_ts"] = at
        producer.produce(topic, schema.encode(event, "json"), partition=partition,
                         timestamp=int(at.timestamp() * 1000))  # fmt: skip
        sent.append(Event(event["account_id"], at, event["event_type"], event["view_duration_sec"]))
    assert producer.flush(60) == 0
    return sent


def spread(start: datetime, span: timedelta, count: int) -> list[datetime]:
    return [start + span * index / count for index in range(count)]


@pytest.fixture(scope="module")
def late_topic(stack: Services, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> LateTopic:
    topic = f"late_plays_{os.getpid()}"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=8)
    events = send(stack.bootstrap_servers, topic, 0, spread(start, timedelta(hours=1), 300), seed=1)
    for partition in (1, 2):
        events += send(stack.bootstrap_servers, topic, partition, spread(start, timedelta(hours=5), 1500),
                       seed=partition + 1)  # fmt: skip
    config = RouterConfig(
        topic=topic, schema="playback", encoding="json", table=topic,
        kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        checkpoint_location=str(tmp_path_factory.mktemp("late") / "router"), catalog=stack.catalog,
    )  # fmt: skip
    assert archive_available_now(spark, config).read == len(events)
    return LateTopic(topic, start, events)


def sessions(events: list[Event]) -> dict[tuple[int, datetime], tuple[Any, ...]]:
    """The sessionizer's rows, computed here from every event: per (account, session start), its end,
    events, plays and longest view."""
    by_account: dict[int, list[Event]] = defaultdict(list)
    for event in events:
        by_account[event.account_id].append(event)
    found: dict[tuple[int, datetime], tuple[Any, ...]] = {}
    for account, own in by_account.items():
        own.sort(key=lambda event: event.event_ts)
        current: list[Event] = []
        for event in [*own, None]:
            if current and (event is None or event.event_ts >= current[-1].event_ts + GAP):
                start = current[0].event_ts
                found[(account, start)] = (
                    current[-1].event_ts + GAP, len(current),
                    sum(1 for e in current if e.event_type == "START"),
                    max(e.view_duration_sec for e in current),
                )  # fmt: skip
                current = []
            if event is not None:
                current.append(event)
    return found


def table_sessions(
    spark: SparkSession, table: str, where: str, version: str | int | None = None
) -> Counter[Any]:
    """The table's rows `where`, at `version` (a tag, a snapshot) or now: (account, start) -> (end, events,
    plays, longest), counted."""
    source = table
    if version is not None:
        source += f" VERSION AS OF '{version}'" if isinstance(version, str) else f" VERSION AS OF {version}"
    rows = spark.sql(
        f"SELECT account_id, session_start, session_end, events, plays, longest_view_sec FROM {source} "
        f"WHERE {where}"
    ).collect()
    return Counter(
        ((row.account_id, row.session_start.astimezone(UTC)),
         (row.session_end.astimezone(UTC), row.events, row.plays, row.longest_view_sec))
        for row in rows
    )  # fmt: skip


def in_window(start: datetime, end: datetime) -> str:
    return (
        f"session_start >= TIMESTAMP '{start.isoformat()}' AND session_start < TIMESTAMP '{end.isoformat()}'"
    )


def last_offsets(checkpoint: Path) -> dict[str, int]:
    """The end offsets of the newest micro-batch the live query committed, per partition."""
    commits = [int(path.name) for path in (checkpoint / "commits").glob("[0-9]*")]
    if not commits:
        return {}
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    offsets = json.loads(lines[-1])
    return {partition: int(offset) for topic in offsets.values() for partition, offset in topic.items()}


def bergstream(*arguments: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bergstream", *arguments], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip


def test_a_late_partition_s_window_is_corrected_in_a_branch_audited_published_and_unpublished_live(
    stack: Services, spark: SparkSession, late_topic: LateTopic, tmp_path: Path
) -> None:
    topic, t0 = late_topic.topic, late_topic.start
    output = f"sessions_{topic}"
    identifier = f"{stack.catalog.name}.apps.{output}"
    window = (t0, t0 + timedelta(hours=1))
    settings = {
        "app": "sessionizer",
        "entry": "bergstream.apps.sessionizer:sessionizer",
        "sources": {"playback": {"topic": topic, "table": topic, "schema": "playback"}},
        "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
        "checkpoint_location": str(tmp_path / "live"),
        "trigger_interval": "2 seconds",
        "max_offsets_per_trigger": 150,
        "output_table": f"apps.{output}",
        "backfill": {"max_misalignment": "10m"},
        "output": {"time_column": "session_start", "key": ["account_id", "session_start"], "warm_up": "1h",
                   "settle": "3h"},
        "options": {"gap": "30 minutes", "watermark_delay": "1 hour"},
        "spark": {"master": "local[2]"},
    }  # fmt: skip
    config = tmp_path / "sessionizer.yaml"
    config.write_text(yaml.safe_dump(settings))
    app = ["--app", "sessionizer", "--config", str(config)]
    live_log = tmp_path / "live.log"
    with live_log.open("wb") as out:
        live = subprocess.Popen([sys.executable, "-m", "bergstream", "app", "run", *app], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    producing = threading.Event()
    try:
        # The live query reads the topic's backlog, dropping partition 0's events behind its watermark.
        ends = {"0": 300, "1": 1500, "2": 1500}
        eventually(
            lambda: last_offsets(tmp_path / "live") == ends, "the live query read the topic", timeout=300
        )
        truth = sessions(late_topic.events)
        expected = Counter((key, row) for key, row in truth.items() if window[0] <= key[1] < window[1])
        lived = table_sessions(spark, identifier, in_window(*window))
        assert lived != expected, "the live query dropped none of partition 0's events"

        # The correction, killed once while it writes its branch, then resumed by the same command.
        start, end = (instant.isoformat() for instant in window)
        command = [sys.executable, "-m", "bergstream", "backfill", "run", *app, "--start", start,
                   "--end", end, "--branch", "fix"]  # fmt: skip
        catalog = stack.catalog.load()
        table = catalog.load_table(("apps", output))

        def branch_batches() -> int:
            table.refresh()
            head = table.metadata.refs.get("fix")
            count = 0
            snapshot = table.snapshot_by_id(head.snapshot_id) if head is not None else None
            while snapshot is not None:
                count += QUERY_ID in (snapshot.summary.additional_properties if snapshot.summary else {})
                snapshot = (
                    table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
                )
            return count

        killed_log = tmp_path / "killed.log"
        with killed_log.open("wb") as out:
            killed = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)  # fmt: skip
        eventually(lambda: branch_batches() >= 1 or killed.poll() is not None, "a batch in the branch")
        assert killed.poll() is None, killed_log.read_text()[-3000:]
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
        resumed = subprocess.run([*command, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                                 check=False)  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert json.loads(resumed.stdout)["ok"] is True
        # The branch: main as it was made from, its window's rows the true sessions, each once.
        branch_rows = table_sessions(spark, f"{identifier}.branch_fix", in_window(*window))
        assert branch_rows == expected, (
            sorted(branch_rows - expected)[:5], sorted(expected - branch_rows)[:5],
            len(branch_rows), len(expected),
        )  # fmt: skip
        outside = f"NOT ({in_window(*window)})"
        base = recorded(dict(catalog.load_table(("apps", output)).properties), "fix")
        assert base is not None and base.complete
        assert table_sessions(spark, f"{identifier}.branch_fix", outside) == table_sessions(
            spark, identifier, outside, version=base.base
        )

        # The audit, against counts made here from main's rows and the true sessions.
        audited = bergstream("backfill", "audit", *app, "--branch", "fix", "--json")
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
        below = bergstream("backfill", "audit", *app, "--branch", "fix", "--min-match", "0.999")
        assert below.returncode != 0 and "below --min-match" in below.stderr

        # Published while the live query goes on reading new events and committing.
        failures: list[BaseException] = []

        def keep_producing() -> None:
            # New events, hours after the window and never ahead of now (the broker refuses timestamps
            # more than an hour ahead of its clock): the live query's watermark moves on and it commits.
            at = t0 + timedelta(hours=6)
            try:
                while not producing.is_set():
                    times = spread(at, timedelta(minutes=1), 20)
                    send(stack.bootstrap_servers, topic, 1, times, seed=int(at.timestamp()))
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
        published = bergstream("backfill", "publish", *app, "--branch", "fix", "--json")
        assert published.returncode == 0, published.stderr[-3000:]
        publish = json.loads(published.stdout)
        after = live_commits()
        eventually(lambda: live_commits() >= after + 2, "the live query committing after the publish")
        producing.set()
        producer.join()
        assert not failures, failures
        again = bergstream("backfill", "publish", *app, "--branch", "fix", "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["already"] is True, again.stderr[-3000:]
    finally:
        producing.set()
        live.send_signal(signal.SIGINT)
        live.wait(120)
    tag = publish["tag"]
    # Main: the window's rows are the true sessions; outside it, exactly what the live query wrote, once.
    assert table_sessions(spark, identifier, in_window(*window)) == expected
    appended_since = spark.read.format("iceberg").option(
        "start-snapshot-id", str(spark.sql(f"SELECT snapshot_id FROM {identifier}.refs WHERE name = '{tag}'")
                                 .first().snapshot_id)  # type: ignore[union-attr]
    ).load(identifier).where(outside)  # fmt: skip
    live_outside = table_sessions(spark, identifier, outside, version=tag) + Counter(
        ((row.account_id, row.session_start.astimezone(UTC)),
         (row.session_end.astimezone(UTC), row.events, row.plays, row.longest_view_sec))
        for row in appended_since.collect()
    )  # fmt: skip
    assert table_sessions(spark, identifier, outside) == live_outside
    assert max(table_sessions(spark, identifier, "true").values()) == 1, "a row twice"

    # Unpublished: the window's rows are the live query's again, what it appended since kept.
    undone = bergstream("backfill", "unpublish", *app, "--branch", "fix", "--json")
    assert undone.returncode == 0, undone.stderr[-3000:]
    assert table_sessions(spark, identifier, in_window(*window)) == lived
    assert table_sessions(spark, identifier, outside) == live_outside

    # Released: the branch, the tag and the record are gone; main stays as it is.
    released = bergstream("backfill", "release", *app[:2], "--branch", "fix", "--config", str(config))
    assert released.returncode == 0, released.stderr[-3000:]
    table = stack.catalog.load().load_table(("apps", output))
    assert "fix" not in table.metadata.refs and tag not in table.metadata.refs
    assert recorded(dict(table.properties), "fix") is None
    assert table_sessions(spark, identifier, in_window(*window)) == lived
