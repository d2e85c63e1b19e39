"""A topic's schema gains optional fields: the table gains the columns without rewriting a file."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer
from pyiceberg import types as it

from bergstream.loadgen.events import EventModel
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.config import load_router_config
from bergstream.router.driver.launch import archive_available_now
from bergstream.schemas.event_schema import AVRO_DIR, load_event_schema
from tests.routers import appended_by_spark, run_router, write_config
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def schema_version(directory: Path, change: dict[str, object] | None = None) -> Path:
    directory.mkdir()
    avro = json.loads((AVRO_DIR / "playback.avsc").read_text())
    if change:
        avro["fields"] = [change.get(f["name"], f) for f in avro["fields"]] + change.get("+", [])  # type: ignore[operator]
    (directory / "playback.avsc").write_text(json.dumps(avro))
    return directory


def test_new_optional_fields_become_columns_and_incompatible_types_are_refused(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    v1 = schema_version(tmp_path / "v1")
    produce(
        ProduceRequest(topic=topic_name, schema="playback", count=500, partitions=2), stack.bootstrap_servers,
        show_progress=False,
    )  # fmt: skip
    # The first version's table, archived in the tests' own Spark session; the router process evolves it.
    first = load_router_config(
        topic_name, write_config(stack, tmp_path, topic_name, schema_dir=str(v1)), {}, {}
    )
    assert archive_available_now(spark, first).archived == 500
    table_name = f"{stack.catalog.namespace}.{topic_name}"
    files_before = {
        f["file_path"] for f in stack.catalog.load().load_table(table_name).inspect.files().to_pylist()
    }

    device = next(
        f for f in json.loads((AVRO_DIR / "playback.avsc").read_text())["fields"] if f["name"] == "device"
    )
    device["type"]["fields"].append({"name": "screen", "type": ["null", "string"], "default": None})
    v2 = schema_version(
        tmp_path / "v2",
        {"device": device, "+": [{"name": "quality", "type": ["null", "string"], "default": None}]},
    )
    schema = load_event_schema("playback", v2)
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
    events = EventModel(seed=4).events("playback")
    for _ in range(200):
        generated = next(events)
        event = {**generated.event, "quality": "4K"}
        event["device"] = {**event["device"], "screen": "oled"}
        producer.produce(topic_name, key=generated.key, value=schema.encode(event, "json"))
    assert producer.flush(30) == 0
    done = run_router(
        topic_name, write_config(stack, tmp_path, topic_name, schema_dir=str(v2)), "--available-now"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "read 200, archived 200, dead-lettered 0" in done.stdout
    # The table's new column comes after the metadata, where the rows hold it before: the one writer makes
    # the rows in the table's order, Spark's writer (which stamps its application in a commit) has no part.
    assert appended_by_spark(stack, topic_name) == []

    table = stack.catalog.load().load_table(table_name)
    assert isinstance(table.schema().find_type("quality"), it.StringType)
    assert isinstance(table.schema().find_type("device.screen"), it.StringType)
    assert files_before <= {f["file_path"] for f in table.inspect.files().to_pylist()}, (
        "old files were rewritten"
    )
    rows = table.scan(selected_fields=("quality", "device")).to_arrow().to_pylist()
    assert Counter((r["quality"], r["device"]["screen"]) for r in rows) == {
        (None, None): 500,
        ("4K", "oled"): 200,
    }

    show_id = {"name": "show_id", "type": "string"}
    v3 = schema_version(tmp_path / "v3", {"show_id": show_id})
    refused = run_router(
        topic_name, write_config(stack, tmp_path, topic_name, schema_dir=str(v3)), "--available-now"
    )
    assert refused.returncode == 1
    error = refused.stderr.strip().splitlines()[-1]
    assert f"schema {v3 / 'playback.avsc'} does not fit table" in error
    assert "show_id is bigint in the table but string in the schema" in error
    shutil.rmtree(v3)
