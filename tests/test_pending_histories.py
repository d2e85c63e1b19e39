"""Files pending on a target lag (router/pending.py) through what a bad day brings a router of many topics:
a topic whose schema changes, one deleted, one deleted and created again while the router is stopped, a
catalog that takes 2 s a commit, one big topic beside tiny ones. Each record is in the archive once, and
its positions are exact."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

import yaml
from confluent_kafka import Message, Producer
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
from bergstream.schemas.event_schema import load_event_schema
from bergstream.schemas.schema_registry import SchemaRegistrySettings
from tests.postgres import USER, postgres_server
from tests.routers import (
    ROOT,
    archived_offsets,
    eventually,
    pattern_command,
    produced_offsets,
    recreate,
    start_command,
    write_defaults,
)
from tests.services import Services
from tests.test_unread_ranges import killed, metric_value


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


def test_a_schema_change_a_topic_deleted_and_one_made_again_while_stopped_each_commit_what_is_pending_once(
    stack: Services, registry: registry_server.SchemaRegistryConfig, topic_name: str, tmp_path: Path
) -> None:
    prefix = topic_name[:40]
    evolves, leaves, remade = f"{prefix}.evolves", f"{prefix}.leaves", f"{prefix}.remade"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for topic in (evolves, leaves, remade):
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    (topics_dir := tmp_path / "topics").mkdir()
    (port,) = free_ports(1)
    # An hour's target lag: only what the history does commits while the test runs.
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

    def pending(topic: str) -> float:
        return metric_value(port, "bergstream_router_pending_records", topic)

    log = tmp_path / "router.log"
    router = start_command(command, log)
    try:
        eventually(lambda: all(pending(t) == 100 for t in sent), "every topic's records pending", timeout=240)
        assert not any(archived(stack, topic) for topic in sent), "committed before its target lag"

        # A new version of the schema (an optional field): the batch that reads it commits what was pending
        # under the old one with its own files, in one snapshot.
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
        eventually(
            lambda: metric_value(port, "bergstream_router_commits_total", evolves, 'reason="schema"') == 1,
            "the schema change's commit",
        )
        table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{table_for_topic(evolves)}")
        assert len(table.snapshots()) == 1, "the versions' files in one commit"
        rows = Counter(table.scan(selected_fields=("quality",)).to_arrow().column("quality").to_pylist())
        assert rows[None] == 100 and rows["4K"] >= 1, rows

        # A topic deleted leaves the query: what it had pending is committed at the next batch.
        admin.delete_topics([leaves])[leaves].result(30)
        send(evolves, 20, seed=9)
        eventually(lambda: once(stack, leaves, sent[leaves]), "the deleted topic's pending records committed")
        assert metric_value(port, "bergstream_router_commits_total", leaves, 'reason="left"') == 1
        assert not archived(stack, remade), "a topic still in the query commits on its lag"
        eventually(lambda: pending(evolves) >= 20, "the next records pending")
    finally:
        killed(router)

    # Killed with files pending, and a topic deleted and made again while the router is stopped: the router
    # refuses it at start (its offsets start over), after committing what was read from it before, once.
    recreate(stack.bootstrap_servers, remade, 2)
    request = ProduceRequest(topic=remade, schema="playback", count=10, encoding="avro", partitions=2,
                             schema_registry=settings)  # fmt: skip
    produce(request, stack.bootstrap_servers, show_progress=False)
    refused = subprocess.run(
        [*command, "--available-now"], capture_output=True, text=True, timeout=300, cwd=ROOT, check=False
    )
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output[-3000:]
    assert f"topic {remade}: Kafka's topic of that name has id" in output, output[-3000:]
    assert once(stack, remade, sent[remade]), "the records read before the topic was made again"
    assert once(stack, evolves, sent[evolves])
    assert once(stack, leaves, sent[leaves])
    table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{table_for_topic(evolves)}")
    rows = Counter(table.scan(selected_fields=("quality",)).to_arrow().column("quality").to_pylist())
    assert rows == {None: 120, "4K": 50}


def test_one_big_topic_and_tiny_ones_on_a_catalog_taking_2_s_a_commit(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    prefix = topic_name[:40]
    big = f"{prefix}.big"
    tiny = [f"{prefix}.tiny{number}" for number in range(4)]
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for topic in (big, *tiny):
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    (topics_dir := tmp_path / "topics").mkdir()
    # The big topic's commit's worth is 100 records: it reaches that every batch it reads a round.
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
            # Rounds until every tiny topic has committed on its lag: the big one commits every round.
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
            assert metric_value(port, "bergstream_router_commits_total", big, 'reason="size"') >= rounds
        finally:
            router.send_signal(signal.SIGINT)
            router.wait(180)
        output = log.read_text()
        assert router.returncode == 0, output[-3000:]
        for topic in (big, *tiny):
            assert once(services, topic, sent[topic]), f"{topic}: not every record archived"
        # Each tiny topic read in every round, its files waited for its lag: one commit at least holds more
        # than one round's records (3 a round).
        for topic in tiny:
            table = catalog.load().load_table(f"{catalog.namespace}.{table_for_topic(topic)}")
            added = [int(snap.summary["added-records"]) for snap in table.snapshots() if snap.summary]
            assert max(added) > 3, f"{topic}: a commit every round in {rounds} rounds: {added}"
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
