"""bench/router/batches: what a micro-batch costs besides its records.

The router drains the same backlog in small batches (`--small`, 5,000 records: a quiet topic on a 1-second
trigger) and in large ones (`--large`, 250,000: full speed), for each of `--write-tasks` (comma separated,
`default` for the topic's default). It does so in rounds: --warm-ups rounds (3) of every shape in turn, then
a measured one, each drain into a table of its own, so that no shape runs on a JVM the others have warmed
more. With `--peers router,plain` the hand-written Spark job of bench/router (d) drains the same shapes
beside the router: what Spark's micro-batch costs a job that does less. For each it prints the seconds per
batch, the CPU per event (the bench's Python and its Spark JVM, from /proc), the Python process's own CPU,
the JVM's CPU by thread (executor tasks, JIT compiler, GC, the driver's threads; threads that ended with
the query are not in it) and how many classes Spark's code generator compiled during the run. Small
batches should cost no more than 2 x the CPU per event of large ones, and a 5,000-record batch well under
a second.

    .venv/bin/python -m bench.router.batches [--events 200000] [--small 5000] [--large 250000]
        [--warm-ups 3] [--write-tasks default,1] [--peers router,plain] [--jfr DIR]

Writes bench/out/batches-<topic>.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.query import StreamingQuery

from bench.router.cpu import CpuClock, command_name, cpu_ticks
from bench.router.plain import create_plain_table, start_plain_job
from bench.router.run import percentile
from bench.stack import bench_parser, throwaway_stack, topic_query
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.config import RouterConfig
from bergstream.router.metrics import RouterMetrics
from bergstream.spark import build_spark_session

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


def compilations(spark: Any) -> int:
    codegen = getattr(spark._jvm.org.apache.spark.metrics.source, "CodegenMetrics$").__getattr__("MODULE$")
    return int(codegen.METRIC_COMPILATION_TIME().getCount())


def flight_recorder(jvm: int, command: str, *settings: str) -> None:
    """Start or stop a JDK Flight Recorder recording of the Spark JVM."""
    subprocess.run(["jcmd", str(jvm), command, "name=bench-batches", *settings], check=True,
                   capture_output=True)  # fmt: skip


def spark_durations(query: StreamingQuery | None) -> dict[str, list[int]]:
    """Spark's own account of each batch of `query` (its last 100): planning, offsets, the batch, the logs."""
    progress = query.recentProgress if query is not None else []
    return (
        {key: [p.durationMs.get(key, 0) for p in progress] for key in progress[0].durationMs}
        if progress
        else {}
    )


def run_router(spark: Any, config: RouterConfig) -> tuple[int, int, list[float], dict[str, list[int]]]:
    """The router over the topic with an availableNow trigger: batches, records, seconds per batch (as it
    reports them to its `batch_duration_seconds` histogram) and Spark's durations."""
    topic = config.settings.topic
    metrics = RouterMetrics(topic)
    durations = BatchDurations(metrics, topic)
    router = topic_query(spark, config, metrics)
    totals = router.run(available_now=True)[topic]
    return totals.batches, totals.read, durations.seconds, spark_durations(router.runner.query)


def run_plain(
    spark: Any, config: RouterConfig, bootstrap: str
) -> tuple[int, int, list[float], dict[str, list[int]]]:
    """The hand-written job (d) over the same topic, same batch size, availableNow; its seconds per batch are
    Spark's `triggerExecution`."""
    settings = config.settings
    identifier = config.query.catalog.table_identifier(settings.table)
    create_plain_table(spark, identifier, settings.schema_name)
    query = start_plain_job(
        spark, bootstrap, settings.topic, settings.schema_name, settings.encoding, identifier,
        Path(config.query.checkpoint_location), config.query.max_offsets_per_trigger or 0, None,
    )  # fmt: skip
    query.awaitTermination()
    progress = [p for p in query.recentProgress if p.numInputRows]
    seconds = [p.durationMs.get("triggerExecution", 0) / 1000 for p in progress]
    return len(progress), sum(p.numInputRows for p in progress), seconds, spark_durations(query)


