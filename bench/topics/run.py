"""bench/topics: many topics in one driver and one query (`--all` by their names, `--pattern`), against a
driver per topic, in CPU, memory, throughput and freshness.

For each count of topics (1, 4 and 16 by default), against the embedded stack, on the same events:
  - all: `bergstream router run --all` over the topics' files, one query of them by name;
  - pattern: `bergstream router run --pattern`, one query for every topic, from one defaults file;
  - separate drivers: one `bergstream router run --topic T` process per topic (up to --separate-max
    topics: each driver is a JVM of its own, and 2 cores start only so many at once).
Each topic holds a backlog of --events events when its routers start. Measured, from the drivers' own
metrics endpoints, the tables and /proc:
  - start: seconds from launch to the first archived record;
  - backlog: events/s archived over all topics, from the end of the first batch to the last record (each
    topic's batches hold at most --max-offsets records, so that its backlog takes several);
  - steady: while one producer sends --rate-per-topic events/s to every topic (or --rate over all) for
    --seconds, the events/s archived, and how long after the last one was sent everything was archived;
  - freshness: seconds from each record's Kafka timestamp to the commit of the snapshot that added it, over
    the steady run; p99 of all records, and the worst topic's p99;
  - a new topic (one query only): seconds from the first record of a topic created during the steady run
    to its first archived row; the other shapes need its settings file and a restart;
  - with --restart, a restart: the drivers stopped at the end and launched again on their checkpoints and
    tables, seconds from launch until every topic is archived by a running query (bergstream_router_topic_up);
  - resident memory (RSS) of every driver's Python process and its JVM, peak and at the end of the steady
    run; CPU seconds per second over the steady run, and the share of it the JVMs' JIT compilers took;
  - commits: the tables' commits a minute over all topics in the steady run, and a table's metadata file:
    its mean size at the end, its growth a commit, and its size an hour on at this pace (none expired).
With --warm-up SECONDS, the same load runs that long before the steady run is measured: a router's JVM
compiles Spark's, Iceberg's and Parquet's code for minutes after it starts, with a core of its own on a
machine of two (a router runs for days; its steady state is what freshness is measured in).

    .venv/bin/python -m bench.topics.run [--topics 1 4 16] [--shapes all pattern separate]
        [--events 20000] [--rate-per-topic 100 | --rate 2000] [--seconds 60] [--warm-up 0] [--trigger 10]
        [--target-lag 60]

Prints the numbers, writes bench/out/topics-<counts>-<shapes>.json and .png: the growth curves against
the topics (CPU per event archived, freshness p99, resident memory, events archived against offered);
`--replot <json>` draws a run's plot again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from bench.router.run import freshness, machine, percentile
from bench.stack import bench_home, bench_parser
from bergstream.catalog import CatalogConfig
from bergstream.loadgen.events import EventModel
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local import LocalStack, StackConfig
from bergstream.local.processes import free_ports
from bergstream.schemas.event_schema import load_event_schema
from tests.postgres import USER, postgres_server

OUT = Path(__file__).parent.parent / "out"
ROOT = Path(__file__).parent.parent.parent
PARTITIONS = 2
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
COMMITS = "bergstream_router_commits_total"
METADATA_BYTES = "bergstream_router_table_metadata_bytes"


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (the driver's Python process, its JVM)."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                queue += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def rss_bytes(pids: list[int]) -> int:
    """The resident memory of the processes among `pids` that have run a second or more: the driver's Python
    process and its JVM, not the JVM's forks of a moment (Hadoop runs `chmod` for each local file it
    writes), whose pages, the JVM's own until they exec, would count twice."""
    return sum(rss_by_program(pids).values())


def rss_by_program(pids: list[int]) -> dict[str, int]:
    """rss_bytes by program: the JVMs' ("java") and the Python processes' ("python"), the others apart."""
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    total: dict[str, int] = {}
    for pid in pids:
        try:
            started = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]) / CLOCK_TICKS
            if uptime - started < 1:
                continue
            resident = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        program = "java" if name == "java" else "python" if name.startswith("python") else name
        total[program] = total.get(program, 0) + resident
    return total


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLOCK_TICKS


