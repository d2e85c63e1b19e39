"""Values in the Confluent wire format, resolved from a real schema registry (AxonOps Schema Registry, which
serves Confluent's REST API), archived, evolved and replayed; confluent-kafka's own serdes on the far side."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pydantic import ValidationError
from pyspark.sql import SparkSession

from bergstream.backfill.read.batches import window_of
from bergstream.backfill.read.order import Unordered
from bergstream.backfill.replay import replay
from bergstream.cli import cli
from bergstream.errors import ConfigError
from bergstream.kafka_topics import ensure_topic
from bergstream.loadgen.events import EventModel
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local import schema_registry as registry_server
from bergstream.local.processes import free_port
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.router.registry_topic import RegistryTopic
from bergstream.schemas import wire
from bergstream.schemas.event_schema import load_event_schema
from bergstream.schemas.json_schema import avro_from_json_schema, json_schema_from_avro
from bergstream.schemas.schema_registry import SchemaRegistrySettings
from bergstream.schemas.spark_types import record_to_struct
from tests.routers import eventually, start_router, write_config
from tests.services import Services


def _config(stack: Services, topic: str, tmp_path: Path, encoding: str, **registry: Any) -> RouterConfig:
    return RouterConfig.flat(
        {
            "topic": topic, "schema": "playback", "encoding": encoding, "table": topic, "cluster": "test",
            "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
            "checkpoint_location": str(tmp_path / "checkpoint"), "catalog": stack.catalog,
            **({"schema_registry": registry} if registry else {}),
        }
    )  # fmt: skip


def _rows(stack: Services, table: str) -> list[dict[str, Any]]:
    loaded = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{table}")
    rows: list[dict[str, Any]] = loaded.scan().to_arrow().to_pylist()
    return rows


def _send(stack: Services, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0


def test_wire_format_frames_and_refuses() -> None:
    framed = wire.frame(7, b"payload")
    assert framed == b"\x00\x00\x00\x00\x07payload"
    assert wire.unframe(framed) == (7, b"payload")
    with pytest.raises(wire.WireFormatError, match="starts with byte 1, not the magic byte 0"):
        wire.unframe(b"\x01\x00\x00\x00\x07x")
    with pytest.raises(wire.WireFormatError, match="shorter than the 5-byte header"):
        wire.unframe(b"\x00\x00")
    with pytest.raises(wire.WireFormatError, match="schema id 0"):
        wire.frame(0, b"")


def test_json_schema_maps_onto_the_same_columns_as_the_avro_schema() -> None:
    for name in ("playback", "impression"):
        avro = load_event_schema(name).avro
        converted = avro_from_json_schema(json_schema_from_avro(avro), name)
        assert record_to_struct(converted) == record_to_struct(avro), name
    with pytest.raises(ConfigError, match=r"property device\.os has no type"):
        avro_from_json_schema(
            {
                "type": "object",
                "properties": {"device": {"type": "object", "properties": {"os": {"$ref": "#/x"}}}},
            },
            "event",
        )


def test_registry_settings_keep_the_login_secret(tmp_path: Path) -> None:
    settings = SchemaRegistrySettings.model_validate(
        {"url": "http://127.0.0.1:1/", "basic.auth.user.info": "reader:s3cret-word"}
    )
    assert settings.url == "http://127.0.0.1:1"
    assert "s3cret-word" not in repr(settings) and "s3cret-word" not in str(settings.model_dump())
    assert settings.client_config()["basic.auth.user.info"] == "reader:s3cret-word"
    with pytest.raises(ValidationError, match=r"put the login in basic\.auth\.user\.info"):
        SchemaRegistrySettings(url="http://reader:s3cret-word@127.0.0.1:1")
    with pytest.raises(ValidationError, match=r"basic\.auth\.user\.info is user:password"):
        SchemaRegistrySettings.model_validate({"url": "http://127.0.0.1:1", "basic.auth.user.info": "x"})


@pytest.mark.integration
def test_a_login_the_registry_refuses_is_one_line_without_the_password(
    registry_binary: Path, stack: Services, spark: SparkSession, tmp_path: Path
) -> None:
    secured = registry_server.SchemaRegistryConfig(
        tmp_path / "r", "127.0.0.1", free_port(), "router", "right-pw"
    )
    registry_server.start(secured)
    try:
        settings = SchemaRegistrySettings.model_validate(
            {"url": secured.url, "basic.auth.user.info": "router:right-pw"}
        )
        from bergstream.schemas.schema_registry import register

        schema_id = register(settings, "guarded-value", "AVRO", load_event_schema("playback").avro_json)
        config = _config(
            stack, "guarded", tmp_path, "avro", url=secured.url, **{"basic.auth.user.info": "router:right-pw"}
        )
        assert set(RegistryTopic(config).splitter.parser.wire.writers) == {schema_id}  # type: ignore[union-attr]
        wrong = _config(
            stack, "guarded", tmp_path, "avro", url=secured.url, **{"basic.auth.user.info": "router:wrong-pw"}
        )
        with pytest.raises(ConfigError) as refused:
            RegistryTopic(wrong)
        assert "refused the versions of subject guarded-value (HTTP 401)" in str(refused.value)
        assert "wrong-pw" not in str(refused.value)
    finally:
        registry_server.stop(secured)


@pytest.mark.integration
def test_a_replay_logs_in_to_the_registry_with_the_topics_settings_file(
    registry_binary: Path, stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    secured = registry_server.SchemaRegistryConfig(
        tmp_path / "r", "127.0.0.1", free_port(), "router", "right-pw"
    )
    registry_server.start(secured)
    try:
        login = {"url": secured.url, "basic.auth.user.info": "router:right-pw"}
        request = ProduceRequest(topic=topic_name, schema="playback", count=50, encoding="avro", partitions=1,
                                 schema_registry=SchemaRegistrySettings.model_validate(login))  # fmt: skip
        produce(request, stack.bootstrap_servers, show_progress=False)
        assert (
            archive_available_now(spark, _config(stack, topic_name, tmp_path, "avro", **login)).archived == 50
        )
        catalog = stack.catalog.model_dump(mode="json", exclude_none=True)
        now = datetime.now(UTC)
        start, end = (now - timedelta(hours=1)).isoformat(), (now + timedelta(hours=1)).isoformat()
        replayed = f"{topic_name}_replay"
        command = ["backfill", "replay", "--table", topic_name, "--to-topic", replayed, "--start", start,
                   "--end", end, "--bootstrap-servers", stack.bootstrap_servers]  # fmt: skip

        # The catalog alone: the registry the router recorded, without a login, refuses the replay.
        catalog_only = tmp_path / "catalog.yaml"
        catalog_only.write_text(yaml.safe_dump({"catalog": catalog}))
        refused = CliRunner().invoke(cli, [*command, "--config", str(catalog_only)])
        assert refused.exit_code != 0
        assert f"the schema registry at {secured.url} refused" in str(refused.exception), refused.output
        assert "HTTP 401" in str(refused.exception)

        # The topic's settings file logs in with its schema_registry section.
        topic_file = tmp_path / f"{topic_name}.yaml"
        topic_file.write_text(
            yaml.safe_dump({"topic": topic_name, "catalog": catalog, "schema_registry": login})
        )
        done = CliRunner().invoke(cli, [*command, "--config", str(topic_file)])
        assert done.exit_code == 0, done.output
        consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": replayed,
                             "auto.offset.reset": "earliest"})  # fmt: skip
        consumer.subscribe([replayed])
        deserializer = AvroDeserializer(
            SchemaRegistryClient(SchemaRegistrySettings.model_validate(login).client_config())
        )
        events = []
        deadline = time.monotonic() + 60
        while len(events) < 50 and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None:
                assert message.error() is None
                events.append(
                    deserializer(message.value(), SerializationContext(replayed, MessageField.VALUE))
                )
        consumer.close()
        archived = Counter((row["playback_id"], row["event_type"]) for row in _rows(stack, topic_name))
        assert Counter((event["playback_id"], event["event_type"]) for event in events) == archived
        assert len(events) == 50
    finally:
        registry_server.stop(secured)


@pytest.mark.integration
def test_avro_values_are_resolved_archived_evolved_and_replayed(
    stack: Services, spark: SparkSession, registry: registry_server.SchemaRegistryConfig, topic_name: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    settings = SchemaRegistrySettings(url=registry.url)
    request = ProduceRequest(topic=topic_name, schema="playback", count=300, encoding="avro", partitions=2,
                             schema_registry=settings)  # fmt: skip
    produce(request, stack.bootstrap_servers, show_progress=False)
    payload = load_event_schema("playback").encode(next(EventModel(seed=3).events("playback")).event, "avro")
    _send(stack, topic_name, [wire.frame(999_999, payload), payload, b"\x00\x01"])
    config = _config(stack, topic_name, tmp_path, "avro", url=registry.url)

    first = archive_available_now(spark, config)
    assert (first.read, first.archived, first.dead_lettered) == (303, 300, 3)
    client = SchemaRegistryClient({"url": registry.url})
    v1_id = client.get_version(f"{topic_name}-value", 1).schema_id
    assert {row["__metadata__"]["schema_id"] for row in _rows(stack, topic_name)} == {v1_id}
    reasons = sorted(row["error"] for row in _rows(stack, f"{topic_name}__dlq"))
    assert reasons == sorted([
        f"schema id 999999 is not a version of subject {topic_name}-value in the schema registry",
        "value does not start with the wire format's magic byte 0: not from a registry serializer",
        "value of 2 bytes is shorter than the 5-byte header of the wire format",
    ])  # fmt: skip

    # A compatible new version: an optional field. Its values come from confluent-kafka's own serializer.
    v2 = load_event_schema("playback").avro
    v2["fields"] = [*v2["fields"], {"name": "quality", "type": ["null", "string"], "default": None}]
    serializer = AvroSerializer(client, json.dumps(v2))
    events = EventModel(seed=5).events("playback")
    context = SerializationContext(topic_name, MessageField.VALUE)
    _send(
        stack, topic_name, [serializer({**next(events).event, "quality": "4K"}, context) for _ in range(100)]
    )
    second = archive_available_now(spark, config)
    assert (second.read, second.archived, second.dead_lettered) == (100, 100, 0)
    v2_id = client.get_version(f"{topic_name}-value", 2).schema_id
    archived = _rows(stack, topic_name)
    assert Counter((row["__metadata__"]["schema_id"], row["quality"]) for row in archived) == {
        (v1_id, None): 300,
        (v2_id, "4K"): 100,
    }

    # Replayed in the wire format with each row's original id: confluent-kafka's deserializer reads them.
    replayed = f"{topic_name}_replay"
    now = datetime.now(UTC)
    report = replay(
        stack.catalog, topic_name, window_of(now - timedelta(hours=1), now + timedelta(hours=1)), Unordered(),
        replayed, {"bootstrap.servers": stack.bootstrap_servers},
    )  # fmt: skip
    assert report.records == 400
    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": replayed,
                         "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.subscribe([replayed])
    deserializer = AvroDeserializer(client)
    read: Counter[tuple[int, str | None]] = Counter()
    deadline = time.monotonic() + 60
    while sum(read.values()) < 400 and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is None:
            continue
        assert message.error() is None
        value = message.value()
        event = deserializer(value, SerializationContext(replayed, MessageField.VALUE))
        read[(wire.unframe(value)[0], event.get("quality"))] += 1
    consumer.close()
    assert read == {(v1_id, None): 300, (v2_id, "4K"): 100}


@pytest.mark.integration
def test_json_schema_values_and_a_wire_header_on_a_plain_topic(
    stack: Services, spark: SparkSession, registry: registry_server.SchemaRegistryConfig, topic_name: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    settings = SchemaRegistrySettings(url=registry.url)
    request = ProduceRequest(topic=topic_name, schema="playback", count=200, encoding="json", partitions=2,
                             schema_registry=settings)  # fmt: skip
    produce(request, stack.bootstrap_servers, show_progress=False)
    registered = SchemaRegistryClient({"url": registry.url}).get_latest_version(f"{topic_name}-value")
    assert registered.schema.schema_type == "JSON"

    done = archive_available_now(spark, _config(stack, topic_name, tmp_path, "json", url=registry.url))
    assert (done.read, done.archived, done.dead_lettered) == (200, 200, 0)
    rows = _rows(stack, topic_name)
    assert {row["__metadata__"]["schema_id"] for row in rows} == {registered.schema_id}
    assert all(
        row["event_ts"] is not None and row["event_type"] in ("START", "HEARTBEAT", "STOP") for row in rows
    )

    # The same values on a topic whose settings have no schema_registry.
    plain = f"{topic_name}_plain"
    produce(replace(request, topic=plain, count=20), stack.bootstrap_servers, show_progress=False)
    refused = archive_available_now(spark, _config(stack, plain, tmp_path / "plain", "json"))
    assert (refused.archived, refused.dead_lettered) == (0, 20)
    assert {row["error"] for row in _rows(stack, f"{plain}__dlq")} == {
        f"value starts with a schema registry's wire-format header (magic byte 0, schema id "
        f"{registered.schema_id}) but the topic's settings have no schema_registry"
    }


@pytest.mark.integration
def test_a_registry_outage_holds_the_batch_then_dead_letters_what_it_cannot_resolve(
    registry_binary: Path, stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    server = registry_server.SchemaRegistryConfig(tmp_path / "registry", "127.0.0.1", free_port())
    pid = registry_server.start(server)
    try:
        client = SchemaRegistryClient({"url": server.url})
        playback = load_event_schema("playback")
        known = client.register_schema(f"{topic_name}-value", Schema(playback.avro_json, "AVRO"))
        config = _config(stack, topic_name, tmp_path, "avro", url=server.url, timeout_seconds=1,
                         give_up_after_seconds=4, initial_backoff_seconds=0.5)  # fmt: skip
        from bergstream.router.driver.query import TopicsQuery
        from bergstream.router.driver.settings import named_topics_settings
        from bergstream.router.metrics import RouterMetrics

        settings = named_topics_settings(topic_name, [config], None)
        router = TopicsQuery(settings, lambda topic: config, spark, RouterMetrics(topic_name), strict=True)
        ensure_topic({"bootstrap.servers": stack.bootstrap_servers}, topic_name, 1)
        router.prepare()  # knows the first version only
        quality = {"name": "quality", "type": ["null", "string"], "default": None}
        v2 = dict(playback.avro, fields=[*playback.avro["fields"], quality])
        unseen = client.register_schema(f"{topic_name}-value", Schema(json.dumps(v2), "AVRO"))
        events = EventModel(seed=9).events("playback")
        _send(
            stack,
            topic_name,
            [wire.frame(known, playback.encode(next(events).event, "avro")) for _ in range(10)]
            + [wire.frame(unseen, playback.encode(next(events).event, "avro") + b"\x00") for _ in range(5)],
        )
        os.kill(pid, signal.SIGSTOP)  # the registry hangs: connections open, no answers
        try:
            started = time.monotonic()
            totals = router.run(available_now=True)[topic_name]
            waited = time.monotonic() - started
        finally:
            os.kill(pid, signal.SIGCONT)
        assert (totals.read, totals.archived, totals.dead_lettered) == (15, 10, 5)
        assert waited >= 4
        reasons = {row["error"] for row in _rows(stack, f"{topic_name}__dlq")}
        assert len(reasons) == 1
        (reason,) = reasons
        assert reason.startswith(
            f"schema id {unseen}: the schema registry at {server.url} did not answer for "
        )
    finally:
        registry_server.stop(server)


@pytest.mark.integration
def test_a_router_waiting_for_the_registry_at_start_stops_on_sigterm(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    """SIGTERM ends the wait for a registry that does not answer, at once and cleanly, however long the
    router would otherwise wait for it (give_up_after_seconds)."""
    ensure_topic({"bootstrap.servers": stack.bootstrap_servers}, topic_name, 1)
    nowhere = f"http://127.0.0.1:{free_port()}"
    registry = {
        "url": nowhere,
        "timeout_seconds": 1,
        "give_up_after_seconds": 600,
        "initial_backoff_seconds": 1,
    }
    config = write_config(stack, tmp_path, topic_name, encoding="avro", schema_registry=registry)
    log = tmp_path / "router.log"
    router = start_router(topic_name, config, log)
    try:
        eventually(lambda: "trying again in" in log.read_text(), "the router to wait for the registry", 120)
        router.send_signal(signal.SIGTERM)
        assert router.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if router.poll() is None:
            router.kill()


@pytest.mark.integration
def test_a_live_application_reads_versions_registered_while_it_runs_and_leaves_out_what_is_no_version(
    stack: Services, registry: registry_server.SchemaRegistryConfig, topic_name: str, tmp_path: Path
) -> None:
    """`app run` over a registry topic: the source's query knows the subject's versions at start; a value of
    a version registered later fails its batch, the subject is fetched again and the query starts again from
    its checkpoint; an id that is no version is left out, as the router dead-letters it."""
    settings = SchemaRegistrySettings(url=registry.url)
    request = ProduceRequest(topic=topic_name, schema="playback", count=300, encoding="avro", partitions=2,
                             schema_registry=settings)  # fmt: skip
    produce(request, stack.bootstrap_servers, show_progress=False)
    playback = load_event_schema("playback")
    payload = playback.encode(next(EventModel(seed=3).events("playback")).event, "avro")
    _send(stack, topic_name, [wire.frame(999_999, payload), payload])
    output = f"identity_{topic_name}".replace("-", "_").replace(".", "_")
    app = {
        "app": "identity",
        "entry": "tests.jobs.identity_app:identity",
        "sources": {"playback": {"topic": topic_name, "schema": "playback", "encoding": "avro",
                                 "schema_registry": {"url": registry.url}}},
        "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
        "checkpoint_location": str(tmp_path / "checkpoint"),
        "output_table": output,
        "trigger_interval": "1 second",
        "spark": {"master": "local[2]"},
    }  # fmt: skip
    config = tmp_path / "identity.yaml"
    config.write_text(json.dumps(app))
    log = tmp_path / "app.log"
    catalog = stack.catalog.load()

    def output_rows() -> list[dict[str, Any]]:
        if not catalog.table_exists(("apps", output)):
            return []
        rows: list[dict[str, Any]] = catalog.load_table(("apps", output)).scan().to_arrow().to_pylist()
        return rows

    command = [sys.executable, "-m", "bergstream", "app", "run", "--app", "identity", "--config", str(config)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=Path(__file__).parent.parent, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        eventually(lambda: len(output_rows()) >= 300 or process.poll() is not None,
                   "the application to read the first version's values", 240)  # fmt: skip
        assert process.poll() is None, log.read_text()[-3000:]

        # The producer evolves: confluent-kafka's serializer registers an optional field as it writes.
        client = SchemaRegistryClient({"url": registry.url})
        quality = {"name": "quality", "type": ["null", "string"], "default": None}
        v2 = dict(playback.avro, fields=[*playback.avro["fields"], quality])
        serializer = AvroSerializer(client, json.dumps(v2))
        context = SerializationContext(topic_name, MessageField.VALUE)
        events = EventModel(seed=5).events("playback")
        _send(
            stack,
            topic_name,
            [serializer({**next(events).event, "quality": "4K"}, context) for _ in range(100)],
        )
        eventually(lambda: len(output_rows()) >= 400 or process.poll() is not None,
                   "the application to read the second version's values", 240)  # fmt: skip
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    v2_id = client.get_version(f"{topic_name}-value", 2).schema_id
    assert f"schema id {v2_id} is a version of subject {topic_name}-value registered after the query" in text
    assert f"schema id 999999 is not a version of subject {topic_name}-value" in text
    rows = output_rows()
    assert len(rows) == 400, "each value of a version read once, the others left out"
    assert len({(row["partition"], row["offset"]) for row in rows}) == 400
    assert all(row["event_type"] in ("START", "HEARTBEAT", "STOP") for row in rows)