def drain(
    spark: Any, config: RouterConfig, jvm: int, peer: str, bootstrap: str, jfr: Path | None = None
) -> dict[str, Any]:
    """Archive the topic with `peer` (router or plain) on an availableNow trigger; what it cost. With
    `jfr`, the JVM's execution samples of the run are written there."""
    if jfr is not None:
        flight_recorder(jvm, "JFR.start", "settings=profile")
    clock = CpuClock.spark_in_process()
    threads, compiled, cpu = thread_ticks(jvm), compilations(spark), clock.seconds()
    python = sum(os.times()[:2])
    started = time.monotonic()
    if peer == "plain":
        batches, records, seconds, durations = run_plain(spark, config, bootstrap)
    else:
        batches, records, seconds, durations = run_router(spark, config)
    elapsed = time.monotonic() - started
    spent = clock.seconds() - cpu
    python = sum(os.times()[:2]) - python
    if jfr is not None:
        flight_recorder(jvm, "JFR.stop", f"filename={jfr}")
    return {
        "batches": batches,
        "records": records,
        "seconds": round(elapsed, 2),
        "batch_seconds_p50": round(percentile(seconds, 50), 3) if seconds else None,
        "batch_seconds_p90": round(percentile(seconds, 90), 3) if seconds else None,
        "cpu_seconds": round(spent, 2),
        "cpu_us_per_event": round(1e6 * spent / max(records, 1), 1),
        "python_cpu_seconds": round(python, 2),
        "codegen_compilations": compilations(spark) - compiled,
        "jvm_cpu_by_thread": by_kind(threads, thread_ticks(jvm)),
        "spark_ms_p50": {key: sorted(values)[len(values) // 2] for key, values in durations.items()},
    }


def write_tasks_list(text: str) -> list[int | None]:
    try:
        return [None if part == "default" else int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write tasks are numbers or default, comma separated"
        ) from None


def variants(write_tasks: list[int | None], peers: list[str]) -> list[tuple[str, int | None, str]]:
    """(peer, write tasks, label) for each job the bench runs: the router once per write-tasks setting,
    labelled `tasks1`, `tasksdefault` when several are compared; the plain job labelled `plain`."""
    runs: list[tuple[str, int | None, str]] = []
    if "router" in peers:
        several = len(write_tasks) > 1
        runs += [("router", tasks, f"tasks{tasks or 'default'}" if several else "") for tasks in write_tasks]
    if "plain" in peers:
        runs.append(("plain", None, "plain"))
    return runs


def described(peer: str, tasks: int | None) -> str:
    return "plain job" if peer == "plain" else f"router, write tasks {tasks or 'default'}"


def shape_name(size: int, label: str) -> str:
    """`5000`, `5000_tasks1` or `5000_plain`: names of tables and results."""
    return f"{size}_{label}" if label else f"{size}"


def peers_list(text: str) -> list[str]:
    peers = text.split(",")
    if any(peer not in ("router", "plain") for peer in peers):
        raise argparse.ArgumentTypeError(f"{text!r}: peers are router and plain, comma separated")
    return peers


def main() -> None:
    parser = bench_parser(__doc__)
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
        "--peers",
        type=peers_list,
        default=["router"],
        help="router, plain (the hand-written Spark job of bench/router), comma separated",
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
    with throwaway_stack("batches") as (stack, status, home):
        results: dict[str, Any] = {
            "date": datetime.now(UTC).isoformat(),
            "events": args.events,
            "load_before": os.getloadavg(),
        }
        produce(
            ProduceRequest(topic=args.topic, count=args.events, partitions=PARTITIONS, late_fraction=0.05,
                           seed=1, encoding=args.encoding),
            status.bootstrap_servers, show_progress=False,
        )  # fmt: skip
        spark = build_spark_session(stack.config.catalog, app_name="bench-batches")
        jvm = CpuClock.spark_in_process().pids[1]
        try:
            jobs = variants(args.write_tasks, args.peers)
            shapes = [(size, job) for size in (args.small, args.large) for job in jobs]
            rounds = [*(f"warm-up {n + 1}" for n in range(args.warm_ups)), "measured"]
            for run in rounds + (["profiled"] if args.jfr is not None else []):
                for size, (peer, tasks, label) in shapes:
                    shape = shape_name(size, label)
                    name = f"{args.topic}_{shape}_{run.replace('-', '').replace(' ', '')}"
                    config = RouterConfig.flat(
                        topic=args.topic, schema=args.topic, encoding=args.encoding, table=name,
                        kafka={"kafka.bootstrap.servers": status.bootstrap_servers,
                               "startingOffsets": "earliest"},
                        checkpoint_location=str(home / "checkpoints" / name), catalog=stack.config.catalog,
                        max_offsets_per_trigger=size, trigger_interval="1 second", write_tasks=tasks,
                    )  # fmt: skip
                    profiled = args.jfr is not None and run == "profiled"
                    jfr = args.jfr / f"batches-{shape}.jfr" if profiled else None
                    figures = drain(spark, config, jvm, peer, status.bootstrap_servers, jfr)
                    print(f"{size:,}-record batches, {described(peer, tasks)}, {run}: {json.dumps(figures)}",
                          flush=True)  # fmt: skip
                    if run == "measured":
                        results[f"batches_of_{shape}"] = figures
        finally:
            spark.stop()
    results["load_after"] = os.getloadavg()
    for peer, tasks, label in variants(args.write_tasks, args.peers):
        small = results[f"batches_of_{shape_name(args.small, label)}"]
        large = results[f"batches_of_{shape_name(args.large, label)}"]
        ratio = round(small["cpu_us_per_event"] / large["cpu_us_per_event"], 2)
        results[f"small_over_large_cpu_per_event{'_' + label if label else ''}"] = ratio
        print(
            f"{described(peer, tasks)}: {args.small:,}-record batch "
            f"p50 {small['batch_seconds_p50']}s, p90 {small['batch_seconds_p90']}s; "
            f"CPU per event {small['cpu_us_per_event']} us against {large['cpu_us_per_event']} us "
            f"in {args.large:,}-record batches ({ratio} x; target 2 x)"
        )
    path = OUT / f"batches-{args.topic}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
