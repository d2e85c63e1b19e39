"""Topics that commit on their target lag (router/pending.py): the files a batch writes for them are kept
pending and recorded beside the checkpoint, and each record is in the archive once whatever step the router
is killed at: after the record and before the commit, after the commit and before the record is cleared,
between the commits of two topics; a graceful stop and a drain commit everything pending; a topic's tables
dropped while files are pending for them hold, made again, what no commit held before."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local.processes import free_ports
from bergstream.router.config import table_for_topic
from bergstream.router.pending import RECORDS_DIR
from tests.routers import (
    ROOT,
    archived_offsets,
    eventually,
    pattern_command,
    produced_offsets,
    start_command,
    write_defaults,
)
from tests.services import Services


def recorded_tables(records: Path) -> set[str]:
    """The tables the pending records beside the checkpoint hold files of."""
    tables: set[str] = set()
    for path in records.glob("*.json") if records.exists() else ():
        tables |= {name for name, table in json.loads(path.read_text())["tables"].items() if table["files"]}
    return tables


def killed(router: subprocess.Popen[bytes]) -> None:
    os.killpg(router.pid, signal.SIGKILL)
    router.wait(60)


def on_an_hours_lag(
    stack: Services, tmp_path: Path, pattern: str, topics_dir: Path
) -> tuple[Path, list[str], Path]:
    """A pattern router's command over `pattern` at a 1 s trigger and an hour's target lag (nothing commits on
    its lag while a test runs), with where it records pending files and where it logs."""
    defaults = write_defaults(
        stack, tmp_path, schema="playback", encoding="json", cluster="test", trigger_interval="1 second",
        target_lag="1h",
    )  # fmt: skip
    command = pattern_command(pattern, defaults, topics_dir)
    return tmp_path / "checkpoint" / RECORDS_DIR, command, tmp_path / "router.log"


def test_files_pending_on_a_target_lag_are_committed_once_whatever_step_the_router_is_killed_at(
    stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    prefix = topic_name[:40]
    topics = [f"{prefix}.a", f"{prefix}.b"]
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for topic in topics:
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    topics_dir = tmp_path / "topics"
    topics_dir.mkdir()
    records, command, log = on_an_hours_lag(stack, tmp_path, rf"{prefix}\..*", topics_dir)
    tables = {topic: table_for_topic(topic) for topic in topics}
    identifiers = {
        topic: f"{stack.catalog.name}.{stack.catalog.namespace}.{t}" for topic, t in tables.items()
    }
    sent: dict[str, set[tuple[int, int]]] = {topic: set() for topic in topics}

    def send(seed: int) -> None:
        for topic in topics:
            report = produce(
                ProduceRequest(topic=topic, count=150, partitions=2, schema="playback", bad_fraction=0.1,
                               seed=seed),
                stack.bootstrap_servers, show_progress=False,
            )  # fmt: skip
            sent[topic] |= produced_offsets(report.offsets)

    def archived(topic: str) -> Counter[tuple[int, int]]:
        try:
            return Counter(archived_offsets(stack, tables[topic]))
        except Exception:  # its tables not made yet
            return Counter()

    def exactly_once() -> None:
        for topic in topics:
            counted = archived(topic)
            assert set(counted) == sent[topic], f"{topic}: {len(counted)} archived of {len(sent[topic])}"
            assert max(counted.values()) == 1, f"{topic}: archived twice: {counted.most_common(3)}"

    def recorded_both() -> bool:
        held = recorded_tables(records)
        return all(identifiers[topic] in held for topic in topics)

    def killed_once_recorded(what: str) -> None:
        """Start the router, and kill it once both topics' files are recorded pending."""
        router = start_command(command, log)
        try:
            eventually(recorded_both, what, timeout=240)
        finally:
            killed(router)

    def drained() -> str:
        done = subprocess.run(
            [*command, "--available-now"], capture_output=True, text=True, timeout=300, cwd=ROOT, check=False
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout + done.stderr

    # Killed after the batch's files are recorded, before any commit: nothing is in the tables yet.
    send(seed=1)
    router = start_command(command, log)
    try:
        eventually(recorded_both, "both topics' files recorded pending", timeout=240)
        assert all(not archived(topic) for topic in topics), "committed before its target lag"
    finally:
        killed(router)
    # Started again, with other settings (no target lag: a commit every batch): the recorded files are
    # committed, once, before anything new; the records go.
    settings = {"schema": "playback", "encoding": "json", "cluster": "test", "trigger_interval": "1 second"}
    write_defaults(stack, tmp_path, **settings)
    drained()
    exactly_once()
    assert not list(records.glob("*.json")), list(records.iterdir())
    write_defaults(stack, tmp_path, **settings, target_lag="1h")

    # A graceful stop commits what is pending. Its records, kept aside, are what a router killed after its
    # commits and before clearing them leaves.
    send(seed=2)
    router = start_command(command, log)
    try:
        eventually(recorded_both, "the next files recorded pending", timeout=180)
        saved = tmp_path / "saved"
        shutil.copytree(records, saved)
    finally:
        router.send_signal(signal.SIGINT)
        assert router.wait(180) == 0, log.read_text()[-3000:]
    exactly_once()
    assert not list(records.glob("*.json"))

    # Killed after both topics' commits, before the records are cleared: the tables hold the batch, and
    # nothing is appended twice. And between the two topics' commits: the second topic's commit undone, its
    # files are committed from the record, once.
    for path in saved.glob("*.json"):
        shutil.copy(path, records / path.name)
    second = identifiers[topics[1]]
    history = spark.sql(f"SELECT parent_id FROM {second}.history ORDER BY made_current_at").collect()
    undone = f"{stack.catalog.namespace}.{tables[topics[1]]}"
    spark.sql(f"CALL {stack.catalog.name}.system.rollback_to_snapshot('{undone}', {history[-1].parent_id})")
    assert len(archived(topics[1])) < len(sent[topics[1]])
    drained()
    exactly_once()
    assert not list(records.glob("*.json"))

    # Killed with files pending, which are then removed (orphan removal while the router was stopped longer
    # than its retention): none of that table's is committed, and its range is read from Kafka again.
    send(seed=3)
    killed_once_recorded("the last files recorded pending")
    first = identifiers[topics[0]]
    for path in records.glob("*.json"):
        for file in json.loads(path.read_text())["tables"].get(first, {}).get("files", []):
            Path(file["file-path"].removeprefix("file:")).unlink()
    output = drained()
    exactly_once()
    assert "are gone (removed as orphans while the router was stopped?)" in output

    # Given up on and started over under the same name: killed with files pending, its checkpoint deleted
    # (the records with it). The query starts where the tables end; the files never committed are orphans.
    send(seed=4)
    killed_once_recorded("files recorded pending before the checkpoint goes")
    shutil.rmtree(tmp_path / "checkpoint")
    drained()
    exactly_once()

    # A topic's tables dropped while files are pending for them (its archive started over, the router
    # stopped; PURGE deletes the committed files only): they are made again, and hold what no commit held
    # before the drop, each once, from the pending batches on; the other topic is as it was.
    send(seed=5)
    killed_once_recorded("files recorded pending before the tables are dropped")
    committed = set(archived(topics[0]))
    pending = sent[topics[0]] - committed
    assert pending, "files pending for the topic whose tables are dropped"
    for identifier in (identifiers[topics[0]], f"{identifiers[topics[0]]}__dlq"):
        spark.sql(f"DROP TABLE {identifier} PURGE")
    drained()
    counted = archived(topics[0])
    assert set(counted) == pending and max(counted.values()) == 1, f"{len(counted)} of {len(pending)}"
    assert set(archived(topics[1])) == sent[topics[1]] and max(archived(topics[1]).values()) == 1
    assert not list(records.glob("*.json"))


def test_a_table_dropped_while_files_are_pending_for_it_holds_the_pending_batches_on_read_from_kafka_again(
    stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    """A topic's table dropped while the router is stopped with files pending for it: made again at start,
    it is another table (another Iceberg uuid), into which the files written for the one dropped are not
    committed. Their range is read from Kafka again instead, into the table as it is: whether the drop
    deleted the pending files with the table's location, or kept them and the table was made again with its
    columns numbered otherwise (by hand here; a router makes it so from a schema that gained a field since),
    the table made again holds the pending batches on, each once, its positions exact. What was committed
    before the drop went with it; the router's checkpoint says where it goes on, as Spark's does."""
    from pyspark.sql import types as T

    from bergstream.schemas.archive import METADATA, PARTITION_SPEC, SORT_ORDER
    from bergstream.schemas.spark_types import ddl_columns

    topic = f"{topic_name[:40]}.dropped"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    (topics_dir := tmp_path / "topics").mkdir()
    records, command, log = on_an_hours_lag(stack, tmp_path, rf"{topic_name[:40]}\.dropped", topics_dir)
    table = table_for_topic(topic)
    identifier = f"{stack.catalog.name}.{stack.catalog.namespace}.{table}"

    def send(seed: int) -> set[tuple[int, int]]:
        report = produce(ProduceRequest(topic=topic, count=120, partitions=2, schema="playback", seed=seed),
                         stack.bootstrap_servers, show_progress=False)  # fmt: skip
        return produced_offsets(report.offsets)

    def stopped_once_recorded(stop: Callable[[subprocess.Popen[bytes]], None]) -> None:
        router = start_command(command, log)
        try:
            eventually(lambda: identifier in recorded_tables(records), "files recorded pending", timeout=240)
        finally:
            stop(router)

    def graceful(router: subprocess.Popen[bytes]) -> None:
        router.send_signal(signal.SIGINT)
        assert router.wait(180) == 0, log.read_text()[-3000:]

    def drained() -> str:
        done = subprocess.run(
            [*command, "--available-now"], capture_output=True, text=True, timeout=300, cwd=ROOT, check=False
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout + done.stderr

    def holds_once_exactly(pending: set[tuple[int, int]]) -> None:
        """The table holds `pending` alone, each once, and its commits' ranges run from where the pending
        batches start to where they end."""
        counted = Counter(archived_offsets(stack, table))
        assert set(counted) == pending, f"{len(counted)} archived, {len(pending)} pending"
        assert max(counted.values()) == 1, counted.most_common(3)
        snapshots = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{table}").snapshots()
        first = json.loads(snapshots[0].summary["bergstream.kafka.batch-start"])
        last = json.loads(snapshots[-1].summary["bergstream.kafka.next-offsets"])
        for partition in (0, 1):
            offsets = [offset for p, offset in pending if p == partition]
            assert (first[str(partition)], last[str(partition)]) == (min(offsets), max(offsets) + 1)

    # Committed by a graceful stop, then the next records' files pending when the router is killed.
    committed = send(seed=1)
    stopped_once_recorded(graceful)
    assert set(archived_offsets(stack, table)) == committed
    pending = send(seed=2)
    stopped_once_recorded(killed)

    # Dropped with its location (as catalogs that delete a dropped table's folder do): the files pending go.
    catalog = stack.catalog.load()
    locations = [
        catalog.load_table(f"{stack.catalog.namespace}.{name}").location().removeprefix("file:")
        for name in (table, f"{table}__dlq")
    ]
    for name, location in zip((identifier, f"{identifier}__dlq"), locations, strict=True):
        spark.sql(f"DROP TABLE {name} PURGE")
        shutil.rmtree(location, ignore_errors=True)
    output = drained()
    holds_once_exactly(pending)
    assert f"table {identifier} is another table than the one its files were written for" in output
    assert not list(records.glob("*.json"))

    # Dropped, its files kept, and made again with its columns in another order: the files pending were
    # written under the old numbering, and would read as other columns in the table made again.
    pending = send(seed=3)
    stopped_once_recorded(killed)
    columns = spark.table(identifier).schema
    reordered = T.StructType([columns[METADATA], *(f for f in columns.fields if f.name != METADATA)])
    spark.sql(f"DROP TABLE {identifier}")
    spark.sql(f"CREATE TABLE {identifier} ({ddl_columns(reordered)}) USING iceberg PARTITIONED BY "
              f"({PARTITION_SPEC})")  # fmt: skip
    spark.sql(f"ALTER TABLE {identifier} WRITE LOCALLY ORDERED BY {SORT_ORDER}")
    output = drained()
    holds_once_exactly(pending)
    assert f"table {identifier} is another table than the one its files were written for" in output
    assert not list(records.glob("*.json"))


def test_topics_commit_on_their_target_lag_while_the_router_runs_each_commit_carrying_several_batches(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    topic = f"{topic_name[:40]}.lagged"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    (topics_dir := tmp_path / "topics").mkdir()
    (port,) = free_ports(1)
    defaults = write_defaults(
        stack, tmp_path, schema="playback", encoding="json", cluster="test", trigger_interval="1 second",
        target_lag="6s", metrics_port=port, metrics_host="127.0.0.1",
    )  # fmt: skip
    router = start_command(pattern_command(rf"{topic_name[:40]}\.lagged", defaults, topics_dir),
                           tmp_path / "router.log")  # fmt: skip
    sent: set[tuple[int, int]] = set()

    def read_at_least(count: int) -> Callable[[], bool]:
        return lambda: metric_total(port, "bergstream_router_records_read_total", topic) >= count

    try:
        # Records in every batch for a while: the topic's commits come on its lag, not every batch.
        for seed in range(8):
            report = produce(
                ProduceRequest(topic=topic, count=40, partitions=2, schema="playback", seed=seed),
                stack.bootstrap_servers, show_progress=False,
            )  # fmt: skip
            sent |= produced_offsets(report.offsets)
            # Read by a batch before the next are sent: a batch for each (pending records alone are no sign:
            # on a slow machine, what a batch held may be due and committed before the next look).
            eventually(read_at_least(len(sent)), "the records read")
        eventually(lambda: Counter(archived_offsets(stack, table_for_topic(topic))).keys() == sent,
                   "every record committed on the topic's lag", timeout=120)  # fmt: skip
        assert max(Counter(archived_offsets(stack, table_for_topic(topic))).values()) == 1
        assert metric_value(port, "bergstream_router_commits_total", topic, 'reason="lag"') >= 1
        assert metric_value(port, "bergstream_router_target_lag_seconds", topic) == 6
        assert metric_value(port, "bergstream_router_table_metadata_bytes", topic) > 0
    finally:
        router.send_signal(signal.SIGINT)
        router.wait(180)
    # Each commit's range follows the one before it: positions read from the tables stay exact.
    catalog = stack.catalog.load()
    table = catalog.load_table(f"{stack.catalog.namespace}.{table_for_topic(topic)}")
    ranges = [
        (s.summary["bergstream.kafka.batch-start"], s.summary["bergstream.kafka.next-offsets"])
        for s in table.snapshots()
    ]
    batches = [int(s.summary["bergstream.router.batch-id"]) for s in table.snapshots()]
    assert len(batches) < 8, f"a commit per batch: {batches}"
    for (_, before), (start, _) in itertools.pairwise(ranges):
        assert json.loads(start) == json.loads(before), ranges
    # At every commit, the position it records is exactly where its rows end: a backfill planned at any
    # snapshot, files pending or not, hands over to Kafka where the archive ends, and reads each record once.
    for snapshot in table.snapshots():
        ends = {int(p): o for p, o in json.loads(snapshot.summary["bergstream.kafka.next-offsets"]).items()}
        metadata = table.scan(snapshot_id=snapshot.snapshot_id, selected_fields=("__metadata__",)).to_arrow()
        rows = [(m["partition"], m["offset"]) for m in metadata.column("__metadata__").to_pylist()]
        assert sorted(rows) == sorted((p, o) for p, o in sent if o < ends.get(p, 0)), snapshot.snapshot_id


def metric_total(port: int, name: str, topic: str) -> float:
    """The sum of every series of `name` for `topic` (each partition's, say) that the router serves; 0 when
    none, or while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except OSError:  # not serving yet
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and f'topic="{topic}"' in line
    )


def metric_value(port: int, name: str, topic: str, labels: str = "") -> float:
    """The value of the series of `name` for `topic` (and `labels`) that the router serves; 0 when none, or
    while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except OSError:  # not serving yet
        return 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'topic="{topic}"' in line and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_query_that_fails_under_a_pattern_is_started_again_alone_while_the_other_goes_on(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    prefix = topic_name[:40]
    failing, other = f"{prefix}.a", f"{prefix}.b"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for topic in (failing, other):
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    (topics_dir := tmp_path / "topics").mkdir()
    # Its own trigger: the other topic runs in a query of its own.
    (topics_dir / f"{other}.yaml").write_text(
        json.dumps({"schema": "playback", "encoding": "json", "trigger_interval": "2 seconds"})
    )
    (port,) = free_ports(1)
    defaults = write_defaults(
        stack, tmp_path, schema="playback", encoding="json", cluster="test", trigger_interval="1 second",
        target_lag="30s", metrics_port=port, metrics_host="127.0.0.1",
    )  # fmt: skip
    # A record of pending files that is not one: the pattern's query fails as it starts, every time.
    bad = tmp_path / "checkpoint" / RECORDS_DIR / "0.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("not a record")
    sent = {}
    for topic in (failing, other):
        report = produce(
            ProduceRequest(topic=topic, count=100, partitions=2, schema="playback"),
            stack.bootstrap_servers, show_progress=False,
        )  # fmt: skip
        sent[topic] = produced_offsets(report.offsets)
    log = tmp_path / "router.log"
    command = pattern_command(rf"{prefix}\..*", defaults, topics_dir, "--restart-backoff", "1")
    router = start_command(command, log)

    def archived(topic: str) -> Counter[tuple[int, int]]:
        try:
            return Counter(archived_offsets(stack, table_for_topic(topic)))
        except Exception:  # its tables not made yet
            return Counter()

    try:
        eventually(
            lambda: set(archived(other)) == sent[other], "the other query's topic archived", timeout=180
        )
        eventually(lambda: metric_value(port, "bergstream_router_topic_restarts_total", failing) >= 2,
                   "the failing query started again")  # fmt: skip
        assert router.poll() is None, log.read_text()[-3000:]
        assert f"{bad} is not a record of files pending" in log.read_text()
        assert not archived(failing)
        # Mended, it runs at its next start, and archives its topic once.
        bad.unlink()
        eventually(lambda: set(archived(failing)) == sent[failing], "the mended query's topic archived")
        assert max(archived(failing).values()) == 1
    finally:
        router.send_signal(signal.SIGINT)
        assert router.wait(180) == 0, log.read_text()[-3000:]
