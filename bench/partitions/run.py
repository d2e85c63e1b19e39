"""bench/partitions: the router on topics of 1, 16, 128 and 512 partitions, and what counting costs.

For each partition count, against the embedded stack, on the same number of events:
  - the router drains the topic's backlog (availableNow, --max-offsets records per batch): events/s, CPU
    per event (the bench's Python and its Spark JVM, from /proc), seconds per batch, files per batch;
  - the counting alone: the topic is read once, in as many tasks as the router reads it with (the
    application's default parallelism), stamped and cached, then written to Spark's noop sink without an
    observation, with the router's counts (totals and, per Kafka partition, count, first and
    last offset), and with the per-partition columns the router used before (three aggregates per
    partition, up to --columns-max partitions). The JVM's CPU per record of each, the best of --repeat.

    .venv/bin/python -m bench.partitions.run [--partitions 1 16 128 512] [--events 300000]

Prints the numbers, writes bench/out/partitions.json and .png.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from bench.router.batches import BatchDurations
from bench.router.cpu import CpuClock
from bench.router.run import machine
from bench.stack import bench_parser, throwaway_stack, topic_query
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.batch_counts import from_observation, observed_columns
from bergstream.router.config import RouterConfig
from bergstream.router.metrics import RouterMetrics
from bergstream.router.transform import RecordSplitter
from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.event_schema import load_event_schema
from bergstream.schemas.parse import ERROR
from bergstream.spark import build_spark_session

OUT = Path(__file__).parent.parent / "out"
SCHEMA = "playback"


def per_partition_columns(partitions: list[int]) -> list[Column]:
    """The counting the router did before: totals, then a count, a first and a last offset per partition,
    each a conditional aggregate evaluated for every record."""
    partition, offset = F.col("partition"), F.col("offset")
    columns = [
        F.count(F.lit(1)).alias("read"),
        F.count(F.when(F.col(ERROR).isNull(), 1)).alias("archived"),
        F.max("timestamp").alias("newest"),
        F.count(F.when(~partition.isin(partitions), 1)).alias("other_partitions"),
    ]
    for p in partitions:
        mine = partition == p
        columns += [
            F.count(F.when(mine, 1)).alias(f"read_{p}"),
            F.min(F.when(mine, offset)).alias(f"first_{p}"),
            F.max(F.when(mine, offset)).alias(f"last_{p}"),
        ]
    return columns


def counting_cost(
    spark: SparkSession, stamped: DataFrame, shapes: dict[str, list[Column] | None], repeat: int, jvm: int
) -> dict[str, float]:
    """JVM CPU seconds of writing the cached batch to noop under each observation, the best of `repeat`."""
    clock = CpuClock((jvm,))
    best: dict[str, float] = {}
    for name, columns in shapes.items():
        for attempt in range(repeat):
            observed = stamped
            observation = Observation(f"bench-{name}-{attempt}-{time.monotonic_ns()}")
            if columns is not None:
                observed = stamped.observe(observation, *columns)
            before = clock.seconds()
            observed.write.format("noop").mode("overwrite").save()
            if columns is not None:
                observation.get  # noqa: B018 - waits for the metrics
            best[name] = min(best.get(name, float("inf")), clock.seconds() - before)
    return best


def counting(
    spark: SparkSession, stamped: DataFrame, partitions: int, columns_max: int, repeat: int, jvm: int
) -> dict[str, Any]:
    """The JVM CPU per record that each way of counting adds to a noop write of the cached batch."""
    stamped = stamped.persist()
    try:
        count = stamped.count()
        shapes: dict[str, list[Column] | None] = {"none": None, "router": observed_columns(spark)}
        if partitions <= columns_max:
            shapes["per-partition columns"] = per_partition_columns(list(range(partitions)))
        check = Observation(f"bench-check-{partitions}")
        stamped.observe(check, *observed_columns(spark)).write.format("noop").mode("overwrite").save()
        counted = from_observation(check.get)
        if len(counted.partitions) != partitions or counted.read != count:
            raise AssertionError(f"counted {counted.read} records in {len(counted.partitions)} partitions")
        cost = counting_cost(spark, stamped, shapes, repeat, jvm)
    finally:
        stamped.unpersist()
    return {
        "counting_ns_per_record": {
            name: round(1e9 * (seconds - cost["none"]) / count, 1)
            for name, seconds in cost.items()
            if name != "none"
        },
        "noop_cpu_seconds": {name: round(seconds, 3) for name, seconds in cost.items()},
    }


def drain(spark: SparkSession, config: RouterConfig) -> dict[str, Any]:
    clock = CpuClock.spark_in_process()
    topic = config.settings.topic
    metrics = RouterMetrics(topic)
    durations = BatchDurations(metrics, topic)
    cpu, started = clock.seconds(), time.monotonic()
    totals = topic_query(spark, config, metrics).run(available_now=True)[topic]
    elapsed, spent = time.monotonic() - started, clock.seconds() - cpu
    return {
        "records": totals.read,
        "batches": totals.batches,
        "partitions_counted": len(totals.per_partition),
        "seconds": round(elapsed, 2),
        "events_per_second": round(totals.read / elapsed),
        "cpu_us_per_event": round(1e6 * spent / max(totals.read, 1), 1),
        "batch_seconds_p50": durations.percentile(50),
        "files_per_batch": round(totals.files / max(totals.batches, 1), 1),
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 16, 128, 512])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--max-offsets", type=int, default=100_000, help="records per router batch")
    parser.add_argument("--columns-max", type=int, default=128, help="the former counting up to this many")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--name", default="", help="appended to the output files' name")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    OUT.mkdir(parents=True, exist_ok=True)
    with throwaway_stack("partitions") as (stack, status, home):
        results: dict[str, Any] = {
            "date": datetime.now(UTC).isoformat(),
            "machine": machine(),
            "events": args.events,
            "load_before": os.getloadavg(),
            "runs": {},
        }
        conf = dict(setting.split("=", 1) for setting in args.conf)
        results["spark_conf"] = conf
        spark = build_spark_session(stack.config.catalog, app_name="bench-partitions", conf=conf)
        jvm = CpuClock.spark_in_process().pids[1]
        layout = ArchiveLayout(load_event_schema(SCHEMA), SCHEMA)
        splitter = RecordSplitter(layout, "json", cluster="bench", max_value_bytes=1 << 20)
        try:
            for number, partitions in enumerate([args.partitions[0], *args.partitions]):
                warm_up = number == 0
                topic = f"{SCHEMA}_p{partitions}"
                if warm_up or partitions != args.partitions[0]:
                    print(f"{topic}: producing {args.events:,} events", flush=True)
                    produce(
                        ProduceRequest(topic=topic, schema=SCHEMA, count=args.events, partitions=partitions,
                                       seed=partitions, bad_fraction=0.01),
                        status.bootstrap_servers, show_progress=False,
                    )  # fmt: skip
                table = f"{topic}_warmup" if warm_up else topic
                config = RouterConfig.flat(
                    topic=topic, schema=SCHEMA, encoding="json", table=table,
                    kafka={"kafka.bootstrap.servers": status.bootstrap_servers,
                           "startingOffsets": "earliest"},
                    checkpoint_location=str(home / "checkpoints" / table), catalog=stack.config.catalog,
                    max_offsets_per_trigger=args.max_offsets,
                )  # fmt: skip
                router = drain(spark, config)
                print(f"{partitions} partitions, router{' (warm-up)' * warm_up}: {json.dumps(router)}",
                      flush=True)  # fmt: skip
                if warm_up:
                    continue
                records = (
                    spark.read.format("kafka")
                    .option("kafka.bootstrap.servers", status.bootstrap_servers)
                    .option("subscribe", topic)
                    .option("includeHeaders", "true")
                    .load()
                )
                tasks = spark.sparkContext.defaultParallelism
                stamped = splitter.stamp(records.coalesce(tasks))
                cost = counting(spark, stamped, partitions, args.columns_max, args.repeat, jvm)
                print(f"{partitions} partitions, counting: {json.dumps(cost)}", flush=True)
                results["runs"][str(partitions)] = {"router": router, **cost}
        finally:
            spark.stop()
    results["load_after"] = os.getloadavg()
    path = OUT / f"partitions{args.name}.json"
    path.write_text(json.dumps(results, indent=2))
    plot(results, path.with_suffix(".png"))
    print(summary(results))
    print(f"wrote {path}")


def summary(results: dict[str, Any]) -> str:
    lines = [f"{'partitions':>10} {'events/s':>9} {'CPU us/ev':>9} {'files/batch':>11} "
             f"{'count ns/rec':>12} {'before ns/rec':>13}"]  # fmt: skip
    for partitions, run in results["runs"].items():
        router, counting = run["router"], run["counting_ns_per_record"]
        before = counting.get("per-partition columns")
        lines.append(
            f"{partitions:>10} {router['events_per_second']:>9,} {router['cpu_us_per_event']:>9} "
            f"{router['files_per_batch']:>11} {counting['router']:>12} "
            f"{'-' if before is None else before:>13}"
        )
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    partitions = [int(p) for p in runs]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(partitions, [runs[str(p)]["router"]["events_per_second"] for p in partitions], marker="o")
    left.set(xscale="log", xlabel="Kafka partitions", ylabel="events/s", title="router, draining a backlog")
    right.plot(partitions, [runs[str(p)]["counting_ns_per_record"]["router"] for p in partitions],
               marker="o", label="one aggregate (router)")  # fmt: skip
    before = [p for p in partitions if "per-partition columns" in runs[str(p)]["counting_ns_per_record"]]
    right.plot(before, [runs[str(p)]["counting_ns_per_record"]["per-partition columns"] for p in before],
               marker="x", label="three aggregates per partition (before)")  # fmt: skip
    right.set(xscale="log", yscale="log", xlabel="Kafka partitions", ylabel="JVM CPU ns per record",
              title="counting per partition")  # fmt: skip
    right.legend()
    figure.tight_layout()
    figure.savefig(path)


if __name__ == "__main__":
    main()
