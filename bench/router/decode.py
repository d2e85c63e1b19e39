"""bench/router/decode: the CPU of the router's per-record expression, apart from reading Kafka and writing.

The topic's records are read from Kafka once and cached in Spark (`local[*]`, 2 tasks as the router writes
them); then, in rounds, each part below runs over them into Spark's `noop` sink, and the JVM's CPU (from
/proc) is divided by the records. The first round warms up; the best of the later ones is kept.

  plain     from_json of the value, the event's fields and the Kafka timestamp (the plain Spark job)
  parse     the router's parse: the strict decoding, its status and the checks that give the error
  metadata  the `__metadata__` struct alone
  router    the whole expression of an archive row: parse, stamp, count (the observation), keep the valid rows

    .venv/bin/python -m bench.router.decode [--events 500000] [--rounds 4]

Writes bench/out/decode-<topic>.json and a bar chart, decode-<topic>.png.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from bench.router.cpu import CpuClock
from bench.router.run import machine
from bench.stack import add_workload, bench_parser, throwaway_stack
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.batch_counts import observed_columns
from bergstream.router.transform import RecordSplitter
from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.event_schema import load_event_schema
from bergstream.schemas.stamp import metadata
from bergstream.spark import build_spark_session

OUT = Path(__file__).parent.parent / "out"
PARTITIONS = 4
WRITE_TASKS = 2


def main() -> None:
    parser = bench_parser(__doc__)
    add_workload(parser, events=500_000)
    parser.add_argument("--rounds", type=int, default=4, help="rounds of all parts; the first warms up")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with throwaway_stack("decode") as (stack, status, _home):
        produce(
            ProduceRequest(topic=args.topic, count=args.events, partitions=PARTITIONS, late_fraction=0.05,
                           seed=1, encoding=args.encoding),
            status.bootstrap_servers, producer_config={"compression.type": "lz4"}, show_progress=False,
        )  # fmt: skip
        spark = build_spark_session(stack.config.catalog, app_name="bench-decode")
        try:
            clock = CpuClock((CpuClock.spark_in_process().pids[1],))
            records = (
                spark.read.format("kafka")
                .option("kafka.bootstrap.servers", status.bootstrap_servers)
                .option("subscribe", args.topic)
                .option("includeHeaders", "true")
                .load()
                .coalesce(WRITE_TASKS)
                .cache()
            )
            rows = records.count()
            layout = ArchiveLayout(load_event_schema(args.topic), args.topic)
            splitter = RecordSplitter(layout, args.encoding, "local")
            counting = observed_columns(spark)
            event_type = layout.event_type

            def plain(df: DataFrame) -> DataFrame:
                decoded = (
                    F.from_json(F.col("value").cast("string"), event_type)
                    if args.encoding == "json"
                    else F.col("value")
                )
                return df.select(decoded.alias("e"), "timestamp").select("e.*", "timestamp")

            def router(df: DataFrame) -> DataFrame:
                observation = Observation(f"bench-decode-{time.monotonic_ns()}")
                return splitter.archive_rows(splitter.stamp(df), observation, counting)

            parts: dict[str, Callable[[DataFrame], DataFrame]] = {
                "plain": plain,
                "parse": lambda df: splitter.parser.parse(df).select("event", "error"),
                "metadata": lambda df: df.select(metadata("local")),
                "router": router,
            }
            if args.encoding != "json":
                del parts["plain"]
            best: dict[str, float] = {}
            for number in range(args.rounds):
                for name, part in parts.items():
                    cpu = clock.seconds()
                    part(records).write.format("noop").mode("overwrite").save()
                    us = 1e6 * (clock.seconds() - cpu) / rows
                    print(f"round {number + 1} {name}: {us:.2f} us of JVM CPU per record", flush=True)
                    if number > 0:
                        best[name] = min(best.get(name, us), us)
        finally:
            spark.stop()
    results = {
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(),
        "records": rows,
        "us_per_record": {name: round(us, 2) for name, us in best.items()},
    }
    path = OUT / f"decode-{args.topic}.json"
    path.write_text(json.dumps(results, indent=2))
    plot(best, args.topic, OUT / f"decode-{args.topic}.png")
    for name, us in best.items():
        print(f"{name.ljust(10)} {us:6.2f} us of JVM CPU per record (best of rounds 2 to {args.rounds})")
    print(f"wrote {path}")


def plot(best: dict[str, float], topic: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.bar(list(best), list(best.values()))
    axes.set_ylabel("us of JVM CPU per record")
    axes.set_title(f"bench/router/decode: {topic}, the expression alone, into noop")
    figure.tight_layout()
    figure.savefig(path)


if __name__ == "__main__":
    main()
