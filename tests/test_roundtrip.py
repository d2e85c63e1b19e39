"""Produce, archive with Spark's Kafka source into the archive layout, read back with pyiceberg."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, TopicPartition
from pyiceberg import types as it
from pyiceberg.conversions import from_bytes
from pyiceberg.transforms import HourTransform

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.schemas import ArchiveLayout, load_event_schema
from bergstream.schemas.event_schema import Encoding
from bergstream.schemas.parse import ERROR, UNDECODABLE_JSON
from tests.parsing import parse_and_explain
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration
COUNT = 3000


def kafka_records(
    bootstrap: str, topic: str, ends: dict[int, int]
) -> dict[tuple[int, int], tuple[int, bytes]]:
    """Every record of the topic as (partition, offset) -> (timestamp in ms, value)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{topic}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    records: dict[tuple[int, int], tuple[int, bytes]] = {}
    while len(records) < sum(ends.values()):
        message = consumer.poll(10)
        assert message is not None, f"only {len(records)} records came back from {topic}"
        assert message.error() is None
        records[(message.partition(), message.offset())] = (message.timestamp()[1], message.value())
    consumer.close()
    return records


@pytest.mark.parametrize(("kind", "encoding"), [("playback", "json"), ("impression", "avro")])
def test_produce_archive_and_read_back(
    stack: Services, spark: SparkSession, topic_name: str, kind: str, encoding: Encoding, tmp_path: Path
) -> None:
    request = ProduceRequest(
        topic=topic_name, schema=kind, count=COUNT, late_fraction=0.1, bad_fraction=0.05, encoding=encoding,
        partitions=3, seed=11,
    )  # fmt: skip
    report = produce(request, stack.bootstrap_servers, show_progress=False)
    assert report.sent == COUNT
    assert set(report.per_partition) == {0, 1, 2}

    layout = ArchiveLayout(load_event_schema(kind), table=topic_name)
    config = RouterConfig.flat(
        topic=topic_name, schema=kind, encoding=encoding, table=topic_name, cluster="roundtrip",
        kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        checkpoint_location=str(tmp_path / "checkpoint"), catalog=stack.catalog,
    )  # fmt: skip
    result = archive_available_now(spark, config)
    assert result.read == COUNT
    assert result.dead_lettered == sum(report.malformed.values()) > 0
    assert result.archived + result.dead_lettered == COUNT

    catalog = stack.catalog.load()
    table = catalog.load_table(f"{stack.catalog.namespace}.{topic_name}")
    dead_letter_table = catalog.load_table(f"{stack.catalog.namespace}.{layout.dead_letter_table}")

    schema = table.schema()
    assert isinstance(schema.find_type("account_id"), it.LongType)
    assert isinstance(schema.find_type("event_ts"), it.TimestamptzType)
    assert isinstance(schema.find_type("device"), it.StructType)
    assert isinstance(schema.find_type("__metadata__.kafka_ingestion_ts"), it.TimestamptzType)
    assert isinstance(schema.find_type("__metadata__.offset"), it.LongType)
    assert isinstance(schema.find_type("__metadata__.partition"), it.IntegerType)
    assert isinstance(schema.find_type("__metadata__.key"), it.BinaryType)
    assert isinstance(schema.find_type("__metadata__.headers"), it.ListType)

    ingestion_id = schema.find_field("__metadata__.kafka_ingestion_ts").field_id
    (partition_field,) = table.spec().fields
    assert partition_field.source_id == ingestion_id
    assert isinstance(partition_field.transform, HourTransform)
    (sort_field,) = table.sort_order().fields
    assert sort_field.source_id == ingestion_id
    assert table.properties["write.parquet.compression-codec"] == "zstd"

    ends = {p: high + 1 for p, (_, high) in report.offsets.items()}
    sent = kafka_records(stack.bootstrap_servers, topic_name, ends)
    archived = table.scan().to_arrow().to_pylist()
    dead = dead_letter_table.scan().to_arrow().to_pylist()
    seen = [(r["__metadata__"]["partition"], r["__metadata__"]["offset"]) for r in archived + dead]
    assert len(seen) == len(set(seen)) == COUNT, "every (partition, offset) exactly once"
    assert set(seen) == set(sent)

    event_schema = load_event_schema(kind)
    for row in archived:
        metadata = row["__metadata__"]
        timestamp_ms, value = sent[(metadata["partition"], metadata["offset"])]
        assert metadata["kafka_ingestion_ts"] == datetime.fromtimestamp(timestamp_ms / 1000, UTC)
        assert metadata["topic"] == topic_name
        assert metadata["cluster"] == "roundtrip"
        assert metadata["timestamp_type"] == "CreateTime"
        assert metadata["key"] == str(row["account_id"]).encode()
        assert {h["key"] for h in metadata["headers"]} == {"producer", "encoding"}
        event = event_schema.decode(value, encoding)
        assert row["account_id"] == event["account_id"]
        assert row["device"] == event["device"]
    # The router works out the reasons of dead letters apart from its hot path: they are the reasons
    # the parser gives on its own, never the provisional one.
    values = spark.createDataFrame([(row["raw_value"],) for row in dead], "value binary")
    reasons = parse_and_explain(values, layout, encoding).select("value", ERROR).collect()
    expected = {None if r.value is None else bytes(r.value): r.error for r in reasons}
    for row in dead:
        assert row["raw_value"] == sent[(row["__metadata__"]["partition"], row["__metadata__"]["offset"])][1]
        assert row["error"] == expected[row["raw_value"]] != UNDECODABLE_JSON

    for data_file in table.inspect.files().to_pylist():
        hour = data_file["partition"][partition_field.name]
        lower, upper = (
            from_bytes(it.TimestamptzType(), dict(data_file[bound])[ingestion_id])
            for bound in ("lower_bounds", "upper_bounds")
        )
        assert lower // 3_600_000_000 == upper // 3_600_000_000 == hour
        parquet = pq.ParquetFile(urlparse(data_file["file_path"]).path)
        columns = parquet.metadata.row_group(0)
        assert columns.column(0).compression == "ZSTD"
        encodings = {
            columns.column(n).path_in_schema: columns.column(n).encodings for n in range(columns.num_columns)
        }
        # Offsets are all distinct and stored as they are; a value of few kinds gets its dictionary.
        assert not {"PLAIN_DICTIONARY", "RLE_DICTIONARY"} & set(encodings["__metadata__.offset"])
        assert {"PLAIN_DICTIONARY", "RLE_DICTIONARY"} & set(encodings["__metadata__.timestamp_type"])
        ingestion = (
            parquet.read(columns=["__metadata__"]).column(0).combine_chunks().field("kafka_ingestion_ts")
        )
        times = ingestion.to_pylist()
        assert times == sorted(times), f"rows of {data_file['file_path']} are not in ingestion-time order"
