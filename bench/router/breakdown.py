"""bench/router/breakdown: where the router's CPU goes per record at full speed, against the plain job.

One Spark session, one backlog: the router (b) and the plain Spark job (d, plain.py) each drain it into
a table of their own, alternately, --warm-ups times and then --repeat measured times (the best is kept):
events/s and CPU per event of the bench's Python and its Spark JVM (from /proc). Then, with --jfr, one
more drain of each in a Flight Recorder recording of its own; its execution samples are sorted by stage
(bench/router/profile.py) and turned into microseconds of CPU per event: the share of each stage times the
JVM's measured CPU. The JVM then records from its start (all runs pay for that alike).

Shapes of the router's table to compare, on the same run (--shapes, comma separated):
  archive         the router as it is
  unordered       the archive table without its local sort order (WRITE UNORDERED)
  page-v2         Parquet's version 2 data pages and encodings (delta-encoded integers and strings)
  nodict          version 1 pages, no dictionary tried for the columns whose values are all distinct
  nodict-offset   version 1 pages, no dictionary for the Kafka offset alone
  nodict-key      version 1 pages, no dictionary for the Kafka key either
  page-v2-nodict  version 2 pages, and no dictionary for those columns
  unordered-v2    no local sort order (Kafka order) and version 2 pages
Each writer's table is measured too: bytes per event.

    .venv/bin/python -m bench.router.breakdown [--events 500000] [--warm-ups 3] [--repeat 2]
        [--shapes archive,unordered] [--jfr DIR]

Writes bench/out/breakdown-<topic>.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.router.batches import flight_recorder
from bench.router.cpu import CpuClock
from bench.router.peers import PlainPeer, RouterPeer, SparkSide, committed_rows
from bench.router.profile import STAGES, frames, samples, stage
from bench.router.run import machine, table_storage
from bench.stack import add_workload, bench_parser, throwaway_stack
from bergstream.errors import BergstreamError
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local import LocalStack
from bergstream.router.table import ensure_tables
from bergstream.schemas.archive import ArchiveLayout
from bergstream.schemas.event_schema import load_event_schema
from bergstream.spark import build_spark_session

OUT = Path(__file__).parent.parent / "out"
PARTITIONS = 4
PAGE_V2 = {"write.parquet.page-version": "v2"}
# Columns of the archive whose values are (nearly) all distinct: a dictionary is tried, then abandoned.
DISTINCT_COLUMNS = ("__metadata__.offset", "playback_id")
NO_DICTIONARY = {
    f"write.parquet.dict-encoding-enabled.column.{column}": "false" for column in DISTINCT_COLUMNS
}
SHAPES: dict[str, dict[str, str]] = {
    "archive": {},
    "unordered": {},
    "page-v2": PAGE_V2,
    "nodict": NO_DICTIONARY,
    "nodict-offset": {"write.parquet.dict-encoding-enabled.column.__metadata__.offset": "false"},
    "nodict-key": {"write.parquet.dict-encoding-enabled.column.__metadata__.key": "false"},
    "page-v2-nodict": {**PAGE_V2, **NO_DICTIONARY},
    "unordered-v2": PAGE_V2,
}


class Writer:
    """One way of draining the backlog into a table: a peer, and for the router the shape of its table."""

    def __init__(self, name: str, side: SparkSide) -> None:
        self.name = name
        self.table = name.replace("-", "_")
        self.side = side
        self.peer = PlainPeer(side) if name == "plain" else RouterPeer(side)

    def drain(self, topic: str, table: str, events: int) -> None:
        if self.name != "plain":
            side = self.side
            layout = ArchiveLayout(load_event_schema(side.schema_name), table)
            ensure_tables(side.spark, side.catalog, layout, properties=SHAPES[self.name])
            if self.name.startswith("unordered"):
                side.spark.sql(f"ALTER TABLE {side.catalog.table_identifier(table)} WRITE UNORDERED")
        self.peer.drain(topic, table, events)
        rows = committed_rows(self.side.catalog, table)
        if rows != events:
            raise BergstreamError(f"{self.name}: {table} holds {rows:,} rows, not {events:,}")


def measure(
    stack: LocalStack, writer: Writer, topic: str, table: str, events: int, jvm: int, jfr: Path | None
) -> dict[str, Any]:
    if jfr is not None:
        flight_recorder(jvm, "JFR.start", "settings=profile")
    clock, jvm_clock = CpuClock.spark_in_process(), CpuClock((jvm,))
    cpu, jvm_cpu, started = clock.seconds(), jvm_clock.seconds(), time.monotonic()
    writer.drain(topic, table, events)
    elapsed, spent = time.monotonic() - started, clock.seconds() - cpu
    jvm_spent = jvm_clock.seconds() - jvm_cpu
    if jfr is not None:
        flight_recorder(jvm, "JFR.stop", f"filename={jfr}")
    return {
        "seconds": round(elapsed, 2),
        "events_per_s": round(events / elapsed),
        "cpu_seconds": round(spent, 2),
        "cpu_us_per_event": round(1e6 * spent / events, 2),
        "jvm_cpu_us_per_event": round(1e6 * jvm_spent / events, 2),
        "bytes_per_event": round(table_storage(stack, table, events)["bytes_per_event"], 2),
    }


def stages_per_event(recording: Path, cpu_us_per_event: float) -> dict[str, float]:
    """Microseconds of CPU per event by stage: each stage's share of the Java samples, times the JVM's
    CPU (which includes its JIT compiler and garbage collector, never sampled: they are spread over all)."""
    counted: Counter[str] = Counter()
    for event in samples(recording):
        counted[stage(frames(event))] += 1
    total = max(sum(counted.values()), 1)
    order = [name for name, _ in STAGES] + ["other"]
    return {name: round(cpu_us_per_event * counted[name] / total, 2) for name in order if counted[name]}


def shapes_list(text: str) -> list[str]:
    shapes = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(shapes) - SHAPES.keys())
    if not shapes or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: name shapes among {', '.join(SHAPES)}, comma separated")
    return shapes


def main() -> None:
    parser = bench_parser(__doc__)
    add_workload(parser, events=500_000)
    parser.add_argument("--warm-ups", type=int, default=3, help="drains of each before the measured ones")
    parser.add_argument("--repeat", type=int, default=2, help="measured drains of each; the best is kept")
    parser.add_argument("--shapes", type=shapes_list, default=["archive"], help=", ".join(SHAPES))
    parser.add_argument("--max-offsets-per-trigger", type=int, default=250_000)
    parser.add_argument("--jfr", type=Path, default=None, help="profile one more drain of each, files here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    OUT.mkdir(parents=True, exist_ok=True)
    with throwaway_stack("breakdown") as (stack, status, home):
        results: dict[str, Any] = {
            "machine": machine(),
            "date": datetime.now(UTC).isoformat(),
            "events": args.events,
            "load_before": os.getloadavg(),
            "writers": {},
        }
        produce(
            ProduceRequest(topic=args.topic, count=args.events, partitions=PARTITIONS, late_fraction=0.05,
                           seed=1, encoding=args.encoding),
            status.bootstrap_servers, producer_config={"compression.type": "lz4"}, show_progress=False,
        )  # fmt: skip
        # With --jfr the JVM records from its start: a recording started later makes the JIT compile
        # everything again, and the profile would be of code still warming up.
        conf = (
            {"spark.driver.extraJavaOptions": "-XX:StartFlightRecording=settings=profile,maxage=2m"}
            if args.jfr is not None
            else {}
        )
        spark = build_spark_session(stack.config.catalog, app_name="bench-breakdown", conf=conf)
        jvm = CpuClock.spark_in_process().pids[1]
        side = SparkSide(
            spark, stack.config.catalog, status.bootstrap_servers, args.topic, args.encoding, home,
            args.max_offsets_per_trigger,
        )  # fmt: skip
        writers = [Writer("plain", side), *(Writer(shape, side) for shape in args.shapes)]
        try:
            runs = [
                *(f"warmup{n + 1}" for n in range(args.warm_ups)),
                *(f"run{n + 1}" for n in range(args.repeat)),
            ]
            for run in runs:
                for writer in writers:
                    figures = measure(
                        stack, writer, args.topic, f"{writer.table}_{run}", args.events, jvm, None
                    )
                    print(f"{writer.name} {run}: {json.dumps(figures)}", flush=True)
                    if run.startswith("run"):
                        best = results["writers"].get(writer.name)
                        if best is None or figures["cpu_us_per_event"] < best["cpu_us_per_event"]:
                            results["writers"][writer.name] = figures
            if args.jfr is not None:
                args.jfr.mkdir(parents=True, exist_ok=True)
                for writer in writers:
                    recording = args.jfr / f"breakdown-{writer.name}.jfr"
                    figures = measure(
                        stack, writer, args.topic, f"{writer.table}_profiled", args.events, jvm, recording
                    )
                    figures["us_per_event_by_stage"] = stages_per_event(
                        recording, figures["jvm_cpu_us_per_event"]
                    )
                    results["writers"][writer.name]["profiled"] = figures
                    print(f"{writer.name} profiled ({recording}): {json.dumps(figures)}", flush=True)
        finally:
            spark.stop()
    results["load_after"] = os.getloadavg()
    plain = results["writers"]["plain"]
    for figures in results["writers"].values():
        figures["over_plain_events_per_s"] = round(figures["events_per_s"] / plain["events_per_s"], 2)
        figures["over_plain_cpu_per_event"] = round(
            figures["cpu_us_per_event"] / plain["cpu_us_per_event"], 2
        )
    path = OUT / f"breakdown-{args.topic}.json"
    path.write_text(json.dumps(results, indent=2))
    print(table(results))
    print(f"wrote {path}")


def table(results: dict[str, Any]) -> str:
    writers = results["writers"]
    names = list(writers)
    lines = ["".ljust(40) + "".join(name.rjust(14) for name in names)]
    for label, key in (("events/s", "events_per_s"), ("CPU us per event", "cpu_us_per_event"),
                       ("bytes per event", "bytes_per_event"),
                       ("events/s against plain", "over_plain_events_per_s"),
                       ("CPU per event against plain", "over_plain_cpu_per_event")):  # fmt: skip
        lines.append(label.ljust(40) + "".join(f"{writers[name][key]:,}".rjust(14) for name in names))
    stages = [name for name, _ in STAGES] + ["other"]
    if all("profiled" in writers[name] for name in names):
        lines.append("CPU us per event by stage (profiled run):")
        for stage_name in stages:
            values = [writers[name]["profiled"]["us_per_event_by_stage"].get(stage_name) for name in names]
            if any(values):
                lines.append(
                    f"  {stage_name}".ljust(40) + "".join(f"{value or 0:.2f}".rjust(14) for value in values)
                )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
