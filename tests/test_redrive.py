"""`bergstream router redrive`: dead letters fixed by a new schema or setting reach the archive exactly once,
with their original metadata, and are marked; a redrive killed between its two commits is finished by the
next one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Producer
from pyspark.sql import types as T

from bergstream.backfill.read.batches import window_of
from bergstream.backfill.read.order import ordering
from bergstream.backfill.replay import replay
from bergstream.kafka_topics import ensure_topic
from bergstream.loadgen.events import EventModel
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.router.redrive import (
    ALREADY_ARCHIVED,
    FINISHED_LATER_PROPERTY,
    ID_PROPERTY,
    REDRIVEN,
    STILL_FAILING,
    FinishedRedrive,
    RedriveCounts,
    RedriveReport,
    RedriveSnapshot,
    new_redrive_id,
    redrive,
    unfinished,
)
from bergstream.schemas.archive import DEAD_LETTER_TYPE, PARTITION_SPEC
from bergstream.schemas.event_schema import AVRO_DIR, load_event_schema
from bergstream.schemas.spark_types import ddl_columns
from tests.routers import ROOT, write_config
from tests.services import Services

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

PAUSE = "field 'event_type' is PAUSE, not one of START, HEARTBEAT, STOP"
MALFORMED = "malformed JSON"
LIMIT = 1024
HEADERS: list[tuple[str, str | bytes | None]] = [("source", b"redrive-test")]
HOUR_PARTITION = "__metadata__.kafka_ingestion_ts_hour"


@dataclass(frozen=True)
class Sent:
    key: bytes
    timestamp_ms: int
    kind: str  # "valid", "pause", "oversize", "garbage" or "oversize garbage"


def fixed_schema(directory: Path) -> Path:
    """The playback schema with the event type PAUSE added: the fix that the redrive applies."""
    directory.mkdir()
    avro = json.loads((AVRO_DIR / "playback.avsc").read_text())
    event_type = next(f for f in avro["fields"] if f["name"] == "event_type")
    event_type["type"]["symbols"].append("PAUSE")
    (directory / "playback.avsc").write_text(json.dumps(avro))
    return directory


def send(stack: Services, topic: str, kinds: Counter[str]) -> dict[tuple[int, int], Sent]:
    """`kinds` records of each kind, ingested over three hours two days ago; {(partition, offset): record}."""
    schema = load_event_schema("playback")
    events = EventModel(seed=11).events("playback")
    ensure_topic({"bootstrap.servers": stack.bootstrap_servers}, topic, 2)
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=2)
    order = [kind for kind, count in sorted(kinds.items()) for _ in range(count)]
    sent: dict[tuple[int, int], Sent] = {}
    for index, kind in enumerate(order):
        generated = next(events)
        event = dict(generated.event)
        if kind == "pause":
            event["event_type"] = "PAUSE"
        if kind == "oversize":
            event["country"] = "X" * 2 * LIMIT
        value = schema.encode(event, "json")
        if kind == "garbage":
            value = b"{broken"
        if kind == "oversize garbage":
            value = b"{" + b"x" * 2 * LIMIT
        timestamp = int((start + timedelta(minutes=180 * index / len(order))).timestamp() * 1000)

        def delivered(error: Any, message: Any, kind: str = kind, timestamp: int = timestamp) -> None:
            assert error is None, error
            sent[(message.partition(), message.offset())] = Sent(message.key(), timestamp, kind)

        producer.produce(topic, value=value, key=generated.key, timestamp=timestamp, headers=HEADERS,
                         on_delivery=delivered)  # fmt: skip
    assert producer.flush(30) == 0
    return sent


def router_config(stack: Services, topic: str, tmp_path: Path, **settings: Any) -> RouterConfig:
    return RouterConfig.flat(
        {
            "topic": topic, "schema": "playback", "encoding": "json", "table": topic, "cluster": "test",
            "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
            "checkpoint_location": str(tmp_path / "checkpoint"), "catalog": stack.catalog, **settings,
        }
    )  # fmt: skip


def tables(stack: Services, topic: str) -> tuple[Table, Table]:
    catalog = stack.catalog.load()
    namespace = stack.catalog.namespace
    return catalog.load_table(f"{namespace}.{topic}"), catalog.load_table(f"{namespace}.{topic}__dlq")


def rows(table: Table) -> list[dict[str, Any]]:
    return table.scan().to_arrow().to_pylist()  # type: ignore[no-any-return]


def redrive_snapshots(table: Table) -> dict[str, dict[str, str]]:
    """{redrive id: summary} of the table's snapshots that a redrive committed."""
    found = {}
    for snapshot in table.snapshots():
        summary = dict(snapshot.summary.additional_properties) if snapshot.summary else {}
        if ID_PROPERTY in summary:
            found[summary[ID_PROPERTY]] = summary
    return found


