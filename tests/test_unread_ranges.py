"""Topics on a target lag are read only when their commit is due (router/driver/unread.py): each batch adds
every topic's Kafka range to what it has unread, from where its archive ends, records before the batch ends
where each range unread starts (RECORDS_DIR/<batch>.json beside the checkpoint), and reads the due topics'
ranges from Kafka in one read, each commit recording the whole range it covers. Each record is in the
archive once, and each commit's range follows the one before it, whatever step the router is killed at:
before a batch's record is written, after a due topic's commit and before the record says so, between the
commits of several topics due in one batch; a topic's tables dropped while a range is unread hold, made
again, that range from where the record says it starts; a topic commits on its lag while the router runs,
each commit carrying several batches' ranges."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka.admin import AdminClient, NewTopic

from bergstream.catalog import CatalogConfig
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local.processes import free_ports
from bergstream.router.config import table_for_topic
from bergstream.router.driver.behind import BEHIND_FILE
from bergstream.router.driver.unread import RECORDS_DIR
from tests.commands import run_whole
from tests.postgres import USER, PostgresServer, postgres_server
from tests.routers import (
    archived_offsets,
    eventually,
    pattern_command,
    produced_offsets,
    start_command,
    write_defaults,
)
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# A batch's range in a partition, as its commit's summary records it.
BATCH_START = "bergstream.kafka.batch-start"
NEXT_OFFSETS = "bergstream.kafka.next-offsets"


def killed(router: subprocess.Popen[bytes]) -> None:
    os.killpg(router.pid, signal.SIGKILL)
    router.wait(60)


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


def newest_record(checkpoint: Path) -> tuple[int, dict[str, dict[int, int]]]:
    """The newest record of ranges unread beside `checkpoint`: its batch, and each topic's range's start
    ((-1, {}) when there is none)."""
    records = sorted(int(path.stem) for path in (checkpoint / RECORDS_DIR).glob("*.json"))
    if not records:
        return -1, {}
    document = json.loads((checkpoint / RECORDS_DIR / f"{records[-1]}.json").read_text())
    starts = {
        topic: {int(p): int(o) for p, o in kept["start"].items()}
        for topic, kept in document["topics"].items()
    }
    return int(document["batch"]), starts


def newest_batch(checkpoint: Path, log: str) -> int:
    """The newest batch of the checkpoint's offset log (`offsets`) or commit log (`commits`); -1: none."""
    batches = [int(path.name) for path in (checkpoint / log).iterdir() if path.name.isdigit()]
    return max(batches, default=-1)


def archived(stack: Services, topic: str) -> Counter[tuple[int, int]]:
    """Each (partition, offset) of `topic` in its archive and dead-letter tables, counted; empty before its
    tables are made."""
    try:
        return Counter(archived_offsets(stack, table_for_topic(topic)))
    except Exception:  # its tables not made yet
        return Counter()


def archived_once_exactly(
    stack: Services, topic: str, sent: set[tuple[int, int]], start: dict[int, int] | None = None
) -> None:
    """`topic`'s tables hold `sent` alone, each record once; its archive table's commits' ranges follow each
    other from `start` (else each partition's first record) to where `sent` ends, and at each commit the
    rows are exactly those below the position it records: a backfill planned at any snapshot hands over to
    Kafka where the archive ends."""
    counted = archived(stack, topic)
    assert set(counted) == sent, f"{topic}: {len(set(counted) & sent)} of {len(sent)} archived, " \
        f"{len(set(counted) - sent)} not sent: {sorted(sent - set(counted))[:5]}"  # fmt: skip
    assert max(counted.values()) == 1, f"{topic}: archived twice: {counted.most_common(3)}"
    catalog = stack.catalog.load()
    table = catalog.load_table(f"{stack.catalog.namespace}.{table_for_topic(topic)}")
    dead_letters = catalog.load_table(f"{stack.catalog.namespace}.{table_for_topic(topic)}__dlq")
    dead = set(_metadata(dead_letters))
    partitions = sorted({p for p, _ in sent})
    previous = start or {p: min(o for q, o in sent if q == p) for p in partitions}
    for snapshot in table.snapshots():
        summary = snapshot.summary
        assert summary is not None
        begins = {int(p): o for p, o in json.loads(summary[BATCH_START]).items()}
        ends = {int(p): o for p, o in json.loads(summary[NEXT_OFFSETS]).items()}
        assert begins == previous, f"{topic}: a commit from {begins} after one that ended at {previous}"
        rows = sorted((p, o) for p, o in _metadata(table, snapshot.snapshot_id))
        assert rows == sorted((p, o) for p, o in sent - dead if o < ends.get(p, 0)), (
            f"{topic}: snapshot {snapshot.snapshot_id} records {ends}, its rows end elsewhere"
        )
        previous = ends
    assert previous == {p: max(o for q, o in sent if q == p) + 1 for p in partitions}, previous