def jit_seconds(pids: list[int]) -> float:
    """Seconds the JIT compilers of the JVMs among `pids` spent compiling (HotSpot's java.ci.totalTime)."""
    total = 0.0
    for pid in pids:
        done = subprocess.run(["jcmd", str(pid), "PerfCounter.print"], capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        counters = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        if "java.ci.totalTime" in counters and "sun.os.hrt.frequency" in counters:
            total += int(counters["java.ci.totalTime"]) / int(counters["sun.os.hrt.frequency"])
    return total


def by_topic(port: int, signs: dict[str, float]) -> dict[str, float]:
    """{topic: the sum of its series of each metric named in `signs`, times its sign} that a driver's metrics
    endpoint serves; empty while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in signs and "topic" in sample.labels:
                topic = sample.labels["topic"]
                found[topic] = found.get(topic, 0.0) + signs[sample.name] * sample.value
    return found


def archived(port: int) -> dict[str, float]:
    """{topic: records archived} from a driver's metrics endpoint (committed: a topic on a target lag is read
    only when its commit is due); empty while it does not answer."""
    return by_topic(port, {"bergstream_router_records_archived_total": 1.0})


@dataclass
class Drivers:
    processes: list[subprocess.Popen[bytes]]
    ports: list[int]
    peak_rss: int = 0
    samples: list[tuple[float, int, float]] = field(default_factory=list)  # (seconds, rss, archived)
    _stop: threading.Event = field(default_factory=threading.Event)

    def archived(self) -> float:
        return sum(sum(archived(port).values()) for port in self.ports)

    def archived_of(self, topic: str) -> float:
        return sum(archived(port).get(topic, 0.0) for port in self.ports)

    def pids(self) -> list[int]:
        return [pid for process in self.processes for pid in process_tree(process.pid)]

    def by_topic(self, name: str) -> dict[str, float]:
        return {topic: value for port in self.ports for topic, value in by_topic(port, {name: 1.0}).items()}

    def watch(self, started: float) -> threading.Thread:
        def sample() -> None:
            # Memory every second, the records archived (a scrape of the metrics) every fifth.
            archived, looks = 0.0, 0
            while not self._stop.wait(1.0):
                rss = rss_bytes(self.pids())
                self.peak_rss = max(self.peak_rss, rss)
                if looks % 5 == 0:
                    archived = self.archived()
                looks += 1
                self.samples.append((time.monotonic() - started, rss, archived))

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(180)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


SHAPES = {"all": "one query (--all)", "pattern": "one query (--pattern)", "separate": "separate drivers"}


def driver_settings(
    catalog: CatalogConfig, bootstrap: str, directory: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """What every topic's router shares: Kafka, the catalog, the trigger, Spark."""
    return {
        "encoding": "json",
        "schema": "playback",
        "cluster": "bench",
        "kafka": {"kafka.bootstrap.servers": bootstrap, "startingOffsets": "earliest"},
        "trigger_interval": f"{args.trigger:g} seconds",
        "max_offsets_per_trigger": args.max_offsets,
        "catalog": catalog.model_dump(mode="json", exclude_none=True),
        "spark": {
            "master": "local[2]",
            "conf": {
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "2",
                **({"spark.driver.extraJavaOptions": args.java_options} if args.java_options else {}),
            },
        },
        "lag_refresh_seconds": 5,
        "metrics_host": "127.0.0.1",
        **({"target_lag": f"{args.target_lag:g}s"} if args.target_lag else {}),
    }


def settings(shared: dict[str, Any], directory: Path, topic: str) -> Path:
    path = directory / f"{topic}.yaml"
    config = {
        **shared,
        "topic": topic,
        "table": topic,
        "checkpoint_location": str(directory / "checkpoints" / topic),
    }
    path.write_text(yaml.safe_dump(config))
    return path


