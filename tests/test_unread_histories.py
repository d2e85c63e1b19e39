"""Topics on a target lag read only when their commit is due (router/driver/unread.py) through what a bad
day brings a router of many topics: a topic whose schema changes while it is unread, one deleted with a range
unread, one deleted and made again while the router is stopped, a catalog that takes 2 s a commit, one big
topic beside tiny ones. Each record is in the archive once, or its loss is counted; positions are exact."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from confluent_kafka import Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from bergstream.catalog import CatalogConfig
from bergstream.loadgen.events import EventModel
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local import schema_registry as registry_server
from bergstream.local.processes import free_ports
from bergstream.router.config import table_for_topic
from bergstream.router.driver.unread import RECORDS_DIR
from bergstream.schemas.batch_range import BatchRange
from bergstream.schemas.event_schema import load_event_schema
from bergstream.schemas.schema_registry import SchemaRegistrySettings
from tests.commands import run_whole
from tests.postgres import USER, postgres_server
from tests.routers import (
    archived_offsets,
    eventually,
    pattern_command,
    produced_offsets,
    recreate,
    start_command,
    write_defaults,
)
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
from tests.test_unread_ranges import killed, metric_total, metric_value


def archived(stack: Services, topic: str) -> Counter[tuple[int, int]]:
    """Each (partition, offset) of `topic` in its archive table, counted; empty before the table is made."""
    try:
        return Counter(archived_offsets(stack, table_for_topic(topic)))
    except Exception:  # its table not made yet
        return Counter()


def once(stack: Services, topic: str, sent: set[tuple[int, int]]) -> bool:
    counted = archived(stack, topic)
    assert not counted or max(counted.values()) == 1, f"{topic}: archived twice: {counted.most_common(3)}"
    return set(counted) == sent


def ends(sent: set[tuple[int, int]]) -> dict[int, int]:
    """Per partition, the offset after the last of `sent`."""
    last: dict[int, int] = {}
    for partition, offset in sent:
        last[partition] = max(last.get(partition, -1), offset)
    return {partition: offset + 1 for partition, offset in last.items()}


def test_a_schema_change_a_topic_deleted_and_one_made_again_while_stopped_each_record_once_or_counted_lost(
    spark: SparkSession,
    stack: Services,
    registry: registry_server.SchemaRegistryConfig,
    topic_name: str,
    tmp_path: Path,
) -> None:
    """A pattern router on an hour's target lag reads nothing of its three topics while the test runs but
    what the history makes due. A new schema version of one topic while it is unread needs no commit of its
    own. A topic deleted with its range unread loses it, counted as expired, offset for offset. Killed, and a
    topic's first records removed from Kafka (counted as expired when its range is read) and a topic deleted
    and made again while it is stopped: the router refuses to start, naming the topic; the
    other topic's range stays recorded. The operator takes the topic made again out of the router's pattern
    (it is archived by a router of its own): the router starts, the old topic's range counted as lost, and a
    graceful stop reads the other topic's range whole, both schema versions in one snapshot recording it."""
    prefix = topic_name[:40]
    evolves, leaves, remade = f"{prefix}.evolves", f"{prefix}.leaves", f"{prefix}.remade"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for topic in (evolves, leaves, remade):
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    (topics_dir := tmp_path / "topics").mkdir()
    (port,) = free_ports(1)
    # An hour's target lag: only what the history does reads a topic while the test runs.
    defaults = write_defaults(
        stack, tmp_path, schema="playback", encoding="avro", cluster="test", trigger_interval="1 second",
        target_lag="1h", metrics_port=port, metrics_host="127.0.0.1", schema_registry={"url": registry.url},
    )  # fmt: skip
    command = pattern_command(rf"{prefix}\..*", defaults, topics_dir, "--restart-backoff", "1")
    settings = SchemaRegistrySettings(url=registry.url)
    sent: dict[str, set[tuple[int, int]]] = {topic: set() for topic in (evolves, leaves, remade)}

    def send(topic: str, count: int, seed: int) -> None:
        request = ProduceRequest(topic=topic, schema="playback", count=count, encoding="avro", partitions=2,
                                 seed=seed, schema_registry=settings)  # fmt: skip
        report = produce(request, stack.bootstrap_servers, show_progress=False)
        sent[topic] |= produced_offsets(report.offsets)

    for seed, topic in enumerate(sent):
        send(topic, 100, seed)

    def unread(topic: str) -> float:
        return metric_value(port, "bergstream_router_pending_records", topic)

    def expired(topic: str) -> float:
        return metric_total(port, "bergstream_router_expired_offsets_total", topic)

    log = tmp_path / "router.log"
    router = start_command(command, log)
    try:
        eventually(lambda: all(unread(t) == 100 for t in sent), "every topic's records unread", timeout=240)
        # A new version of the schema (an optional field) while the topic is unread: nothing is written
        # before its commit, so nothing is committed for it.
        client = SchemaRegistryClient({"url": registry.url})
        v2 = load_event_schema("playback").avro
        v2["fields"] = [*v2["fields"], {"name": "quality", "type": ["null", "string"], "default": None}]
        serializer = AvroSerializer(client, json.dumps(v2))
        context = SerializationContext(evolves, MessageField.VALUE)
        producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
        delivered: list[tuple[int, int]] = []

        def on_delivery(_: object, message: Message) -> None:
            delivered.append((message.partition(), message.offset()))

        events = EventModel(seed=7).events("playback")
        for _ in range(50):
            value = serializer({**next(events).event, "quality": "4K"}, context)
            producer.produce(evolves, value=value, on_delivery=on_delivery)
        assert producer.flush(30) == 0
        sent[evolves] |= set(delivered)
        eventually(lambda: unread(evolves) == 150, "the new version's records unread beside the old")

        # A topic deleted with its range unread: the range is lost, counted as expired at the next batch.
        admin.delete_topics([leaves])[leaves].result(30)
        send(evolves, 20, seed=9)
        eventually(lambda: expired(leaves) == 100, "the deleted topic's unread offsets counted as expired")
        eventually(lambda: unread(evolves) == 170, "the next records unread")
        assert unread(leaves) == 0 and unread(remade) == 100
        assert not any(archived(stack, topic) for topic in sent), "read before its target lag"
        assert not any(metric_value(port, "bergstream_router_commits_total", topic) for topic in sent), (
            "a commit before its target lag"
        )
    finally:
        killed(router)

    # Killed with ranges unread, and a topic deleted and made again while the router is stopped: the router
    # refuses it at start (its offsets start over), and what the others have unread stays recorded.
    recreate(stack.bootstrap_servers, remade, 2)
    send(remade, 10, seed=10)
    refused = run_whole(spark, [*command, "--available-now"])
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output[-3000:]
    assert f"topic {remade}: Kafka's topic of that name has id" in output, output[-3000:]
    assert "Archive the new topic with a router of its own" in output, output[-3000:]
    assert not any(archived(stack, topic) for topic in sent), "read on the way to the refusal"
    records = tmp_path / "checkpoint" / RECORDS_DIR
    newest = max(records.glob("*.json"), key=lambda path: int(path.stem))
    recorded = json.loads(newest.read_text())["topics"]
    assert sorted(recorded) == [evolves, remade], recorded
    assert recorded[evolves]["start"] == {"0": 0, "1": 0}, "unread from where its archive ends: its start"

    # While it is stopped, the first records of one partition of the topic unread go from Kafka (its
    # retention passed): counted as expired when its range is read, offset for offset; the rest read once.
    gone = 30
    deleted = admin.delete_records([TopicPartition(evolves, 0, gone)])
    assert all(future.result(30).low_watermark == gone for future in deleted.values())
    sent[evolves] -= {(0, offset) for offset in range(gone)}

    # The operator's fix: the topic made again is archived by a router of its own, and this router's
    # pattern no longer takes it. The old topic's range is lost with it, counted; the other's is read once.
    narrowed = pattern_command(rf"{prefix}\.(evolves|leaves)", defaults, topics_dir, "--restart-backoff", "1")
    router = start_command(narrowed, log)
    try:
        send(evolves, 10, seed=11)
        eventually(lambda: expired(remade) == 100, "the old topic's unread offsets counted as lost",
                   timeout=240)  # fmt: skip
        eventually(lambda: unread(evolves) == 180, "the range recorded unread, and the new records")
        assert not archived(stack, evolves), "read before its target lag"
        router.send_signal(signal.SIGINT)
        router.wait(180)
    finally:
        if router.poll() is None:
            killed(router)
    output = log.read_text()
    assert router.returncode == 0, output[-3000:]
    assert f"topic {remade} was deleted and made again while the router was stopped" in output
    # Counted once, where the range is read (the router's metrics end with it: its log says so).
    expired_line = f"{evolves} partition 0: offsets 0 to {gone - 1} ({gone} records) expired from Kafka"
    assert output.count(expired_line) == 1 and output.count(f"{evolves} partition 0: offsets") == 1, output
    assert once(stack, evolves, sent[evolves]), "each record of the topic that changed schema, once"
    assert not archived(stack, leaves) and not archived(stack, remade), "nothing of the topics gone"
    # Read at the graceful stop, both versions' records in one snapshot, recording the whole range.
    table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{table_for_topic(evolves)}")
    (snapshot,) = table.snapshots()
    assert snapshot.summary is not None
    assert BatchRange.recorded(snapshot.summary.additional_properties, evolves, "test") == BatchRange(
        {0: 0, 1: 0}, ends(sent[evolves])
    )
    rows = Counter(table.scan(selected_fields=("quality",)).to_arrow().column("quality").to_pylist())
    assert set(rows) == {None, "4K"} and rows.total() == 180 - gone, rows


