"""bench/router/batches: what a micro-batch costs besides its records.

The router drains the same backlog in small batches (`--small`, 5,000 records: a quiet topic on a 1-second
trigger) and in large ones (`--large`, 250,000: full speed), for each of `--write-tasks` (comma separated,
`default` for the topic's default). It does so in rounds: --warm-ups rounds (3) of every shape in turn, then
a measured one, each drain into a table of its own, so that no shape runs on a JVM the others have warmed
more. For each it prints the seconds per batch, the CPU per event (the bench's Python and its Spark JVM,
from /proc), the Python process's own CPU, the JVM's CPU by thread (executor tasks, JIT compiler, GC, the
driver's threads) and how many classes Spark's code generator compiled during the run. Small batches should
cost no more than 2 x the CPU per event of large ones, and a 5,000-record batch well under a second.

    .venv/bin/python -m bench.router.batches [--events 200000] [--small 5000] [--large 250000]
        [--warm-ups 3] [--write-tasks default,1] [--jfr DIR]

Writes bench/out/batches-<topic>.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.router.cpu import CpuClock, command_name, cpu_ticks
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local import LocalStack, StackConfig
from bergstream.local.processes import free_ports
from bergstream.spark import build_spark_session
from router.app import Router
from router.config import RouterConfig
from router.metrics import RouterMetrics

OUT = Path(__file__).parent.parent / "out"
PARTITIONS = 4


def thread_ticks(pid: int) -> dict[str, int]:
    """CPU ticks of each thread of `pid`, keyed by thread id and name."""
    ticks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        ticks[f"{task.name} {command_name(stat)}"] = cpu_ticks(stat)
    return ticks


def by_kind(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """CPU seconds per kind of thread (digits in the names folded): what each kind spent in between."""
    spent: Counter[str] = Counter()
    for key, ticks in after.items():
        kind = re.sub(r"[0-9]+", "#", key.split(" ", 1)[1])
        spent[kind] += ticks - before.get(key, 0)
    tick = os.sysconf("SC_CLK_TCK")
    return {kind: round(ticks / tick, 2) for kind, ticks in spent.most_common(12) if ticks}


class BatchDurations:
    """Each batch's duration, as the router reports it to its `batch_duration_seconds` histogram."""

    def __init__(self, metrics: RouterMetrics, topic: str) -> None:
        self.seconds: list[float] = []
        histogram = metrics.batch_duration.labels(topic)
        report = histogram.observe

        def observe(seconds: float) -> None:
            self.seconds.append(seconds)
            report(seconds)

        histogram.observe = observe  # type: ignore[method-assign]

    def percentile(self, p: float) -> float | None:
        if not self.seconds:
            return None
        ordered = sorted(self.seconds)
        return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))], 3)


def compilations(spark: Any) -> int:
    codegen = getattr(spark._jvm.org.apache.spark.metrics.source, "CodegenMetrics$").__getattr__("MODULE$")
    return int(codegen.METRIC_COMPILATION_TIME().getCount())


def flight_recorder(jvm: int, command: str, *settings: str) -> None:
    """Start or stop a JDK Flight Recorder recording of the Spark JVM."""
    subprocess.run(["jcmd", str(jvm), command, "name=bench-batches", *settings], check=True,
                   capture_output=True)  # fmt: skip