def check_archive(stack: Services, topic: str, sent: dict[tuple[int, int], Sent]) -> list[dict[str, Any]]:
    """Every record that parses with the fixed schema is archived exactly once, with its metadata."""
    archive, _ = tables(stack, topic)
    archived = rows(archive)
    keys = [(r["__metadata__"]["partition"], r["__metadata__"]["offset"]) for r in archived]
    assert len(keys) == len(set(keys)), "a record archived twice"
    assert set(keys) == {where for where, record in sent.items() if "garbage" not in record.kind}
    for row in archived:
        metadata = row["__metadata__"]
        record = sent[(metadata["partition"], metadata["offset"])]
        assert metadata["kafka_ingestion_ts"].timestamp() * 1000 == record.timestamp_ms
        assert (metadata["key"], metadata["topic"], metadata["cluster"]) == (record.key, topic, "test")
        assert [(h["key"], h["value"]) for h in metadata["headers"]] == HEADERS
        assert (row["event_type"] == "PAUSE") == (record.kind == "pause")
    return archived


def current_snapshots(stack: Services, topic: str) -> tuple[int | None, int | None]:
    archive, dead_letters = tables(stack, topic)
    return archive.metadata.current_snapshot_id, dead_letters.metadata.current_snapshot_id


def test_counts_are_tallied_by_previous_reason_and_kept_as_properties() -> None:
    counts = RedriveCounts.tally(
        [
            ("value of 2,000 bytes is over the limit", REDRIVEN, False, 7),
            (MALFORMED, STILL_FAILING, False, 3),
            ("value of 2,000 bytes is over the limit", STILL_FAILING, True, 2),
            (PAUSE, REDRIVEN, False, 4),
            (PAUSE, ALREADY_ARCHIVED, False, 1),
        ]
    )
    assert [(r.reason, r.examined) for r in counts.reasons] == [
        ("value of 2,000 bytes is over the limit", 9),
        (PAUSE, 5),
        (MALFORMED, 3),
    ]
    assert (counts.examined, counts.redriven, counts.already_archived, counts.still_failing) == (17, 11, 1, 5)
    assert counts.reason_changed == 2
    properties = counts.properties()
    assert properties["bergstream.redrive.redriven"] == "11"
    assert json.loads(properties["bergstream.redrive.reasons"])[1] == {
        "reason": PAUSE, "examined": 5, REDRIVEN: 4, ALREADY_ARCHIVED: 1, STILL_FAILING: 0,
    }  # fmt: skip
    table = counts.table()
    assert table[0].split() == ["reason", "examined", "redriven", "already", "archived", "still", "failing"]
    assert table[-1].split() == ["total", "17", "11", "1", "5"]
    with pytest.raises(ValueError, match="unknown redrive outcome 'lost'"):
        RedriveCounts.tally([(MALFORMED, "lost", False, 1)])


def test_many_reasons_are_kept_to_the_largest_and_the_rest_summed() -> None:
    counts = RedriveCounts.tally((f"reason {i:02}", STILL_FAILING, False, 100 - i) for i in range(30))
    kept = json.loads(counts.properties()["bergstream.redrive.reasons"])
    assert len(kept) == 21
    assert kept[-1] == {
        "reason": "(10 other reasons)", "examined": sum(100 - i for i in range(20, 30)),
        REDRIVEN: 0, ALREADY_ARCHIVED: 0, STILL_FAILING: sum(100 - i for i in range(20, 30)),
    }  # fmt: skip
    assert len(counts.table()) == 1 + 21 + 1


def test_unfinished_redrives_are_those_no_dead_letter_snapshot_names() -> None:
    def snapshot(number: int, redrive_id: str) -> RedriveSnapshot:
        return RedriveSnapshot(number, None, number * 1000, {ID_PROPERTY: redrive_id})

    first, second = new_redrive_id(datetime(2026, 1, 1, tzinfo=UTC)), new_redrive_id()
    assert re.fullmatch(r"20260101T000000Z-[0-9a-f]{8}", first)
    archived = [snapshot(3, second), snapshot(2, first), snapshot(1, "done")]
    assert [s.redrive_id for s in unfinished(archived, ["done"])] == [first, second]
    assert unfinished(archived, ["done", first, second]) == []