def launch(shape: str, topics: list[str], directory: Path, log: Path, pattern: str) -> Drivers:
    command = [sys.executable, "-m", "bergstream", "router", "run"]
    with log.open("ab") as out:
        if shape in (SHAPES["all"], SHAPES["pattern"]):
            (port,) = free_ports(1)
            flags = (
                ["--all", "--topics-dir", str(directory)]
                if shape == SHAPES["all"]
                else ["--pattern", pattern, "--defaults", str(directory / "defaults.yaml"),
                      "--topics-dir", str(directory / "none")]
            )  # fmt: skip
            process = subprocess.Popen(
                [*command, *flags, "--metrics-port", str(port)],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            )  # fmt: skip
            return Drivers([process], [port])
        ports = free_ports(len(topics))
        processes = [
            subprocess.Popen(
                [
                    *command,
                    "--topic",
                    topic,
                    "--config",
                    str(directory / f"{topic}.yaml"),
                    "--metrics-port",
                    str(port),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,
            )
            for topic, port in zip(topics, ports, strict=True)
        ]
        return Drivers(processes, ports)


def wait_for(drivers: Drivers, total: float, timeout: float, what: str, topic: str | None = None) -> float:
    """Polls until the drivers archived and committed `total` records (of `topic`, when given); returns
    when, in monotonic seconds."""
    deadline = time.monotonic() + timeout
    last_print = 0.0
    while True:
        done = drivers.archived() if topic is None else drivers.archived_of(topic)
        now = time.monotonic()
        if done >= total:
            return now
        if now > deadline:
            raise RuntimeError(f"{what}: {done:,.0f} of {total:,.0f} archived after {timeout:.0f}s")
        if any(process.poll() is not None for process in drivers.processes):
            raise RuntimeError(f"{what}: a driver exited; see its log")
        if now - last_print > 10:
            print(f"  {what}: {done:,.0f} of {total:,.0f} archived", flush=True)
            last_print = now
        # Each look is a scrape of the drivers' metrics endpoints, whose every series costs the driver's
        # Python CPU: looking as seldom as Prometheus scrapes (every 15 s, commonly) would blur the times
        # measured; four times a second took a tenth of a core from a driver of 100 topics.
        time.sleep(1.0)


def restart_seconds(
    shape: str, topics: list[str], directory: Path, log: Path, pattern: str, timeout: float
) -> float:
    """Seconds from launching the drivers again on their checkpoints and tables until every topic is up:
    archived by a running query (its tables described, its id checked, what it left unread read)."""
    launched = time.monotonic()
    drivers = launch(shape, topics, directory, log, pattern)
    try:
        while True:
            up = sum(drivers.by_topic("bergstream_router_topic_up").values())
            now = time.monotonic()
            if up >= len(topics):
                return now - launched
            if now - launched > timeout:
                raise RuntimeError(f"restart: {up:.0f} of {len(topics)} topics up after {timeout:.0f}s")
            if any(process.poll() is not None for process in drivers.processes):
                raise RuntimeError("restart: a driver exited; see its log")
            time.sleep(1.0)
    finally:
        drivers.stop()


def create_topics(bootstrap: str, topics: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1) for topic in topics]).values():
        future.result(60)


def payloads(count: int) -> list[tuple[bytes, bytes]]:
    """(key, value) of `count` playback events as JSON, made once: the steady run only sends them."""
    schema = load_event_schema("playback")
    events = EventModel(seed=5).events("playback")
    made = []
    for _ in range(count):
        generated = next(events)
        made.append((generated.key, schema.encode(generated.event, "json")))
    return made