def _metadata(table: object, snapshot_id: int | None = None) -> list[tuple[int, int]]:
    scan = table.scan(snapshot_id=snapshot_id, selected_fields=("__metadata__",))  # type: ignore[attr-defined]
    return [(m["partition"], m["offset"]) for m in scan.to_arrow().column("__metadata__").to_pylist()]


def drained(spark: SparkSession, command: list[str]) -> str:
    """`command` run with `--available-now` to its end, on the tests' session: every topic's range unread
    archived."""
    done = run_whole(spark, [*command, "--available-now"])
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done.stdout + done.stderr


class CatalogGate:
    """The commits of chosen tables held in a PostgreSQL catalog: an Iceberg commit is an UPDATE of the
    table's row in iceberg_tables, which waits while the table's name is in `gate`."""

    def __init__(self, postgres: PostgresServer) -> None:
        self.postgres = postgres

    def install(self) -> None:
        """Once the catalog has made its tables."""
        self.postgres.sql("""
            CREATE TABLE gate (table_name text PRIMARY KEY);
            CREATE FUNCTION gated() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                WHILE EXISTS (SELECT 1 FROM gate WHERE gate.table_name = NEW.table_name) LOOP
                    PERFORM pg_sleep(0.05);
                END LOOP;
                RETURN NEW;
            END $$;
            CREATE TRIGGER gated BEFORE UPDATE ON iceberg_tables FOR EACH ROW EXECUTE FUNCTION gated();
        """)

    def close(self, *tables: str) -> None:
        rows = ", ".join(f"('{table}'), ('{table}__dlq')" for table in tables)
        self.postgres.sql(f"INSERT INTO gate VALUES {rows}")

    def open(self, *tables: str) -> None:
        names = ", ".join(f"'{table}', '{table}__dlq'" for table in tables)
        self.postgres.sql(f"DELETE FROM gate WHERE table_name IN ({names})")

    def held(self) -> bool:
        """Whether a commit waits at the gate."""
        return (
            int(self.postgres.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")) > 0
        )

    def end_the_killed(self) -> None:
        """The sessions of a router killed end: a commit it left waiting at the gate is not made later."""

        def ended() -> bool:
            left = self.postgres.sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
            return not left.split()

        eventually(ended, "the killed router's catalog sessions ended", timeout=30)


@contextmanager
def gated_catalog(stack: Services, tmp_path: Path) -> Iterator[tuple[Services, CatalogGate]]:
    with postgres_server() as postgres:
        catalog = CatalogConfig(uri=postgres.jdbc_uri, warehouse=(tmp_path / "warehouse").as_uri(), user=USER)
        yield Services(stack.bootstrap_servers, catalog, None), CatalogGate(postgres)


def test_each_record_is_archived_once_whatever_step_the_router_is_killed_at_and_whatever_it_restarts_with(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    """Topics on an hour's lag, a commit's worth 200 records, on a catalog whose commits of chosen tables the
    test holds. Killed while a due topic's commit waits, before the batch's record is written (the other
    topic's range, its tables recording nothing, known from the batch before's record alone); started again,
    and killed as two topics due in one batch commit: the first committed, the record still saying its range
    starts where it did before, the second waiting, its tables recording nothing still; started again with
    another target lag, trigger and commit's worth. Every record is archived once, every commit's range
    follows the one before it."""
    prefix = topic_name[:40]
    # c only holds a batch (its commit waits at the gate) while the next batch's records are sent.
    a, b, c = f"{prefix}.a", f"{prefix}.b", f"{prefix}.c"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for topic in (a, b, c):
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    (topics_dir := tmp_path / "topics").mkdir()
    (port,) = free_ports(1)
    checkpoint = tmp_path / "checkpoint"
    log = tmp_path / "router.log"
    sent: dict[str, set[tuple[int, int]]] = {a: set(), b: set(), c: set()}
    seeds = itertools.count(1)

    def send(topic: str, count: int) -> None:
        report = produce(
            ProduceRequest(topic=topic, count=count, partitions=2, schema="playback", bad_fraction=0.1,
                           seed=next(seeds)),
            stack.bootstrap_servers, show_progress=False,
        )  # fmt: skip
        sent[topic] |= produced_offsets(report.offsets)

    def unread(topic: str) -> float:
        return metric_value(port, "bergstream_router_pending_records", topic)

    def ends(topic: str) -> dict[int, int]:
        return {p: max(o for q, o in sent[topic] if q == p) + 1 for p in (0, 1)}

    with gated_catalog(stack, tmp_path) as (services, gate):

        def holds(topic: str) -> bool:
            return len(archived(services, topic)) == len(sent[topic])

        def settings(**changed: object) -> list[str]:
            defaults = write_defaults(
                services, tmp_path, **{"schema": "playback", "encoding": "json", "cluster": "test",
                "trigger_interval": "1 second", "target_lag": "1h", "commit_records": 200,
                "metrics_port": port, "metrics_host": "127.0.0.1", **changed},
            )  # fmt: skip
            return pattern_command(rf"{prefix}\.(a|b|c)", defaults, topics_dir)

        command = settings()
        send(a, 100)
        send(b, 100)
        router = start_command(command, log)
        try:
            # Met, not read: 100 unread each, recorded; nothing committed.
            eventually(lambda: unread(a) == 100 and unread(b) == 100, "both topics' ranges met", timeout=240)
            assert not archived(services, a) and not archived(services, b)
            gate.install()
            # A's range reaches a commit's worth: due, read, and its commit held. Killed before the batch
            # ends: its record is not written, and b's range, its tables recording nothing, is known from the
            # batch before's record alone.
            gate.close(table_for_topic(a))
            send(a, 150)
            eventually(gate.held, "a's commit held", timeout=120)
        finally:
            killed(router)
        gate.end_the_killed()
        assert newest_record(checkpoint)[0] < newest_batch(checkpoint, "offsets"), "its record written"
        assert newest_batch(checkpoint, "commits") < newest_batch(checkpoint, "offsets")
        assert not archived(services, a) and not archived(services, b)
        gate.open(table_for_topic(a))

        # Started again as it was: the batch is run again, a read from where the record says and committed
        # once, b's range still unread.
        first_kill = newest_batch(checkpoint, "offsets")
        router = start_command(command, log)
        try:
            eventually(lambda: newest_batch(checkpoint, "commits") >= first_kill, "the batch run again", 240)
            assert holds(a), f"a: {len(archived(services, a))} of {len(sent[a])} archived"
            assert (unread(a), unread(b)) == (0, 100)
            # A's next range met and recorded, not due: from where its archive ends.
            recorded = ends(a)
            send(a, 100)
            eventually(lambda: unread(a) == 100, "a's next range met")
            # A batch held (c's commit waits) while a and b get records: the next batch finds both due; a is
            # committed, b's commit waits.
            gate.close(table_for_topic(c), table_for_topic(b))
            send(c, 200)
            eventually(gate.held, "c's commit held")
            send(a, 150)
            send(b, 150)
            gate.open(table_for_topic(c))
            eventually(lambda: holds(a) and holds(c) and gate.held(), "a committed, b's commit held")
        finally:
            killed(router)
        gate.end_the_killed()
        # A's commit is made, and the record still says its range starts where its archive ended before;
        # b's tables record nothing, its range known from the record alone.
        batch, starts = newest_record(checkpoint)
        assert batch < newest_batch(checkpoint, "offsets"), "its record written"
        assert starts == {a: recorded, b: {0: 0, 1: 0}}, starts
        assert newest_batch(checkpoint, "commits") < newest_batch(checkpoint, "offsets")
        assert not archived(services, b)
        gate.open(table_for_topic(b))

        # Started again with other settings (another target lag, trigger and commit's worth), records since:
        # the batch is run again, a not read twice, and the next meets the new records, nothing due; b's
        # range runs from where the record says. A graceful stop reads what is unread, each record once.
        killed_at = newest_batch(checkpoint, "offsets")
        send(a, 50)
        send(b, 50)
        other = settings(target_lag="2h", trigger_interval="2 seconds", commit_records=100_000)
        router = start_command(other, log)
        try:
            eventually(lambda: newest_batch(checkpoint, "commits") > killed_at, "the next batch", timeout=240)
            assert (unread(a), unread(b)) == (50, 300)
        finally:
            router.send_signal(signal.SIGINT)
            assert router.wait(180) == 0, log.read_text()[-3000:]
        for topic in (a, b, c):
            archived_once_exactly(services, topic, sent[topic])


def test_a_topics_tables_dropped_while_a_range_is_unread_hold_it_from_where_its_record_says_it_starts(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    """A topic's tables dropped while the router is stopped with a range unread (its archive started over):
    made again, they record no position, and the range is read from where the record beside the checkpoint
    says it starts: not from Kafka's earliest (what was archived before the drop went with it), and not
    skipped (from where the checkpoint's last batch ended)."""
    topic = f"{topic_name[:40]}.dropped"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    (topics_dir := tmp_path / "topics").mkdir()
    (port,) = free_ports(1)
    # A commit's worth of 150 records: the first 150 are committed while the router runs, the next wait.
    defaults = write_defaults(
        stack, tmp_path, schema="playback", encoding="json", cluster="test", trigger_interval="1 second",
        target_lag="1h", commit_records=150, metrics_port=port, metrics_host="127.0.0.1",
    )  # fmt: skip
    command = pattern_command(rf"{topic_name[:40]}\.dropped", defaults, topics_dir)
    log = tmp_path / "router.log"
    table = table_for_topic(topic)

    def send(count: int, seed: int) -> set[tuple[int, int]]:
        report = produce(ProduceRequest(topic=topic, count=count, partitions=2, schema="playback", seed=seed),
                         stack.bootstrap_servers, show_progress=False)  # fmt: skip
        return produced_offsets(report.offsets)

    committed = send(150, seed=1)
    router = start_command(command, log)
    try:
        eventually(lambda: set(archived(stack, topic)) == committed, "the first 150 committed", timeout=240)
        unread = send(120, seed=2)
        eventually(lambda: metric_value(port, "bergstream_router_pending_records", topic) == 120,
                   "the next 120 met, unread")  # fmt: skip
    finally:
        killed(router)
    _, starts = newest_record(tmp_path / "checkpoint")
    ends = {p: max(o for q, o in committed if q == p) + 1 for p in (0, 1)}
    assert starts == {topic: ends}, starts

    catalog = stack.catalog.load()
    for name in (table, f"{table}__dlq"):
        catalog.drop_table(f"{stack.catalog.namespace}.{name}")
    # More records meanwhile: the batch that meets them starts where the checkpoint's last one ended.
    unread |= send(30, seed=3)
    drained(spark, command)
    archived_once_exactly(stack, topic, unread, start=ends)


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

    def met(count: int) -> bool:
        """`count` records met: archived or unread."""
        # Archived first, then unread: a range committed between the two looks is in neither, never in both.
        archived_now = len(archived(stack, topic))
        return archived_now + metric_value(port, "bergstream_router_pending_records", topic) >= count

    try:
        # Records in every batch for a while: the topic's commits come on its lag, not every batch.
        for seed in range(8):
            report = produce(
                ProduceRequest(topic=topic, count=40, partitions=2, schema="playback", seed=seed),
                stack.bootstrap_servers, show_progress=False,
            )  # fmt: skip
            sent |= produced_offsets(report.offsets)
            # Met by a batch (archived or unread) before the next are sent: a batch for each.
            eventually(partial(met, len(sent)), "the records met", timeout=240)
        eventually(lambda: archived(stack, topic).keys() == sent, "every record committed on the topic's lag",
                   timeout=120)  # fmt: skip
        eventually(lambda: metric_value(port, "bergstream_router_pending_records", topic) == 0,
                   "nothing left unread")  # fmt: skip
        commits = metric_total(port, "bergstream_router_commits_total", topic)
        assert metric_value(port, "bergstream_router_commits_total", topic, 'reason="lag"') == commits >= 1
        assert metric_total(port, "bergstream_router_records_read_total", topic) == len(sent)
        assert metric_value(port, "bergstream_router_target_lag_seconds", topic) == 6
        assert metric_value(port, "bergstream_router_table_metadata_bytes", topic) > 0
    finally:
        router.send_signal(signal.SIGINT)
        router.wait(180)
    archived_once_exactly(stack, topic, sent)
    # Fewer commits than rounds sent a batch each: a commit holds several batches' ranges.
    table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{table_for_topic(topic)}")
    added = [int(s.summary["added-records"]) for s in table.snapshots() if s.summary is not None]
    assert len(added) < 8 and max(added) > 40, f"a commit per batch: {added}"


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
    # The record of the topics set aside beside the pattern's checkpoint, cut off (a disk full as it was
    # written): the pattern's query fails as it starts, every time.
    bad = tmp_path / "checkpoint" / BEHIND_FILE
    bad.parent.mkdir(parents=True)
    bad.write_text('{"topic": {"end": {"0": 1')
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

    try:
        eventually(
            lambda: set(archived(stack, other)) == sent[other],
            "the other query's topic archived",
            timeout=180,
        )
        eventually(
            lambda: log.read_text().count(f"{bad} is not JSON") >= 2, "the failing query started again"
        )
        assert router.poll() is None, log.read_text()[-3000:]
        assert not archived(stack, failing)
        # Mended, it runs at its next start, and archives its topic once (at its end, on its lag).
        bad.unlink()
        eventually(lambda: metric_value(port, "bergstream_router_pending_records", failing) == 100
                   or set(archived(stack, failing)) == sent[failing],
                   "the mended query's topic met")  # fmt: skip
    finally:
        router.send_signal(signal.SIGINT)
        assert router.wait(180) == 0, log.read_text()[-3000:]
    assert max(archived(stack, failing).values()) == 1
    assert set(archived(stack, failing)) == sent[failing]