def test_the_report_says_what_was_done_or_would_be() -> None:
    counts = RedriveCounts.tally([(PAUSE, REDRIVEN, False, 10), (MALFORMED, STILL_FAILING, True, 2)])
    report = RedriveReport(
        topic="playback", redrive_id="20260101T000000Z-0a1b2c3d", dead_letter_table="c.archive.playback__dlq",
        archive_table="c.archive.playback", dry_run=True, reason_filter="PAUSE", dead_letter_snapshot=7,
        counts=counts, finished=[FinishedRedrive("20251231T000000Z-00000000", 5, 4, None)],
    )  # fmt: skip
    lines = report.lines()
    assert lines[0] == (
        "redrive 20251231T000000Z-00000000 was interrupted after its archive commit (snapshot 5): "
        "would mark its 4 rows in c.archive.playback__dlq"
    )
    assert (
        "12 dead letters examined in c.archive.playback__dlq (snapshot 7, reason containing 'PAUSE')"
        in lines[1]
    )
    assert lines[-1] == (
        "dry run, nothing written: would append 10 rows to c.archive.playback and mark 10 dead letters, "
        "the reason of 2 still failing changed"
    )
    done = replace(report, dry_run=False, archive_snapshot=8, marking_snapshot=9, finished=[])
    assert done.lines()[-2:] == [
        "c.archive.playback: appended 10 rows (snapshot 8)",
        "c.archive.playback__dlq: marked 10 dead letters redriven, the reason of 2 still failing changed "
        "(snapshot 9)",
    ]
    nothing = replace(done, counts=RedriveCounts())
    assert nothing.lines() == [
        "playback: no dead letters waiting in c.archive.playback__dlq, reason containing 'PAUSE'"
    ]
    # The same report for `router redrive --json`, one JSON document.
    document = json.loads(json.dumps(report.to_json()))
    assert (document["examined"], document["redriven"], document["still_failing"]) == (12, 10, 2)
    assert document["dry_run"] and document["reason_filter"] == "PAUSE" and document["reason_changed"] == 2
    assert document["finished"] == [
        {
            "redrive_id": "20251231T000000Z-00000000",
            "archive_snapshot": 5,
            "rows": 4,
            "dead_letter_snapshot": None,
        }
    ]
    assert [reason["reason"] for reason in document["reasons"]] == [PAUSE, MALFORMED]


