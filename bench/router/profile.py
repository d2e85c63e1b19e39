"""Where a Spark JVM's time went, from a JDK Flight Recorder file: its execution samples by stage of the
router's work, by thread, and the hottest leaf frames.

    .venv/bin/python -m bench.router.profile bench/out/batches-5000.jfr [--top 25] [--thread NAME]
        [--inclusive]

`--thread` keeps the samples of threads whose name starts with NAME (the driver's micro-batches run in
"stream execution thread for <query>"); `--inclusive` also lists the methods found most often anywhere
on the stacks, which shows what a thread spends its time under.

A sample counts for the first stage, in the order below, that has a frame anywhere on its stack: a
Parquet page compressed inside a task counts as compression, not as the task.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections import Counter
from pathlib import Path

STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("parquet: compress", ("com.github.luben.zstd", "ZstdCompressor", "ZstandardCodec", "ZstdOutputStream")),
    ("parquet: encode", ("org.apache.parquet.", "org.apache.iceberg.parquet.")),
    ("sort", ("UnsafeExternalSorter", "UnsafeInMemorySorter", "SortExec", "UnsafeExternalRowSorter")),
    ("decode json", ("JacksonParser", "com.fasterxml.jackson", "JsonToStructs", "VariantBuilder")),
    ("decode avro", ("org.apache.avro", "AvroDeserializer", "AvroDataToCatalyst")),
    ("kafka read", ("org.apache.kafka", "KafkaDataConsumer", "KafkaBatchPartitionReader",
                    "KafkaRecordToRow")),
    ("count (observation)", ("CollectMetrics", "AggregatingAccumulator", "io.bergstream.router")),
    ("iceberg commit and metadata", ("org.apache.iceberg.",)),
    ("catalog (jdbc)", ("org.sqlite", "org.postgresql", "java.sql")),
    ("stamp and project (generated code)", ("GeneratedClass", "GeneratedIterator")),
    ("spark planning and analysis", ("org.apache.spark.sql.catalyst",
                                     "org.apache.spark.sql.execution.QueryExecution")),
    ("spark scheduling and tasks", ("org.apache.spark.scheduler", "org.apache.spark.executor",
                                    "org.apache.spark.serializer", "org.apache.spark.rpc")),
    ("py4j", ("py4j.",)),
    ("spark, other", ("org.apache.spark",)),
)  # fmt: skip


def samples(path: Path) -> list[dict]:
    printed = subprocess.run(
        ["jfr", "print", "--json", "--stack-depth", "200", "--events", "jdk.ExecutionSample", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return json.loads(printed)["recording"]["events"]


def frames(event: dict) -> list[str]:
    """A sample's stack, leaf first, as `package.Class.method`: JFR names classes with slashes."""
    return [
        f"{frame['method']['type']['name'].replace('/', '.')}.{frame['method']['name']}"
        for frame in event["values"]["stackTrace"]["frames"]
    ]


def stage(frames: list[str]) -> str:
    for name, markers in STAGES:
        if any(marker in frame for frame in frames for marker in markers):
            return name
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("recording", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--thread", default=None, help="only threads whose name starts with this")
    parser.add_argument("--inclusive", action="store_true", help="also the methods most often on the stack")
    args = parser.parse_args()
    stages: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    events = []
    for event in samples(args.recording):
        thread = (event["values"].get("sampledThread") or {}).get("javaName") or "?"
        if args.thread is None or thread.startswith(args.thread):
            events.append((thread, event))
    for thread, event in events:
        stack = frames(event)
        threads["Executor task launch worker" if thread.startswith("Executor task") else thread[:50]] += 1
        stages[stage(stack)] += 1
        if stack:
            leaves[stack[0][:110]] += 1
        inclusive.update({frame[:110] for frame in stack})
    total = max(len(events), 1)
    print(f"{len(events)} samples in {args.recording}")
    views = [("by stage", stages, len(STAGES) + 1), ("by thread", threads, 12),
             ("hottest leaf frames", leaves, args.top)]  # fmt: skip
    if args.inclusive:
        views.append(("methods most often on the stack", inclusive, args.top))
    for title, counter, top in views:
        print(f"{title}:")
        for name, count in counter.most_common(top):
            print(f"  {count:6d} {100 * count / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
