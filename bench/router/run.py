"""bench/router: how fast the router archives, how fresh the archive is, and how small.

One run, on one machine, against the embedded stack, on the same events:
  (a) Spark's Kafka source into the noop sink: the ceiling for any Spark job reading the topic
  (a2) the same, decoding each value (from_json or from_avro): the ceiling for any Spark job reading
       the events
  (b) the router end to end: Kafka to the archive and dead-letter tables, committed
  (c) plain confluent-kafka consumption: what a Python consumer reads without Spark
then freshness (produce to visible in the table) at a steady rate, files and sizes per hour, and the
archive's bytes against the Kafka log bytes of the same events.

    .venv/bin/python -m bench.router.run [--events 500000] [--rate 3000] [--seconds 90]

Prints the numbers, writes bench/out/router-<topic>-<encoding>-<producer compression>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local import LocalStack, StackConfig
from bergstream.local.processes import free_ports
from bergstream.spark import build_spark_session
from router.app import Router, archive_available_now
from router.config import RouterConfig
from router.maintain import maintain
from router.metrics import RouterMetrics
from schemas.archive import ArchiveLayout
from schemas.registry import load_event_schema

OUT = Path(__file__).parent.parent / "out"
PARTITIONS = 4


def machine() -> str:
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cores = os.cpu_count()
    return f"{platform.machine()}, {cores} cores, {memory_gib:.0f} GiB, Python {platform.python_version()}"


def plain_consumer(bootstrap: str, topic: str, expected: int) -> tuple[float, int]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-plain",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52428800,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    started, seen, size = time.monotonic(), 0, 0
    while seen < expected:
        for message in consumer.consume(10000, timeout=5):
            if message.error() is None:
                seen += 1
                size += len(message.value() or b"")
    elapsed = time.monotonic() - started
    consumer.close()
    return elapsed, size


def spark_noop(
    spark: Any, bootstrap: str, topic: str, checkpoint: Path, max_offsets: int, decode: Any = None
) -> float:
    """Seconds for Spark's Kafka source to read the topic into the noop sink; `decode` maps the records."""
    started = time.monotonic()
    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets))
        .option("includeHeaders", "true")
        .load()
    )
    if decode is not None:
        records = decode(records)
    writer = records.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    return time.monotonic() - started


def freshness(stack: LocalStack, table_name: str, after_ms: int) -> list[float]:
    """Seconds from each record's Kafka timestamp to the commit of the snapshot that added it."""
    table = stack.config.catalog.load().load_table(f"archive.{table_name}")
    committed = {s.snapshot_id: s.timestamp_ms for s in table.snapshots()}
    delays = []
    for entry in table.inspect.entries().to_pylist():
        if entry["status"] != 1:  # only the entry that added the file: not later rewrites or deletes
            continue
        commit_ms = committed.get(entry["snapshot_id"])
        if commit_ms is None or commit_ms < after_ms:
            continue
        # Through the table's FileIO: the warehouse may be a folder or a bucket.
        with table.io.new_input(entry["data_file"]["file_path"]).open() as stream:
            stamps = (
                pq.read_table(stream, columns=["__metadata__"])
                .column(0)
                .combine_chunks()
                .field("kafka_ingestion_ts")
            )
        for stamp in stamps.to_pylist():
            delays.append(commit_ms / 1000 - stamp.replace(tzinfo=UTC).timestamp())
    return delays


def files_per_hour(stack: LocalStack, table_name: str) -> dict[int, list[int]]:
    """Sizes of the table's current data files, by ingestion hour."""
    table = stack.config.catalog.load().load_table(f"archive.{table_name}")
    per_hour: dict[int, list[int]] = defaultdict(list)
    for data_file in table.inspect.files().to_pylist():
        per_hour[next(iter(data_file["partition"].values()))].append(data_file["file_size_in_bytes"])
    return per_hour