@pytest.mark.integration
def test_fixed_dead_letters_are_archived_once_with_their_metadata_and_marked(
    stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    kinds = Counter({"valid": 30, "pause": 10, "oversize": 8, "garbage": 4, "oversize garbage": 2})
    sent = send(stack, topic_name, kinds)
    # A dead-letter table made before redrives existed: the first redrive adds the columns.
    dead_letter_table = f"{stack.catalog.table_identifier(topic_name)}__dlq"
    older = T.StructType([f for f in DEAD_LETTER_TYPE.fields if f.name not in ("redriven_at", "redrive_id")])
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {stack.catalog.name}.{stack.catalog.namespace}")
    spark.sql(f"CREATE TABLE {dead_letter_table} ({ddl_columns(older)}) USING iceberg "
              f"PARTITIONED BY ({PARTITION_SPEC})")  # fmt: skip
    before = router_config(stack, topic_name, tmp_path, max_value_bytes=LIMIT)
    totals = archive_available_now(spark, before)
    assert (totals.archived, totals.dead_lettered) == (30, 24)
    fixed = router_config(stack, topic_name, tmp_path, schema_dir=str(fixed_schema(tmp_path / "v2")))

    snapshots = current_snapshots(stack, topic_name)
    dry = redrive(spark, fixed, dry_run=True)
    assert (dry.counts.examined, dry.counts.redriven, dry.counts.still_failing) == (24, 18, 6)
    assert current_snapshots(stack, topic_name) == snapshots
    assert "redrive_id" not in spark.table(dead_letter_table).columns
    assert any(line.startswith("dry run, nothing written: would append 18 rows") for line in dry.lines())

    # The setting first: the values over the old limit.
    limit = redrive(spark, fixed, reason="over the limit")
    assert (limit.counts.examined, limit.counts.redriven, limit.counts.still_failing) == (10, 8, 2)
    assert limit.counts.reason_changed == 2  # too big before, malformed now
    archive, dead_letters = tables(stack, topic_name)
    assert len(rows(archive)) == 38
    properties = redrive_snapshots(archive)[limit.redrive_id]
    assert properties["bergstream.redrive.reason-filter"] == "over the limit"
    assert properties["bergstream.redrive.dead-letter-snapshot-id"] == str(snapshots[1])
    assert (properties["bergstream.redrive.redriven"], properties["added-records"]) == ("8", "8")

    # Then the schema: the event type PAUSE.
    rest = redrive(spark, fixed)
    assert (rest.counts.examined, rest.counts.redriven, rest.counts.still_failing) == (16, 10, 6)
    assert {r.reason: r.redriven for r in rest.counts.reasons} == {PAUSE: 10, MALFORMED: 0}
    assert rest.counts.reason_changed == 0
    archived = check_archive(stack, topic_name, sent)

    # In the hour partitions of their ingestion times, as the router would have put them.
    archive, dead_letters = tables(stack, topic_name)
    for report, kind in ((limit, "oversize"), (rest, "pause")):
        added = [
            entry["data_file"]["partition"][HOUR_PARTITION]
            for entry in archive.inspect.entries(snapshot_id=report.archive_snapshot).to_pylist()
            if entry["snapshot_id"] == report.archive_snapshot and entry["status"] == 1
        ]
        hours = {record.timestamp_ms // 3_600_000 for record in sent.values() if record.kind == kind}
        assert sorted(added) == sorted(hours)
    written = {r["__metadata__"]["router_write_ts"] for r in archived if r["event_type"] == "PAUSE"}
    assert len(written) == 1 and written.pop() > datetime.now(UTC) - timedelta(hours=1)

    marked = Counter((r["redrive_id"], r["error"]) for r in rows(dead_letters) if r["redrive_id"])
    assert sum(count for (rid, _), count in marked.items() if rid == limit.redrive_id) == 8
    assert sum(count for (rid, _), count in marked.items() if rid == rest.redrive_id) == 10
    waiting = Counter(r["error"] for r in rows(dead_letters) if r["redrive_id"] is None)
    assert waiting == {MALFORMED: 6}
    assert all(r["redriven_at"] is not None for r in rows(dead_letters) if r["redrive_id"])
    marking = redrive_snapshots(dead_letters)[rest.redrive_id]
    assert marking["bergstream.redrive.archive-snapshot-id"] == str(rest.archive_snapshot)
    assert marking["bergstream.redrive.still-failing"] == "6"

    snapshots = current_snapshots(stack, topic_name)
    again = redrive(spark, fixed)
    assert (again.counts.examined, again.counts.redriven, again.counts.still_failing) == (6, 0, 6)
    assert again.finished == []
    assert current_snapshots(stack, topic_name) == snapshots

    # A replay with the dead letters sends each record once: from the archive when it was redriven.
    times = [datetime.fromtimestamp(r.timestamp_ms / 1000, UTC) for r in sent.values()]
    replayed = replay(
        stack.catalog, topic_name, window_of(min(times), max(times) + timedelta(seconds=1)), ordering(None),
        f"{topic_name}_replayed", {"bootstrap.servers": stack.bootstrap_servers}, include_dead_letters=True,
    )  # fmt: skip
    assert (replayed.records, replayed.dead_letters) == (48, 6)


@pytest.mark.integration
def test_a_redrive_killed_between_its_commits_is_finished_by_the_next_without_appending_again(
    stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    sent = send(stack, topic_name, Counter({"valid": 20, "pause": 10, "garbage": 2}))
    archive_available_now(spark, router_config(stack, topic_name, tmp_path))
    v2 = fixed_schema(tmp_path / "v2")
    config = write_config(stack, tmp_path, topic_name, schema_dir=str(v2))
    log = tmp_path / "redrive.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "bergstream", "router", "redrive", "--topic", topic_name,
             "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
    appended = re.compile(r"redrive (\S+): appended 10 rows to \S+ in snapshot (\d+); marking them")
    deadline = time.monotonic() + 300
    found = None
    while found is None and process.poll() is None and time.monotonic() < deadline:
        found = appended.search(log.read_text())
        time.sleep(0.05)
    if found is not None:
        os.killpg(process.pid, signal.SIGKILL)  # the Python driver and its Spark JVM, at once
    process.wait()
    assert found is not None, log.read_text()[-3000:]
    killed_id, archive_snapshot = found.group(1), int(found.group(2))

    archive, dead_letters = tables(stack, topic_name)
    assert killed_id in redrive_snapshots(archive)
    assert killed_id not in redrive_snapshots(dead_letters), "killed after the marking, not before it"
    assert all(r["redrive_id"] is None for r in rows(dead_letters))

    fixed = router_config(stack, topic_name, tmp_path, schema_dir=str(v2))
    report = redrive(spark, fixed)
    assert [(f.redrive_id, f.archive_snapshot, f.rows) for f in report.finished] == [
        (killed_id, archive_snapshot, 10)
    ]
    assert (report.counts.examined, report.counts.redriven, report.counts.still_failing) == (2, 0, 2)
    assert report.archive_snapshot is None
    check_archive(stack, topic_name, sent)
    archive, dead_letters = tables(stack, topic_name)
    assert list(redrive_snapshots(archive)) == [killed_id]
    marking = redrive_snapshots(dead_letters)[killed_id]
    assert marking[FINISHED_LATER_PROPERTY] == "true"
    assert marking["bergstream.redrive.redriven"] == "10"
    assert Counter(r["redrive_id"] for r in rows(dead_letters)) == {killed_id: 10, None: 2}


@pytest.mark.integration
def test_a_bootstrap_reads_the_rows_a_redrive_appended_after_the_last_router_commit_once(
    stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    """The redrive is the table's newest commit, below the router's position: a bootstrap reads its rows
    from the archive (Kafka's phase starts past them), once, to what a live run with the fixed schema
    writes."""
    from bergstream.runtime.run import run_app
    from tests.jobs.identity_app import identity_settings

    sent = send(stack, topic_name, Counter({"valid": 300, "pause": 60}))
    archive_available_now(spark, router_config(stack, topic_name, tmp_path))
    v2 = fixed_schema(tmp_path / "v2")
    redriven = redrive(spark, router_config(stack, topic_name, tmp_path, schema_dir=str(v2)))
    assert redriven.counts.redriven == 60
    archive, _ = tables(stack, topic_name)
    newest = archive.current_snapshot()
    assert newest is not None and newest.summary is not None
    assert newest.summary.additional_properties[ID_PROPERTY] == redriven.redrive_id
    assert newest.summary.additional_properties["bergstream.kafka.topic"] == topic_name

    start = datetime.fromtimestamp(min(s.timestamp_ms for s in sent.values()) / 1000, UTC)
    window = {"start": start, "max_misalignment": "15m"}
    output = f"redriven_{topic_name}".replace("-", "_").replace(".", "_")
    bootstrap = identity_settings(stack, topic_name, "test", tmp_path / "bootstrap", output,
                                  schema_dir=str(v2), mode="bootstrap", backfill=window)  # fmt: skip
    report = run_app(spark, bootstrap, available_now=True, show_progress=False)
    assert report.position.phase == "kafka"
    assert report.handovers["playback"].snapshot_id == newest.snapshot_id
    written = sorted(tuple(row) for row in spark.table(f"bergstream.apps.{output}").collect())
    assert [event for _, _, event in written].count("PAUSE") == 60
    assert sorted((p, o) for p, o, _ in written) == sorted(sent)
    live = identity_settings(stack, topic_name, "test", tmp_path / "live", f"{output}_live",
                             schema_dir=str(v2), mode="live")  # fmt: skip
    run_app(spark, live, available_now=True, show_progress=False)
    assert written == sorted(tuple(row) for row in spark.table(f"bergstream.apps.{output}_live").collect())

    # A row appended past the position by something else than a router (a hand-made fix, a second writer):
    # Kafka's phase would read its record again, so the hand-over is refused.
    import pyarrow as pa

    from bergstream.backfill.errors import BackfillConfigError
    from bergstream.backfill.read.handover import pin_handover, refuse_rows_at_or_past
    from bergstream.backfill.read.planner import table_ref

    row = archive.scan(limit=1).to_arrow().to_pylist()[0]
    row["__metadata__"]["offset"] += 100_000
    archive.append(pa.Table.from_pylist([row], schema=archive.schema().as_arrow()))
    handover = pin_handover(stack.catalog, table_ref(topic_name, stack.catalog), topic_name, "test")
    with pytest.raises(BackfillConfigError) as refused:
        refuse_rows_at_or_past(stack.catalog, handover)
    message = str(refused.value)
    assert f"holds 1 row(s) of topic {topic_name} (cluster test) at or past the position" in message
    assert f"partition {row['__metadata__']['partition']} offset {row['__metadata__']['offset']}" in message