def chained(catalog: CatalogConfig, topic: str, sent: set[tuple[int, int]]) -> list[BatchRange]:
    """The ranges the commits to `topic`'s archive table record, asserted to follow each other from its start
    to the end of `sent`, exactly."""
    table = catalog.load().load_table(f"{catalog.namespace}.{table_for_topic(topic)}")
    snapshots = sorted(table.snapshots(), key=lambda snapshot: snapshot.sequence_number or 0)
    ranges = [
        BatchRange.recorded(snapshot.summary.additional_properties, topic, "test")
        for snapshot in snapshots
        if snapshot.summary is not None
    ]
    assert ranges and all(covered is not None for covered in ranges), ranges
    start: dict[int, int] | str = {0: 0, 1: 0}
    for covered in ranges:
        assert covered is not None and covered.start == start, f"{topic}: {ranges}"
        start = covered.end
    assert start == ends(sent), f"{topic}: {ranges}"
    return [covered for covered in ranges if covered is not None]


def test_one_big_topic_read_by_size_every_round_and_tiny_ones_on_their_lag_on_a_catalog_taking_2_s_a_commit(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    """A pattern router on a 40 s target lag over one big topic, due by size each round it gets, and four tiny
    ones, met each round and read only when their lag makes them due, on a catalog that takes 2 s a commit:
    each record is archived once, the commits of each table record ranges that follow each other exactly, a
    tiny topic's commit holds several rounds, and the commits due together run side by side."""
    prefix = topic_name[:40]
    big = f"{prefix}.big"
    tiny = [f"{prefix}.tiny{number}" for number in range(4)]
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for topic in (big, *tiny):
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    (topics_dir := tmp_path / "topics").mkdir()
    # The big topic's commit's worth is 100 records: a round of 150 makes it due.
    (topics_dir / f"{big}.yaml").write_text(yaml.safe_dump({"commit_records": 100}))
    (port,) = free_ports(1)
    sent: dict[str, set[tuple[int, int]]] = {topic: set() for topic in (big, *tiny)}

    def send(seed: int) -> None:
        for number, topic in enumerate((big, *tiny)):
            report = produce(
                ProduceRequest(topic=topic, schema="playback", count=150 if topic == big else 3, partitions=2,
                               seed=seed * 10 + number),
                stack.bootstrap_servers, show_progress=False,
            )  # fmt: skip
            sent[topic] |= produced_offsets(report.offsets)

    with postgres_server() as postgres:
        catalog = CatalogConfig(uri=postgres.jdbc_uri, warehouse=(tmp_path / "warehouse").as_uri(), user=USER)
        services = Services(stack.bootstrap_servers, catalog, None)
        defaults = write_defaults(
            services, tmp_path, schema="playback", encoding="json", cluster="test",
            trigger_interval="1 second", target_lag="40s", metrics_port=port, metrics_host="127.0.0.1",
        )  # fmt: skip
        log = tmp_path / "router.log"
        router = start_command(pattern_command(rf"{prefix}\..*", defaults, topics_dir), log)
        try:
            eventually(lambda: "started: query" in log.read_text(), "the query to start", timeout=240)
            # Every commit of a table takes 2 s in the catalog from now on, and is logged with its times.
            postgres.sql("""
                CREATE TABLE commit_log (table_name text, started timestamptz, ended timestamptz);
                CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
                DECLARE began timestamptz := clock_timestamp();
                BEGIN
                    PERFORM pg_sleep(2);
                    INSERT INTO commit_log VALUES (NEW.table_name, began, clock_timestamp());
                    RETURN NEW;
                END $$;
                CREATE TRIGGER slow_commit BEFORE UPDATE ON iceberg_tables
                    FOR EACH ROW EXECUTE FUNCTION slow_commit();
            """)
            # Rounds until every tiny topic has been read on its lag: the big one is read every round.
            rounds = 0
            lagged: set[str] = set()
            while rounds < 3 or lagged != set(tiny):
                assert rounds < 30, f"tiny topics not committed on their lag after {rounds} rounds: {lagged}"
                send(rounds)
                rounds += 1
                eventually(lambda: once(services, big, sent[big]), "the big topic's round committed")
                lagged = {
                    topic for topic in tiny
                    if metric_value(port, "bergstream_router_commits_total", topic, 'reason="lag"') >= 1
                }  # fmt: skip
            # Counted once the batch whose commit the table shows has ended.
            eventually(
                lambda: metric_value(port, "bergstream_router_commits_total", big, 'reason="size"') >= rounds,
                f"the big topic's {rounds} commits counted by size", timeout=60,
            )  # fmt: skip

            def met(topic: str) -> bool:
                """Every record sent met by a batch: archived, or unread (a stop archives what is unread)."""
                pending = metric_value(port, "bergstream_router_pending_records", topic)
                return len(archived(services, topic)) + pending == len(sent[topic])

            # The last round's tiny records may come in a batch after the big topic's: met before the stop.
            eventually(lambda: all(met(topic) for topic in tiny), "the last round met")
        finally:
            router.send_signal(signal.SIGINT)
            router.wait(180)
        output = log.read_text()
        assert router.returncode == 0, output[-3000:]
        for topic in (big, *tiny):
            assert once(services, topic, sent[topic]), f"{topic}: not every record archived"
        # Each tiny topic met in every round, read only when due by its lag (or at the stop): one commit at
        # least holds more than one round's records (3 a round), and fewer commits than rounds were made.
        for topic in tiny:
            table = catalog.load().load_table(f"{catalog.namespace}.{table_for_topic(topic)}")
            added = [int(snap.summary["added-records"]) for snap in table.snapshots() if snap.summary]
            assert max(added) > 3, f"{topic}: a commit every round in {rounds} rounds: {added}"
            assert len(chained(catalog, topic, sent[topic])) < rounds, added
        assert len(chained(catalog, big, sent[big])) >= rounds
        # Commits were made side by side: two tables' commits overlapped in the catalog.
        commits = [
            line.split("|")
            for line in postgres.sql(
                "SELECT table_name, extract(epoch FROM started), extract(epoch FROM ended) FROM commit_log"
            ).split()
        ]
        spans = [(name, float(start), float(end)) for name, start, end in commits]
        assert len(spans) >= rounds + len(tiny), spans
        overlapping = [(a, b) for a in spans for b in spans if a[0] < b[0] and a[1] < b[2] and b[1] < a[2]]
        assert overlapping, f"every commit waited for the one before it: {sorted(spans, key=lambda s: s[1])}"
