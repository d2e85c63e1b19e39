"""bench/router: how fast the router archives, how fresh the archive is, and how small, against its peers.

One run, on one machine, against the embedded stack, on the same events:
  (a) Spark's Kafka source into the noop sink: the ceiling for any Spark job reading the topic
  (a2) the same, decoding each value (from_json or from_avro): the ceiling for any Spark job reading
       the events
  (b) the router end to end: Kafka to the archive and dead-letter tables, committed
  (u) the same router reading with kafka.isolation.level read_uncommitted (not run by default): what (b)'s
      read_committed costs
  (c) plain confluent-kafka consumption: what a Python consumer reads without Spark
  (d) the plain Spark job a user would write instead: decode, keep the Kafka timestamp, append to Iceberg
  (e) Apache Iceberg's Kafka Connect sink in a standalone Kafka Connect worker, into the layout of (d)
(b), (u), (d) and (e) each drain the backlog (warm: --warm-ups times before, into other tables, since the
JVMs' compilers take a few drains to settle), with the CPU seconds of their own processes; then each runs
on a 1-second trigger (commit interval) while events arrive at each steady rate, for freshness (Kafka
timestamp to committed in the table) and files per hour. Storage: bytes per event of each table, the
archive's files before and after compaction, and its bytes against the Kafka log bytes of the same events.

    .venv/bin/python -m bench.router.run [--events 500000] [--rates 3000,30000] [--seconds 90] [--peers b,d,e]
        [--warm-ups 3]

Prints the numbers and a table against the targets, writes
bench/out/router-<topic>-<encoding>-<producer compression>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pyarrow.parquet as pq
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from bench.router.peers import (
    TRIGGER,
    ConnectPeer,
    Peer,
    PlainPeer,
    RouterPeer,
    SparkSide,
    committed_rows,
    wait_for_rows,
)
from bench.stack import add_workload, bench_parser
from bergstream.catalog import CatalogConfig
from bergstream.kafka_topics import ensure_topic
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local import LocalStack, StackConfig
from bergstream.local.processes import free_ports
from bergstream.router.maintain import maintain
from bergstream.schemas.archive import INGESTION_TS, METADATA, ArchiveLayout
from bergstream.schemas.event_schema import load_event_schema
from bergstream.spark import build_spark_session

OUT = Path(__file__).parent.parent / "out"
PARTITIONS = 4
PEERS = ("b", "u", "d", "e")
DEFAULT_PEERS = ("b", "d", "e")
AVRO_CONNECT = (
    "Avro values need Confluent's AvroConverter (the schema registry's wire format), not on Maven Central"
)
# Events/s that one producer process keeps up on this machine; faster steady runs use several.
PRODUCER_RATE = 15_000
KAFKA_GROUP_DELAY_MS = 3000
# Freshness may exceed the trigger by this much: the commit itself and the wait for the next trigger.
FRESHNESS_SLACK_S = 1.5


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


def freshness(
    catalog: CatalogConfig, table_name: str, after_ms: int, stamp: tuple[str, ...] = (METADATA, INGESTION_TS)
) -> list[float]:
    """Seconds from each record's Kafka timestamp (the column at `stamp`) to the commit of the snapshot
    that added it."""
    table = catalog.load().load_table(f"archive.{table_name}")
    committed = {s.snapshot_id: s.timestamp_ms for s in table.snapshots()}
    delays = []
    for entry in table.inspect.entries().to_pylist():
        # Each live file once: ADDED, or EXISTING where a merge append rewrote its manifest (Iceberg's Kafka
        # Connect sink merges them); either keeps the id of the snapshot that added the file.
        if entry["status"] == 2:
            continue
        commit_ms = committed.get(entry["snapshot_id"])
        if commit_ms is None or commit_ms < after_ms:
            continue
        # Through the table's FileIO: the warehouse may be a folder or a bucket.
        with table.io.new_input(entry["data_file"]["file_path"]).open() as stream:
            stamps = pq.read_table(stream, columns=[stamp[0]]).column(0).combine_chunks()
        for name in stamp[1:]:
            stamps = stamps.field(name)
        for kafka_time in stamps.to_pylist():
            delays.append(commit_ms / 1000 - kafka_time.replace(tzinfo=UTC).timestamp())
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
    parser = bench_parser(__doc__)
    add_workload(parser, events=500_000)
    parser.add_argument(
        "--rates",
        type=rates_list,
        default=[3000.0, 30000.0],
        help="events/s of the freshness runs, comma separated",
    )
    parser.add_argument("--seconds", type=float, default=90, help="length of each freshness run")
    parser.add_argument(
        "--peers",
        type=peers_list,
        default=list(DEFAULT_PEERS),
        help="of b (router), u (router reading uncommitted records), d (plain job), e (Kafka Connect)",
    )
    parser.add_argument("--max-offsets-per-trigger", type=int, default=250_000)
    parser.add_argument(
        "--warm-ups", type=int, default=3, help="drains of the backlog by each writer before the measured one"
    )
    parser.add_argument("--connect-tasks", type=int, default=PARTITIONS, help="tasks.max of the sink (e)")
    parser.add_argument(
        "--producer-compression",
        default="lz4",
        choices=("none", "lz4", "zstd", "snappy", "gzip"),
        help="compression.type of the producer: what the Kafka log holds",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("bergstream.router").setLevel(logging.WARNING)
    OUT.mkdir(parents=True, exist_ok=True)
    producer_config = {"compression.type": args.producer_compression}
    home = Path(tempfile.mkdtemp(prefix="bergstream-bench-"))
    kafka_port, controller_port = free_ports(2)
    # The brokers wait for a new group's members as production brokers do (Kafka's default): the Kafka
    # Connect sink's tasks start together and join one assignment, not a rebalance each.
    stack = LocalStack(
        StackConfig(
            data_dir=home,
            kafka_port=kafka_port,
            controller_port=controller_port,
            group_initial_rebalance_delay_ms=KAFKA_GROUP_DELAY_MS,
        )
    )
    status = stack.up()
    bootstrap = status.bootstrap_servers
    results: dict[str, Any] = {
        "machine": machine(),
        "events": args.events,
        "date": datetime.now(UTC).isoformat(),
        "load_average_before": os.getloadavg(),
        "topic": args.topic,
        "encoding": args.encoding,
        "producer_compression": args.producer_compression,
        "trigger": TRIGGER,
        "peers": {},
    }
    topic = args.topic
    connect: ConnectPeer | None = None
    try:
        report = produce(
            ProduceRequest(
                topic=topic,
                count=args.events,
                partitions=PARTITIONS,
                late_fraction=0.05,
                seed=1,
                encoding=args.encoding,
            ),
            bootstrap,
            producer_config=producer_config,
            show_progress=False,
        )
        megabytes = report.value_bytes / 1e6
        print(f"produced {report.sent:,} events, {megabytes:.1f} MB of {args.encoding} values")

        elapsed, _ = plain_consumer(bootstrap, topic, args.events)
        results["c_plain_consumer"] = throughput(args.events, elapsed, megabytes)
        print(f"(c) confluent-kafka: {args.events / elapsed:,.0f} events/s")

        catalog = stack.config.catalog
        spark = build_spark_session(catalog, app_name="bench-router")
        try:
            # Every figure is measured warm: each runs once on the same events beforehand, so that none
            # pays for the JVM compiling its code paths.
            spark_noop(spark, bootstrap, topic, home / "noop-warmup", args.max_offsets_per_trigger)
            elapsed = spark_noop(spark, bootstrap, topic, home / "noop", args.max_offsets_per_trigger)
            results["a_spark_noop"] = throughput(args.events, elapsed, megabytes)
            print(f"(a) Spark noop: {args.events / elapsed:,.0f} events/s")
            # (a2) the same, decoding every value into the event's type: the least that
            # any Spark job reading these events does, before it writes anything.
            event_schema = load_event_schema(topic)
            event_type = ArchiveLayout(event_schema, topic).event_type

            def decode(records: Any) -> Any:
                if args.encoding == "avro":
                    return records.select(from_avro(F.col("value"), event_schema.avro_json).alias("event"))
                return records.select(F.from_json(F.col("value").cast("string"), event_type).alias("event"))

            spark_noop(spark, bootstrap, topic, home / "decode-warmup", args.max_offsets_per_trigger, decode)
            elapsed = spark_noop(
                spark, bootstrap, topic, home / "decode", args.max_offsets_per_trigger, decode
            )
            results["a2_spark_decode"] = throughput(args.events, elapsed, megabytes)
            print(f"(a2) Spark decode: {args.events / elapsed:,.0f} events/s")

            side = SparkSide(
                spark, catalog, bootstrap, topic, args.encoding, home, args.max_offsets_per_trigger
            )
            peers: list[Peer] = []
            for key in args.peers:
                if key == "b":
                    peers.append(RouterPeer(side))
                elif key == "u":
                    label = "(u) router, read_uncommitted"
                    peers.append(RouterPeer(side, key="u", label=label, isolation_level="read_uncommitted"))
                elif key == "d":
                    peers.append(PlainPeer(side))
                elif args.encoding == "avro":
                    results["peers"]["e"] = {
                        "label": "(e) Iceberg Kafka Connect sink",
                        "not_run": AVRO_CONNECT,
                    }
                    print(f"(e) not run: {AVRO_CONNECT}")
                else:
                    connect = ConnectPeer(side, tasks=args.connect_tasks)
                    peers.append(connect)

            # Every peer warms up before any is measured: those sharing this process's JVM (b, u, d) are
            # measured on a compiler that has seen all of them, not the later ones on a warmer one.
            for peer in peers:
                for warm_up in range(args.warm_ups):
                    peer.drain(topic, f"{topic}_{peer.key}_warmup{warm_up + 1}", args.events)
                    peer.stop()
            for peer in peers:
                results["peers"][peer.key] = {"label": peer.label}
                table = f"{topic}_{peer.key}"
                clock = peer.cpu()
                cpu_before, started = clock.seconds(), time.monotonic()
                peer.drain(topic, table, args.events)
                elapsed, cpu = time.monotonic() - started, clock.seconds() - cpu_before
                peer.stop()
                backlog = {
                    **throughput(args.events, elapsed, megabytes),
                    "cpu_seconds": cpu,
                    "cores_used": cpu / elapsed,
                    "events_per_cpu_second": args.events / cpu,
                    **table_storage(stack, table, args.events),
                }
                results["peers"][peer.key]["backlog"] = backlog
                print(
                    f"{peer.label}: {backlog['events_per_s']:,.0f} events/s, {cpu:.1f} CPU s "
                    f"({backlog['cores_used']:.2f} cores), "
                    f"{backlog['events_per_cpu_second']:,.0f} events per CPU s, "
                    f"{backlog['bytes_per_event']:.1f} bytes/event"
                )
            if "b" in results["peers"]:
                for base in ("a_spark_noop", "a2_spark_decode"):
                    results[f"b_over_{base[: base.index('_')]}"] = (
                        results["peers"]["b"]["backlog"]["events_per_s"] / results[base]["events_per_s"]
                    )

            for rate in args.rates:
                for peer in peers:
                    results["peers"][peer.key].setdefault("freshness", {})[f"{rate:.0f}"] = steady_run(
                        stack, peer, topic, rate, args, producer_config
                    )
            if connect is not None:
                connect.shut_down()
                connect = None

            if "b" in results["peers"]:
                # The archive's files before and after the compaction that `router maintain` runs, on the
                # router's table of the first steady run: two hours from now every hour written is closed,
                # grace included.
                fresh_table = steady_table(topic, "b", args.rates[0])
                before_compaction = files_per_hour(stack, fresh_table)
                maintain(
                    spark,
                    RouterPeer(side).config(steady_topic(topic, "b", args.rates[0]), fresh_table),
                    now=datetime.now(UTC) + timedelta(hours=2),
                )
                after_compaction = files_per_hour(stack, fresh_table)
                rows = committed_rows(catalog, fresh_table)
                results["archive_bytes_per_event_by_column"] = {
                    column: round(size / rows, 3)
                    for column, size in bytes_per_column(stack, fresh_table).items()
                }
                kafka_bytes = sum(
                    p.stat().st_size
                    for p in stack.config.broker.log_dir.glob(
                        f"{steady_topic(topic, 'b', args.rates[0])}-*/*.log"
                    )
                )
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
            if connect is not None:
                connect.shut_down()
            spark.stop()
    except BaseException:
        # The logs of the broker, Spark's checkpoints and the Kafka Connect worker's log stay for a look.
        print(f"kept {home} (logs: connect/connect-worker.log, kafka/)")
        stack.down()
        raise
    stack.down()
    shutil.rmtree(home, ignore_errors=True)
    results["load_average_after"] = os.getloadavg()
    results["targets"] = targets(results)
    (OUT / f"{run_name(results)}.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print(comparison(results))
    plot(results)


def rates_list(text: str) -> list[float]:
    rates = [float(part) for part in text.split(",") if part.strip()]
    if not rates or any(rate <= 0 for rate in rates):
        raise argparse.ArgumentTypeError(f"{text!r}: give events/s above 0, comma separated (3000,30000)")
    return rates


def peers_list(text: str) -> list[str]:
    peers = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(peers) - set(PEERS))
    if not peers or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: name peers among {', '.join(PEERS)}, comma separated")
    return [peer for peer in PEERS if peer in peers]


def throughput(events: int, seconds: float, megabytes: float) -> dict[str, float]:
    return {"seconds": seconds, "events_per_s": events / seconds, "mb_per_s": megabytes / seconds}


def table_storage(stack: LocalStack, table: str, rows: int) -> dict[str, float]:
    per_hour = files_per_hour(stack, table)
    size = sum(sum(sizes) for sizes in per_hour.values())
    return {
        "bytes_per_event": size / rows,
        "files": sum(len(sizes) for sizes in per_hour.values()),
        "hours": len(per_hour),
    }


def steady_topic(topic: str, peer: str, rate: float) -> str:
    return f"{topic}-steady-{peer}-{rate:.0f}"


def steady_table(topic: str, peer: str, rate: float) -> str:
    return f"{topic}_steady_{peer}_{rate:.0f}"


def produce_steadily(
    topic: str,
    schema: str,
    rate: float,
    seconds: float,
    encoding: Literal["json", "avro"],
    bootstrap: str,
    producer_config: dict[str, str],
) -> tuple[int, float]:
    """Events at `rate` for `seconds` from producer processes of their own (at most PRODUCER_RATE each), so
    that producing takes no turns of this process, where the router's Python side runs. Records sent, and
    the seconds the slowest producer took."""
    producers = math.ceil(rate / PRODUCER_RATE)
    requests = [
        ProduceRequest(
            topic=topic,
            schema=schema,
            count=int(rate / producers * seconds),
            rate=rate / producers,
            partitions=PARTITIONS,
            seed=2 + index,
            encoding=encoding,
        )
        for index in range(producers)
    ]
    with ProcessPoolExecutor(producers, mp_context=multiprocessing.get_context("spawn")) as pool:
        reports = list(
            pool.map(
                produce, requests, [bootstrap] * producers, [producer_config] * producers, [False] * producers
            )
        )
    return sum(report.sent for report in reports), max(report.seconds for report in reports)


def steady_run(
    stack: LocalStack,
    peer: Peer,
    topic: str,
    rate: float,
    args: argparse.Namespace,
    producer_config: dict[str, str],
) -> dict[str, Any]:
    """The peer on its trigger, on a topic of its own, while events arrive at `rate` for `args.seconds`."""
    steady = steady_topic(topic, peer.key, rate)
    table = steady_table(topic, peer.key, rate)
    bootstrap = stack.config.bootstrap_servers
    ensure_topic({"bootstrap.servers": bootstrap}, steady, PARTITIONS)
    peer.start(steady, table)
    started_ms = int(time.time() * 1000)
    try:
        sent, produced_s = produce_steadily(
            steady, topic, rate, args.seconds, args.encoding, bootstrap, producer_config
        )
        produced = time.monotonic()
        wait_for_rows(stack.config.catalog, table, sent, timeout=max(60.0, args.seconds), what=peer.label)
        tail = time.monotonic() - produced
    finally:
        peer.stop()
    delays = freshness(stack.config.catalog, table, started_ms, peer.stamp)
    storage = table_storage(stack, table, sent)
    result = {
        "p50": percentile(delays, 50),
        "p99": percentile(delays, 99),
        "max": max(delays),
        "records": len(delays),
        "produced_rate": sent / produced_s,
        "seconds_to_commit_the_last": tail,
        "files": storage["files"],
        "files_per_hour": storage["files"] * 3600 / produced_s,
        "bytes_per_event": storage["bytes_per_event"],
    }
    print(
        f"{peer.label} at {rate:,.0f} events/s (produced {result['produced_rate']:,.0f}/s): freshness p50 "
        f"{result['p50']:.2f} s, p99 {result['p99']:.2f} s, {result['files_per_hour']:,.0f} files per hour"
    )
    return result


def run_name(results: dict[str, Any]) -> str:
    return f"router-{results['topic']}-{results['encoding']}-{results['producer_compression']}"


def _backlog(results: dict[str, Any], peer: str, measure: str) -> float | None:
    backlog = results["peers"].get(peer, {}).get("backlog")
    return None if backlog is None else float(backlog[measure])


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or denominator is None else numerator / denominator


def targets(results: dict[str, Any]) -> dict[str, Any]:
    """The router against its peers, as the targets state them."""
    trigger_s = float(results["trigger"].split()[0])
    found: dict[str, Any] = {
        "router_over_plain_events_per_s": {
            "value": _ratio(_backlog(results, "b", "events_per_s"), _backlog(results, "d", "events_per_s")),
            "target": ">= 1.0",
        },
        "router_over_connect_events_per_cpu_second": {
            "value": _ratio(
                _backlog(results, "b", "events_per_cpu_second"),
                _backlog(results, "e", "events_per_cpu_second"),
            ),
            "target": ">= 2",
        },
        "router_over_plain_bytes_per_event": {
            "value": _ratio(
                _backlog(results, "b", "bytes_per_event"), _backlog(results, "d", "bytes_per_event")
            ),
            "target": "<= 1.0",
        },
    }
    for rate, fresh in results["peers"].get("b", {}).get("freshness", {}).items():
        found[f"router_freshness_p99_at_{rate}"] = {
            "value": fresh["p99"],
            "target": f"<= {trigger_s + FRESHNESS_SLACK_S:.1f} s",
        }
    for measure in found.values():
        value, target = measure["value"], measure["target"]
        if value is None:
            measure["met"] = None
            continue
        bound = float(target.split()[1])
        measure["met"] = value >= bound if target.startswith(">=") else value <= bound
    return found


def comparison(results: dict[str, Any]) -> str:
    """The peers side by side, then the targets: a table for the terminal."""
    keys = [key for key in PEERS if key in results["peers"]]
    columns = [results["peers"][key]["label"] for key in keys]

    def cell(key: str, path: tuple[str, ...], form: str) -> str:
        node: Any = results["peers"][key]
        if "not_run" in node:
            return "not run"
        for step in path:
            node = node.get(step) if isinstance(node, dict) else None
            if node is None:
                return "-"
        return form.format(node)

    rows: list[tuple[str, tuple[str, ...], str]] = [
        ("events/s, backlog", ("backlog", "events_per_s"), "{:,.0f}"),
        ("CPU cores used", ("backlog", "cores_used"), "{:.2f}"),
        ("events per CPU second", ("backlog", "events_per_cpu_second"), "{:,.0f}"),
        ("bytes per event (backlog table)", ("backlog", "bytes_per_event"), "{:.1f}"),
        ("files (backlog table)", ("backlog", "files"), "{}"),
    ]
    rates = sorted({rate for key in keys for rate in results["peers"][key].get("freshness", {})}, key=float)
    for rate in rates:
        per_s = f"{float(rate):,.0f}/s"
        rows += [
            (f"freshness p50 at {per_s}", ("freshness", rate, "p50"), "{:.2f} s"),
            (f"freshness p99 at {per_s}", ("freshness", rate, "p99"), "{:.2f} s"),
            (f"files per hour at {per_s}", ("freshness", rate, "files_per_hour"), "{:,.0f}"),
            (f"produced at {per_s}", ("freshness", rate, "produced_rate"), "{:,.0f}/s"),
        ]
    width = max(len(label) for label, _, _ in rows) + 2
    lines = ["".ljust(width) + "".join(column.ljust(34) for column in columns)]
    for label, path, form in rows:
        lines.append(label.ljust(width) + "".join(cell(key, path, form).ljust(34) for key in keys))
    for name in ("a_spark_noop", "a2_spark_decode", "c_plain_consumer"):
        if name in results:
            lines.append(f"{name}: {results[name]['events_per_s']:,.0f} events/s (context)")
    for name, measure in results["targets"].items():
        value = "-" if measure["value"] is None else f"{measure['value']:.2f}"
        verdict = {True: "met", False: "NOT met", None: "not measured"}[measure["met"]]
        lines.append(f"{name}: {value} (target {measure['target']}): {verdict}")
    return "\n".join(lines)


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (throughput_axes, per_core, fresh) = plt.subplots(1, 3, figsize=(16, 4.5))
    names = ["(a) Spark noop", "(a2) decode", "(c) confluent-kafka"]
    rates = [results[k]["events_per_s"] for k in ("a_spark_noop", "a2_spark_decode", "c_plain_consumer")]
    colours = ["#888", "#aaa", "#47a"]
    peers = [(key, results["peers"][key]) for key in PEERS if "backlog" in results["peers"].get(key, {})]
    peer_colours = {"b": "#2a7", "u": "#7c5", "d": "#d83", "e": "#a4c"}
    for key, peer in peers:
        names.append(peer["label"].replace(" Kafka Connect sink", "\nKafka Connect"))
        rates.append(peer["backlog"]["events_per_s"])
        colours.append(peer_colours[key])
    throughput_axes.bar(names, rates, color=colours)
    throughput_axes.tick_params(axis="x", labelsize=7, rotation=20)
    throughput_axes.set_ylabel("events/s")
    throughput_axes.set_title(f"Backlog of {results['events']:,} events ({results['machine']})", fontsize=8)
    per_core.bar(
        [peer["label"] for _, peer in peers],
        [peer["backlog"]["events_per_cpu_second"] for _, peer in peers],
        color=[peer_colours[key] for key, _ in peers],
    )
    per_core.tick_params(axis="x", labelsize=7, rotation=20)
    per_core.set_ylabel("events per CPU second (broker excluded)")
    per_core.set_title("Events per CPU core actually used", fontsize=8)
    labels, p50s, p99s = [], [], []
    for _key, peer in peers:
        for rate, measured in sorted(peer.get("freshness", {}).items(), key=lambda item: float(item[0])):
            labels.append(f"{peer['label'].split()[0]} {float(rate) / 1000:g}k/s")
            p50s.append(measured["p50"])
            p99s.append(measured["p99"])
    positions = range(len(labels))
    fresh.bar([x - 0.2 for x in positions], p50s, width=0.4, label="p50", color="#7bc")
    fresh.bar([x + 0.2 for x in positions], p99s, width=0.4, label="p99", color="#357")
    trigger_s = float(results["trigger"].split()[0])
    fresh.axhline(trigger_s + FRESHNESS_SLACK_S, color="#c33", linestyle="--", label="target p99")
    fresh.set_xticks(list(positions), labels, fontsize=7, rotation=20)
    fresh.set_ylabel("seconds, Kafka timestamp to committed")
    fresh.set_title(f"Freshness on a {results['trigger']} trigger / commit interval", fontsize=8)
    fresh.legend(fontsize=7)
    figure.tight_layout()
    path = OUT / f"{run_name(results)}.png"
    figure.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