def bytes_per_column(stack: LocalStack, table_name: str) -> dict[str, int]:
    """Compressed Parquet bytes of each column over the table's current data files, largest first."""
    table = stack.config.catalog.load().load_table(f"archive.{table_name}")
    sizes: dict[str, int] = defaultdict(int)
    for data_file in table.inspect.files().to_pylist():
        with table.io.new_input(data_file["file_path"]).open() as stream:
            metadata = pq.ParquetFile(stream).metadata
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            for column in range(row_group.num_columns):
                chunk = row_group.column(column)
                sizes[chunk.path_in_schema] += chunk.total_compressed_size
    return dict(sorted(sizes.items(), key=lambda item: -item[1]))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--topic", default="playback", choices=("playback", "impression"))
    parser.add_argument("--encoding", default="json", choices=("json", "avro"))
    parser.add_argument("--rate", type=float, default=3000, help="events/s for the freshness run")
    parser.add_argument("--seconds", type=float, default=90, help="length of the freshness run")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=250_000)
    parser.add_argument(
        "--producer-compression",
        default="lz4",
        choices=("none", "lz4", "zstd", "snappy", "gzip"),
        help="compression.type of the producer: what the Kafka log holds",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("bergstream.router").setLevel(logging.INFO)
    OUT.mkdir(parents=True, exist_ok=True)
    producer_config = {"compression.type": args.producer_compression}
    home = Path(tempfile.mkdtemp(prefix="bergstream-bench-"))
    kafka_port, controller_port = free_ports(2)
    stack = LocalStack(StackConfig(data_dir=home, kafka_port=kafka_port, controller_port=controller_port))
    status = stack.up()
    results: dict[str, Any] = {
        "machine": machine(),
        "events": args.events,
        "date": datetime.now(UTC).isoformat(),
    }
    try:
        topic = args.topic
        report = produce(
            ProduceRequest(
                topic=topic,
                count=args.events,
                partitions=PARTITIONS,
                late_fraction=0.05,
                seed=1,
                encoding=args.encoding,
            ),
            status.bootstrap_servers,
            producer_config=producer_config,
            show_progress=False,
        )
        megabytes = report.value_bytes / 1e6
        print(f"produced {report.sent:,} events, {megabytes:.1f} MB of {args.encoding} values")

        elapsed, _ = plain_consumer(status.bootstrap_servers, topic, args.events)
        results["c_plain_consumer"] = {
            "seconds": elapsed,
            "events_per_s": args.events / elapsed,
            "mb_per_s": megabytes / elapsed,
        }

        catalog = stack.config.catalog
        spark = build_spark_session(catalog, app_name="bench-router")
        try:
            # Both (a) and (b) are measured warm: each runs once on the same events beforehand, so that
            # neither pays for the JVM compiling its code paths.
            spark_noop(
                spark, status.bootstrap_servers, topic, home / "noop-warmup", args.max_offsets_per_trigger
            )
            elapsed = spark_noop(
                spark, status.bootstrap_servers, topic, home / "noop", args.max_offsets_per_trigger
            )
            results["a_spark_noop"] = {
                "seconds": elapsed,
                "events_per_s": args.events / elapsed,
                "mb_per_s": megabytes / elapsed,
            }
            # (a2) the same, decoding every value into the event's type: the least that
            # any Spark job reading these events does, before it writes anything.
            event_schema = load_event_schema(topic)
            event_type = ArchiveLayout(event_schema, topic).event_type

            def decode(records: Any) -> Any:
                if args.encoding == "avro":
                    return records.select(from_avro(F.col("value"), event_schema.avro_json).alias("event"))
                return records.select(F.from_json(F.col("value").cast("string"), event_type).alias("event"))

            spark_noop(
                spark, status.bootstrap_servers, topic, home / "decode-warmup", args.max_offsets_per_trigger,
                decode,
            )  # fmt: skip
            elapsed = spark_noop(
                spark, status.bootstrap_servers, topic, home / "decode", args.max_offsets_per_trigger, decode
            )
            results["a2_spark_decode"] = {
                "seconds": elapsed,
                "events_per_s": args.events / elapsed,
                "mb_per_s": megabytes / elapsed,
            }
            config = RouterConfig(
                topic=topic,
                schema=topic,
                encoding=args.encoding,
                table=topic,
                kafka={"kafka.bootstrap.servers": status.bootstrap_servers, "startingOffsets": "earliest"},
                checkpoint_location=str(home / "checkpoints" / topic),
                catalog=catalog,
                max_offsets_per_trigger=args.max_offsets_per_trigger,
                trigger_interval="1 second",
            )
            warmup = config.model_copy(
                update={
                    "table": f"{topic}_warmup",
                    "checkpoint_location": str(home / "checkpoints" / "warmup"),
                }
            )
            archive_available_now(spark, warmup)
            started = time.monotonic()
            totals = archive_available_now(spark, config)
            elapsed = time.monotonic() - started
            results["b_router"] = {
                "seconds": elapsed,
                "events_per_s": totals.read / elapsed,
                "mb_per_s": megabytes / elapsed,
                "batches": totals.batches,
            }
            for base in ("a_spark_noop", "a2_spark_decode"):
                results[f"b_over_{base[: base.index('_')]}"] = (
                    results["b_router"]["events_per_s"] / results[base]["events_per_s"]
                )

            # Freshness: the router runs on its trigger while events arrive at a steady rate.
            started_ms = int(time.time() * 1000)
            router = Router(config, spark, RouterMetrics(topic))
            runner = threading.Thread(target=router.run)
            runner.start()
            steady = ProduceRequest(
                topic=topic,
                count=int(args.rate * args.seconds),
                rate=args.rate,
                partitions=PARTITIONS,
                seed=2,
                encoding=args.encoding,
            )
            produce(steady, status.bootstrap_servers, producer_config=producer_config, show_progress=False)
            time.sleep(10)
            for query in spark.streams.active:
                query.stop()
            runner.join()
            delays = freshness(stack, topic, started_ms)
            before_compaction = files_per_hour(stack, topic)
            # Two hours from now every hour written is closed, grace included: compact them all, as
            # maintenance would.
            maintain(spark, config, now=datetime.now(UTC) + timedelta(hours=2))
        finally:
            spark.stop()
        results["freshness_s"] = {
            "p50": percentile(delays, 50),
            "p99": percentile(delays, 99),
            "rate": args.rate,
            "trigger": config.trigger_interval,
            "records": len(delays),
        }

        after_compaction = files_per_hour(stack, topic)
        archived_rows = totals.read + len(delays)
        results["archive_bytes_per_event_by_column"] = {
            column: round(size / archived_rows, 3) for column, size in bytes_per_column(stack, topic).items()
        }
        kafka_bytes = sum(p.stat().st_size for p in stack.config.broker.log_dir.glob(f"{topic}-*/*.log"))
        results["producer_compression"] = args.producer_compression
        for name, per_hour in (
            ("before_compaction", before_compaction),
            ("after_compaction", after_compaction),
        ):
            archive_bytes = sum(sum(sizes) for sizes in per_hour.values())
            results[name] = {
                "files_per_hour": {
                    datetime.fromtimestamp(hour * 3600, UTC).strftime("%Y-%m-%d %H:00"): {
                        "files": len(sizes),
                        "mean_mb": statistics.mean(sizes) / 1e6,
                        "total_mb": sum(sizes) / 1e6,
                    }
                    for hour, sizes in sorted(per_hour.items())
                },
                "kafka_log_mb": kafka_bytes / 1e6,
                "archive_mb": archive_bytes / 1e6,
                "archive_over_kafka": archive_bytes / kafka_bytes,
            }
    finally:
        stack.down()
        shutil.rmtree(home, ignore_errors=True)
    results["topic"], results["encoding"] = args.topic, args.encoding
    (OUT / f"{run_name(results)}.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    plot(results, delays)


def run_name(results: dict[str, Any]) -> str:
    return f"router-{results['topic']}-{results['encoding']}-{results['producer_compression']}"


def plot(results: dict[str, Any], delays: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (throughput, fresh) = plt.subplots(1, 2, figsize=(11, 4))
    names = ["(a) Spark noop", "(a2) decode", "(b) router", "(c) confluent-kafka"]
    keys = ("a_spark_noop", "a2_spark_decode", "b_router", "c_plain_consumer")
    rates = [results[k]["events_per_s"] for k in keys]
    throughput.bar(names, rates, color=["#888", "#aaa", "#2a7", "#47a"])
    throughput.set_ylabel("events/s")
    throughput.set_title(f"Throughput, {results['events']:,} events ({results['machine']})", fontsize=8)
    fresh.hist(delays, bins=50, color="#2a7")
    fresh.set_xlabel("seconds from Kafka timestamp to committed in the table")
    fresh_s = results["freshness_s"]
    fresh.set_title(
        f"Freshness at {fresh_s['rate']:.0f} events/s: p50 {fresh_s['p50']:.1f}s, p99 {fresh_s['p99']:.1f}s",
        fontsize=8,
    )
    figure.tight_layout()
    path = OUT / f"{run_name(results)}.png"
    figure.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