def send_steady(bootstrap: str, topics: list[str], per_topic: float, seconds: float) -> tuple[int, float]:
    """One producer sends `per_topic` events/s to every topic, round robin, for `seconds`: the events sent
    and the seconds it took. Each record's Kafka timestamp is when it was sent."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4"})
    made = payloads(997)
    rate = per_topic * len(topics)
    total = int(rate * seconds)
    started = time.monotonic()
    sent = 0
    while sent < total:
        due = min(total, int((time.monotonic() - started) * rate) + 1)
        while sent < due:
            key, value = made[sent % len(made)]
            try:
                producer.produce(topics[sent % len(topics)], value=value, key=key)
            except BufferError:
                producer.poll(0.05)
                continue
            sent += 1
        producer.poll(0)
        time.sleep(0.005)
    took = time.monotonic() - started
    if producer.flush(60):
        raise RuntimeError("the steady run's producer did not deliver everything in 60 s")
    return sent, took


def topic_freshness(catalog: CatalogConfig, topics: list[str], after_ms: int) -> dict[str, list[float]]:
    return {topic: freshness(catalog, topic, after_ms) for topic in topics}


def measure(
    catalog: CatalogConfig, bootstrap: str, shape: str, count: int, args: argparse.Namespace, home: Path
) -> dict[str, Any]:
    slug = {SHAPES["all"]: "all", SHAPES["pattern"]: "pat", SHAPES["separate"]: "sep"}[shape]
    prefix = f"bench_{slug}{count}"
    topics = [f"{prefix}_{i:03d}" for i in range(count)]
    directory = home / f"{slug}{count}"
    directory.mkdir()
    shared = driver_settings(catalog, bootstrap, directory, args)
    if shape == SHAPES["pattern"]:
        # Spark's rate limit is the query's: as many offsets a batch over all topics as the topics' own.
        defaults = {
            **shared,
            "checkpoint_location": str(directory / "checkpoints" / "pattern"),
            "max_offsets_per_trigger": args.max_offsets * count,
        }
        (directory / "defaults.yaml").write_text(yaml.safe_dump(defaults))
    else:
        for topic in topics:
            settings(shared, directory, topic)
    create_topics(bootstrap, topics)

    # A producer per topic, several at once: one after another, a thousand topics' backlogs take minutes of
    # clients starting and waiting for their acknowledgements.
    def backlog(topic: str) -> None:
        request = ProduceRequest(topic=topic, schema="playback", count=args.events, partitions=PARTITIONS)
        produce(request, bootstrap, show_progress=False)

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(backlog, topics))
    print(f"{count} topics, {shape}: {count * args.events:,} events of backlog; starting", flush=True)
    launched = time.monotonic()
    log = home / f"{slug}{count}.log"
    drivers = launch(shape, topics, directory, log, rf"{prefix}_.*")
    drivers.watch(launched)
    new_topic_seconds = None
    try:
        backlog = count * args.events
        first = wait_for(drivers, 1, args.timeout, "first record")
        at_first = drivers.archived()
        done = wait_for(drivers, backlog, args.timeout, "backlog")
        per_topic = args.rate_per_topic if args.rate_per_topic is not None else args.rate / count
        warmed = 0
        if args.warm_up > 0:
            print(f"  warming up: {per_topic:g} events/s per topic for {args.warm_up:g}s", flush=True)
            warmed, _ = send_steady(bootstrap, topics, per_topic, args.warm_up)
            wait_for(drivers, backlog + warmed, args.timeout, "warm-up caught up")
        steady_pids = drivers.pids()
        cpu_before = cpu_seconds(steady_pids)
        jit_before = jit_seconds(steady_pids)
        steady_started = time.monotonic()
        steady_ms = int(time.time() * 1000)
        archived_before = drivers.archived()
        commits_before = drivers.by_topic(COMMITS)
        metadata_before = drivers.by_topic(METADATA_BYTES)
        sent_box: list[tuple[int, float]] = []
        sender = threading.Thread(
            target=lambda: sent_box.append(send_steady(bootstrap, topics, per_topic, args.seconds))
        )
        sender.start()
        if shape == SHAPES["pattern"]:
            # A topic created while the others run: from its first record to its first archived row.
            time.sleep(args.seconds / 3)
            new_topic = f"{prefix}_new"
            create_topics(bootstrap, [new_topic])
            made = Producer({"bootstrap.servers": bootstrap})
            key, value = payloads(1)[0]
            made.produce(new_topic, value=value, key=key)
            made.flush(30)
            first_sent = time.monotonic()
            arrived = wait_for(drivers, 1, args.timeout, "the new topic's first record", topic=new_topic)
            new_topic_seconds = arrived - first_sent
            print(f"  a new topic's first record archived after {new_topic_seconds:.1f}s", flush=True)
        sender.join()
        sent, sent_seconds = sent_box[0]
        archived_after = drivers.archived()
        commits_after = drivers.by_topic(COMMITS)
        metadata_after = drivers.by_topic(METADATA_BYTES)
        cpu = cpu_seconds(steady_pids) - cpu_before
        jit = jit_seconds(steady_pids) - jit_before
        end_rss = rss_bytes(drivers.pids())
        programs = rss_by_program(drivers.pids())
        extra = 1 if new_topic_seconds is not None else 0
        lag = backlog + warmed + sent + extra - archived_after
        caught_up = wait_for(drivers, backlog + warmed + sent + extra, args.timeout, "steady run caught up")
    finally:
        drivers.stop()
        # The drivers' log, for the profile of where a batch's time went: kept beside the run's numbers.
        shutil.copy(log, OUT / f"topics-{count}-{shape}.log")
    restarted = None
    if args.restart:
        try:
            restarted = restart_seconds(shape, topics, directory, log, rf"{prefix}_.*", args.timeout)
        finally:
            shutil.copy(log, OUT / f"topics-{count}-{shape}.log")
        print(f"  restarted: every topic up {restarted:.1f}s after launch", flush=True)
    fresh = topic_freshness(catalog, topics, steady_ms)
    every = [delay for delays in fresh.values() for delay in delays]
    per_topic_p99 = sorted(percentile(delays, 99) for delays in fresh.values() if delays)
    commits = {topic: commits_after.get(topic, 0.0) - commits_before.get(topic, 0.0) for topic in topics}
    commits_per_minute = sum(commits.values()) / sent_seconds * 60
    # A table's metadata file grows by about the same with each commit until maintenance expires snapshots:
    # its size an hour on from now, at this run's commits a minute, with none expired.
    growth = [
        (metadata_after[topic] - metadata_before[topic]) / commits[topic]
        for topic in topics
        if commits[topic] > 0 and topic in metadata_before and topic in metadata_after
    ]
    per_commit = sum(growth) / len(growth) if growth else None
    metadata_now = [metadata_after[topic] for topic in topics if topic in metadata_after]
    metadata_mean = sum(metadata_now) / len(metadata_now) if metadata_now else None
    hour_commits = commits_per_minute / count * 60
    metadata_hour = (
        metadata_mean + per_commit * hour_commits
        if metadata_mean is not None and per_commit is not None
        else None
    )
    result = {
        "topics": count,
        "commits_per_minute": commits_per_minute,
        "metadata_bytes_mean": metadata_mean,
        "metadata_bytes_per_commit": per_commit,
        "metadata_bytes_in_an_hour": metadata_hour,
        "shape": shape,
        "drivers": len(drivers.processes),
        "trigger_seconds": args.trigger,
        "target_lag_seconds": args.target_lag,
        "start_seconds": first - launched,
        "restart_seconds": restarted,
        "backlog_events": backlog,
        "backlog_events_per_s": (backlog - at_first) / (done - first) if done > first else None,
        "steady_rate_sent": sent / sent_seconds,
        "steady_events_per_s": (archived_after - archived_before) / sent_seconds,
        "steady_lag_at_end": lag,
        "steady_catch_up_seconds": caught_up - steady_started - sent_seconds,
        "steady_cpu_seconds_per_s": cpu / sent_seconds,
        "steady_jit_seconds_per_s": jit / sent_seconds,
        "warm_up_seconds": args.warm_up,
        "freshness_p50": percentile(every, 50) if every else None,
        "freshness_p99": percentile(every, 99) if every else None,
        "freshness_p99_worst_topic": per_topic_p99[-1] if per_topic_p99 else None,
        "freshness_p99_median_topic": per_topic_p99[len(per_topic_p99) // 2] if per_topic_p99 else None,
        "new_topic_seconds": new_topic_seconds,
        "rss_peak_mib": drivers.peak_rss / 2**20,
        "rss_steady_end_jvm_mib": programs.get("java", 0) / 2**20,
        "rss_steady_end_python_mib": programs.get("python", 0) / 2**20,
        "rss_steady_end_mib": end_rss / 2**20,
        "samples": drivers.samples,
    }
    worst = result["freshness_p99_worst_topic"]
    fresh_text = f"freshness p99 {result['freshness_p99']:.1f}s (worst topic {worst:.1f}s)" if every else "-"
    print(
        f"  start {result['start_seconds']:.0f}s, "
        f"backlog {result['backlog_events_per_s'] or 0:,.0f} events/s, "
        f"steady {result['steady_events_per_s']:,.0f} of {result['steady_rate_sent']:,.0f} events/s sent "
        f"(lag {lag:,.0f} when the last was sent, all archived {result['steady_catch_up_seconds']:.0f}s "
        f"later), {fresh_text}, {result['steady_cpu_seconds_per_s']:.2f} CPU s/s (JIT "
        f"{result['steady_jit_seconds_per_s']:.2f}), RSS peak "
        f"{result['rss_peak_mib']:,.0f} MiB, steady {result['rss_steady_end_mib']:,.0f} MiB (JVM "
        f"{result['rss_steady_end_jvm_mib']:,.0f}, Python {result['rss_steady_end_python_mib']:,.0f}), "
        f"{commits_per_minute:,.0f} commits a minute, a table's metadata file "
        f"{(metadata_mean or 0) / 1024:,.1f} KiB (+{(per_commit or 0) / 1024:,.2f} KiB a commit: "
        f"{(metadata_hour or 0) / 1024:,.0f} KiB an hour on)",
        flush=True,
    )
    return result


def cpu_us_per_event(run: dict[str, Any]) -> float | None:
    """The drivers' CPU an archived event cost over the steady run, in microseconds."""
    rate = run.get("steady_events_per_s")
    return run["steady_cpu_seconds_per_s"] / rate * 1e6 if rate else None


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """The growth curves: against the topics, CPU per event, freshness p99, resident memory and the events
    archived while they arrive."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 3, figsize=(16, 7.5))
    (cpu, fresh, commits), (memory, rate, metadata) = axes
    for shape, marker in ((SHAPES["all"], "o"), (SHAPES["pattern"], "^"), (SHAPES["separate"], "s")):
        runs = [r for r in results if r["shape"] == shape]
        if not runs:
            continue
        counts = [r["topics"] for r in runs]
        cpu.plot(counts, [cpu_us_per_event(r) for r in runs], marker=marker, label=shape)
        fresh.plot(counts, [r["freshness_p99"] for r in runs], marker=marker, label=shape)
        memory.plot(counts, [r["rss_steady_end_mib"] for r in runs], marker=marker, label=shape)
        rate.plot(counts, [r["steady_events_per_s"] for r in runs], marker=marker, label=shape)
        commits.plot(counts, [r.get("commits_per_minute") for r in runs], marker=marker, label=shape)
        metadata.plot(counts, [(r.get("metadata_bytes_in_an_hour") or 0) / 1024 for r in runs], marker=marker,
                      label=shape)  # fmt: skip
        rate.plot(counts, [r["steady_rate_sent"] for r in runs], linestyle=":", color="grey",
                  label="offered" if shape == runs[0]["shape"] else None)  # fmt: skip
    cpu.set(ylabel="driver CPU per event archived, us", title="CPU per event")
    fresh.set(ylabel="seconds, Kafka timestamp to commit", title="Freshness p99")
    memory.set(ylabel="MiB (Python + JVM), end of the steady run", title="Resident memory")
    rate.set(ylabel="events/s archived while they arrive", title="Throughput")
    commits.set(ylabel="table commits a minute, all topics", title="Commits")
    metadata.set(ylabel="KiB, a table's metadata file an hour on", title="Metadata file")
    for axis in (cpu, fresh, commits, memory, rate, metadata):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("topics")
        axis.set_ylim(bottom=0)
        axis.legend()
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--topics", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["all", "pattern", "separate"])
    parser.add_argument("--events", type=int, default=100_000, help="backlog per topic")
    parser.add_argument("--max-offsets", type=int, default=25_000, help="max_offsets_per_trigger per topic")
    parser.add_argument("--rate", type=float, default=2000, help="events/s over all topics, steady run")
    parser.add_argument("--rate-per-topic", type=float, default=None, help="events/s per topic (over --rate)")
    parser.add_argument("--seconds", type=float, default=60, help="length of the steady run")
    parser.add_argument(
        "--warm-up",
        type=float,
        default=0,
        help="seconds of the steady load before the steady run is measured",
    )
    parser.add_argument("--trigger", type=float, default=2, help="the routers' trigger interval, seconds")
    parser.add_argument(
        "--target-lag", type=float, default=None,
        help="every topic's target lag, seconds (router/driver/unread.py); unset, a commit every batch",
    )  # fmt: skip
    parser.add_argument(
        "--separate-max", type=int, default=4, help="run separate drivers up to this many topics"
    )
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument(
        "--java-options",
        default="",
        help="more Java options of the drivers' JVMs (-XX:NativeMemoryTracking=summary)",
    )
    parser.add_argument(
        "--object-store",
        choices=("none", "s3"),
        default="none",
        help="the warehouse: a folder, or the stack's S3 object store (versitygw), as production's is",
    )
    parser.add_argument(
        "--catalog", choices=("sqlite", "postgres"), default="sqlite",
        help="the JDBC catalog's database: the stack's SQLite file, or a PostgreSQL server of the bench's",
    )  # fmt: skip
    parser.add_argument(
        "--restart", action="store_true",
        help="launch the drivers again after the steady run and time until every topic is up",
    )  # fmt: skip
    parser.add_argument("--replot", type=Path, help="draw the plot of a run's JSON again, and stop")
    args = parser.parse_args()
    if args.replot is not None:
        runs = json.loads(args.replot.read_text())["runs"]
        plot([r for r in runs if "failed" not in r], args.replot.with_suffix(".png"))
        return
    OUT.mkdir(parents=True, exist_ok=True)
    running = contextlib.ExitStack()
    home = running.enter_context(bench_home("topics"))
    kafka_port, controller_port, store_port = free_ports(3)
    stack = LocalStack(
        StackConfig(data_dir=home / "stack", kafka_port=kafka_port, controller_port=controller_port,
                    object_store=args.object_store, object_store_port=store_port)
    )  # fmt: skip
    status = stack.up()
    catalog = stack.config.catalog
    if args.catalog == "postgres":
        if args.object_store != "none":
            parser.error("--catalog postgres keeps its warehouse in a folder: leave --object-store out")
        postgres = running.enter_context(postgres_server())
        catalog = CatalogConfig(uri=postgres.jdbc_uri, warehouse=(home / "warehouse").as_uri(), user=USER)
    results: list[dict[str, Any]] = []
    wanted = [SHAPES[shape] for shape in args.shapes]
    try:
        for count in args.topics:
            shapes = [
                shape for shape in wanted
                if shape != "separate drivers" or 1 < count <= args.separate_max
            ]  # fmt: skip
            for shape in shapes:
                try:
                    results.append(measure(catalog, status.bootstrap_servers, shape, count, args, home))
                except RuntimeError as error:  # a shape that cannot keep up is reported, not fatal
                    print(f"  {count} topics, {shape}: {error}", flush=True)
                    results.append({"topics": count, "shape": shape, "failed": str(error), "samples": []})
    finally:
        stack.down()
        running.close()
    report = {
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(),
        "arguments": vars(args),
        "runs": [{k: v for k, v in run.items() if k != "samples"} for run in results],
    }
    name = "topics-" + "-".join(str(count) for count in args.topics) + "-" + "-".join(args.shapes)
    if args.catalog != "sqlite":
        name += f"-{args.catalog}"
    if args.object_store != "none":
        name += f"-{args.object_store}"
    (OUT / f"{name}.json").write_text(json.dumps({**report, "samples": [r["samples"] for r in results]}))
    print(json.dumps(report, indent=2))
    plot([r for r in results if "failed" not in r], OUT / f"{name}.png")


if __name__ == "__main__":
    main()