def drain(spark: Any, config: RouterConfig, jvm: int, jfr: Path | None = None) -> dict[str, Any]:
    """Archive the topic with an availableNow trigger; what it cost. With `jfr`, the JVM's execution
    samples of the run are written there."""
    if jfr is not None:
        flight_recorder(jvm, "JFR.start", "settings=profile")
    clock = CpuClock.spark_in_process()
    threads, compiled, cpu = thread_ticks(jvm), compilations(spark), clock.seconds()
    python = sum(os.times()[:2])
    metrics = RouterMetrics(config.topic)
    durations = BatchDurations(metrics, config.topic)
    started = time.monotonic()
    router = Router(config, spark, metrics)
    totals = router.run(available_now=True)
    elapsed = time.monotonic() - started
    spent = clock.seconds() - cpu
    python = sum(os.times()[:2]) - python
    if jfr is not None:
        flight_recorder(jvm, "JFR.stop", f"filename={jfr}")
    # Spark's own account of each batch (the last 100): planning, offsets, the batch itself, the logs.
    progress = router._query.recentProgress if router._query is not None else []
    spark_durations = (
        {key: [p.durationMs.get(key, 0) for p in progress] for key in progress[0].durationMs}
        if progress
        else {}
    )
    return {
        "batches": totals.batches,
        "records": totals.read,
        "seconds": round(elapsed, 2),
        "batch_seconds_p50": durations.percentile(50),
        "batch_seconds_p90": durations.percentile(90),
        "cpu_seconds": round(spent, 2),
        "cpu_us_per_event": round(1e6 * spent / max(totals.read, 1), 1),
        "python_cpu_seconds": round(python, 2),
        "codegen_compilations": compilations(spark) - compiled,
        "jvm_cpu_by_thread": by_kind(threads, thread_ticks(jvm)),
        "spark_ms_p50": {key: sorted(values)[len(values) // 2] for key, values in spark_durations.items()},
    }


def write_tasks_list(text: str) -> list[int | None]:
    try:
        return [None if part == "default" else int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write tasks are numbers or default, comma separated"
        ) from None


def shape_name(size: int, tasks: int | None, compared: list[int | None]) -> str:
    """`5000`, or `5000_tasks1` when several write tasks are compared: names of tables and results."""
    return f"{size}" if len(compared) == 1 else f"{size}_tasks{tasks or 'default'}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--small", type=int, default=5_000, help="records per small batch")
    parser.add_argument("--large", type=int, default=250_000, help="records per large batch")
    parser.add_argument("--topic", default="playback", choices=("playback", "impression"))
    parser.add_argument("--encoding", default="json", choices=("json", "avro"))
    parser.add_argument(
        "--warm-ups",
        type=int,
        default=3,
        help="runs of each shape before the measured one: the JIT settles slowly",
    )
    parser.add_argument(
        "--write-tasks",
        type=write_tasks_list,
        default=[None],
        help="the topic's write_tasks, comma separated: numbers, or default",
    )
    parser.add_argument(
        "--jfr",
        type=Path,
        default=None,
        help="after the measured run, one more with the Flight Recorder on, written here (apart: "
        "starting a recording makes the JIT compile again)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    OUT.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="bergstream-bench-batches-"))
    kafka_port, controller_port = free_ports(2)
    stack = LocalStack(StackConfig(data_dir=home, kafka_port=kafka_port, controller_port=controller_port))
    status = stack.up()
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(),
        "events": args.events,
        "load_before": os.getloadavg(),
    }
    try:
        produce(
            ProduceRequest(topic=args.topic, count=args.events, partitions=PARTITIONS, late_fraction=0.05,
                           seed=1, encoding=args.encoding),
            status.bootstrap_servers, show_progress=False,
        )  # fmt: skip
        spark = build_spark_session(stack.config.catalog, app_name="bench-batches")
        jvm = CpuClock.spark_in_process().pids[1]
        try:
            shapes = [(size, tasks) for size in (args.small, args.large) for tasks in args.write_tasks]
            rounds = [*(f"warm-up {n + 1}" for n in range(args.warm_ups)), "measured"]
            for run in rounds + (["profiled"] if args.jfr is not None else []):
                for size, tasks in shapes:
                    shape = shape_name(size, tasks, args.write_tasks)
                    name = f"{args.topic}_{shape}_{run.replace('-', '').replace(' ', '')}"
                    config = RouterConfig(
                        topic=args.topic, schema=args.topic, encoding=args.encoding, table=name,
                        kafka={"kafka.bootstrap.servers": status.bootstrap_servers,
                               "startingOffsets": "earliest"},
                        checkpoint_location=str(home / "checkpoints" / name), catalog=stack.config.catalog,
                        max_offsets_per_trigger=size, trigger_interval="1 second", write_tasks=tasks,
                    )  # fmt: skip
                    profiled = args.jfr is not None and run == "profiled"
                    jfr = args.jfr / f"batches-{shape}.jfr" if profiled else None
                    figures = drain(spark, config, jvm, jfr)
                    print(f"{size:,}-record batches, write tasks {tasks or 'default'}, {run}: "
                          f"{json.dumps(figures)}", flush=True)  # fmt: skip
                    if run == "measured":
                        results[f"batches_of_{shape}"] = figures
        finally:
            spark.stop()
    finally:
        stack.down()
        shutil.rmtree(home, ignore_errors=True)
    results["load_after"] = os.getloadavg()
    for tasks in args.write_tasks:
        small = results[f"batches_of_{shape_name(args.small, tasks, args.write_tasks)}"]
        large = results[f"batches_of_{shape_name(args.large, tasks, args.write_tasks)}"]
        ratio = round(small["cpu_us_per_event"] / large["cpu_us_per_event"], 2)
        suffix = "" if len(args.write_tasks) == 1 else f"_tasks{tasks or 'default'}"
        results[f"small_over_large_cpu_per_event{suffix}"] = ratio
        print(
            f"write tasks {tasks or 'default'}: {args.small:,}-record batch "
            f"p50 {small['batch_seconds_p50']}s, p90 {small['batch_seconds_p90']}s; "
            f"CPU per event {small['cpu_us_per_event']} us against {large['cpu_us_per_event']} us "
            f"in {args.large:,}-record batches ({ratio} x; target 2 x)"
        )
    path = OUT / f"batches-{args.topic}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
