"""bench/soak: the router under steady traffic, with a fault every few minutes, then the exactly-once proof.

One router archives a topic fed at a steady rate into a PostgreSQL catalog. Every 2 to 3 minutes (by
default) one fault, chosen at random, each kind once in every round of three:
  driver   SIGKILL of the router's process group (its Python driver and Spark JVM); restarted 5 s later,
           as Kubernetes would restart the pod
  broker   SIGKILL of the Kafka broker that leads partition 0 (of three by default, --brokers 3);
           restarted 10 to 30 s later
  catalog  PostgreSQL stopped as a crash would stop it, for 30 to 60 s
After each fault the soak waits for the router to catch up again (lag under two triggers of traffic) and
records how long that took. At the end the producer stops, the router drains, and every offset Kafka
holds is looked up in the archive and dead-letter tables: each must be there exactly once.

    .venv/bin/python -m bench.soak.run [--minutes 30] [--rate 2000] [--brokers 3] [--seed 1]

Prints progress and the report, writes bench/out/soak/soak.json, soak.png and the router's log.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.stack import bench_home, bench_parser
from bergstream.catalog import CatalogConfig
from bergstream.errors import BergstreamError
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local import LocalStack, StackConfig, kafka_broker
from bergstream.local.processes import free_ports
from tests.postgres import USER, PostgresServer, postgres_server

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "out" / "soak"
TOPIC = "soak_playback"
GROUP = f"bergstream-router.{TOPIC}"
PARTITIONS = 4
TRIGGER_SECONDS = 5
log = logging.getLogger("bench.soak")


@dataclass
class FaultRecord:
    kind: str
    started: float  # seconds since the soak began
    lasted: float  # seconds the component was away
    recovered_after: float | None  # seconds from its return until the router caught up; None if never


@dataclass
class SoakReport:
    machine: str
    minutes: float
    rate: int
    brokers: int
    produced: int = 0
    archived: int = 0
    dead_lettered: int = 0
    duplicates: int = 0
    lost: int = 0
    router_restarts: int = 0
    faults: list[FaultRecord] = field(default_factory=list)
    lag: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, records behind)


class Supervisor:
    """Keeps one router running, restarting it when it ends, as a Deployment would."""

    def __init__(self, command: list[str], log_file: Path) -> None:
        self.command = command
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._launch()
        self._thread.start()

    def _launch(self) -> None:
        with self.log_file.open("ab") as out:
            self.process = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                env={**os.environ, "PYTHONFAULTHANDLER": "1"},
            )  # fmt: skip

    def _watch(self) -> None:
        while not self._stop.wait(1):
            with self._lock:
                assert self.process is not None
                if self.process.poll() is None:
                    continue
                log.info("router exited with %s; restarting it in 5 s", self.process.returncode)
            if self._stop.wait(5):
                return
            with self._lock:
                self.restarts += 1
                self._launch()

    def kill(self) -> None:
        with self._lock:
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> int | None:
        self._stop.set()
        self._thread.join()
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(180)
        return self.process.returncode


class Traffic:
    """A steady producer, in chunks of a few seconds; chunks a broker outage fails are logged, not fatal:
    what Kafka did not take is not in the topic, and the proof counts what is."""

    def __init__(self, bootstrap_servers: str, rate: int) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.rate = rate
        self.failed_chunks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        chunk = 0
        while not self._stop.is_set():
            chunk += 1
            request = ProduceRequest(topic=TOPIC, schema="playback", count=self.rate * 5, rate=self.rate,
                                     bad_fraction=0.01, partitions=PARTITIONS, seed=chunk)  # fmt: skip
            try:
                produce(request, self.bootstrap_servers, {"log_level": 0}, show_progress=False)
            except BergstreamError as error:
                self.failed_chunks += 1
                log.info("producer: %s", str(error).splitlines()[0])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def kafka_offsets(bootstrap_servers: str) -> set[tuple[int, int]]:
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "bench-soak-proof"})
    try:
        offsets = set()
        for partition in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, partition), timeout=30)
            offsets |= {(partition, offset) for offset in range(low, high)}
        return offsets
    finally:
        consumer.close()


def archived(catalog: CatalogConfig, table: str) -> list[tuple[int, int]]:
    loaded = catalog.load()
    rows = loaded.load_table(f"{catalog.namespace}.{table}").scan(selected_fields=("__metadata__",))
    return [(m["partition"], m["offset"]) for m in rows.to_arrow().column("__metadata__").to_pylist()]


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path, postgres: PostgresServer) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.work = work
        self.postgres = postgres
        ports = free_ports(2 * args.brokers)
        self.stack = LocalStack(
            StackConfig(
                work / "stack", kafka_port=ports[0], controller_port=ports[1], brokers=args.brokers,
                other_ports=tuple((ports[i], ports[i + 1]) for i in range(2, len(ports), 2)),
            )
        )  # fmt: skip
        self.catalog = CatalogConfig(
            uri=postgres.jdbc_uri, warehouse=(work / "warehouse").as_uri(), user=USER
        )
        self.report = SoakReport(
            machine=machine(), minutes=args.minutes, rate=args.rate, brokers=args.brokers
        )
        self.bootstrap = ""
        self._lag_client: Consumer | None = None
        self._bag: list[str] = []
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def router_config(self, bootstrap_servers: str) -> Path:
        config = {
            "topic": TOPIC, "schema": "playback", "encoding": "json", "table": TOPIC, "cluster": "soak",
            "kafka": {"kafka.bootstrap.servers": bootstrap_servers, "startingOffsets": "earliest"},
            "trigger_interval": f"{TRIGGER_SECONDS} seconds", "max_offsets_per_trigger": 50_000,
            "checkpoint_location": str(self.work / "checkpoint"),
            "catalog": self.catalog.model_dump(mode="json", exclude_none=True),
            "lag_refresh_seconds": 2,
            "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false"}},
        }  # fmt: skip
        path = self.work / f"{TOPIC}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def position(self) -> tuple[int, int] | None:
        """(records in Kafka, records the router's group has committed); None while Kafka does not answer.

        Measured here rather than read from the router's metrics, which keep their last value while the
        router cannot reach Kafka."""
        if self._lag_client is None:
            self._lag_client = Consumer({"bootstrap.servers": self.bootstrap, "group.id": GROUP,
                                         "socket.timeout.ms": 3000, "log_level": 0})  # fmt: skip
        partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        try:
            committed = sum(max(tp.offset, 0) for tp in self._lag_client.committed(partitions, timeout=3))
            end = sum(
                self._lag_client.get_watermark_offsets(tp, timeout=3, cached=False)[1] for tp in partitions
            )
        except KafkaException:
            return None
        return end, committed

    def lag(self) -> float | None:
        """Records in Kafka past the router's committed group offsets."""
        position = self.position()
        if position is None:
            return None
        end, committed = position
        behind = float(end - committed)
        self.report.lag.append((round(self.elapsed(), 1), behind))
        return behind

    def watch(self, seconds: float) -> None:
        """Sample the lag for `seconds`."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.lag()
            time.sleep(2)

    def caught_up_after(self, since: float, timeout: float = 600) -> float | None:
        """Seconds from `since` until the router has committed again and is within one trigger of traffic
        of the end of the topic: its steady state."""
        deadline = time.monotonic() + timeout
        committed_before: int | None = None
        while time.monotonic() < deadline:
            position = self.position()
            if position is not None:
                end, committed = position
                self.report.lag.append((round(self.elapsed(), 1), float(end - committed)))
                if committed_before is None:
                    committed_before = committed
                elif committed > committed_before and end - committed < self.args.rate * TRIGGER_SECONDS:
                    return round(time.monotonic() - since, 1)
            time.sleep(1)
        return None

    def next_fault(self) -> str:
        """At random, each kind once in every round of as many faults as there are kinds."""
        if not self._bag:
            self._bag = list(self.args.faults)
            self.rng.shuffle(self._bag)
        return self._bag.pop()

    def leader_of_partition_0(self) -> kafka_broker.BrokerConfig:
        nodes = self.stack.config.nodes
        if len(nodes) == 1:
            return nodes[0]
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        leader = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions[0].leader
        return next(node for node in nodes if node.node_id == leader)

    def fault(self, kind: str, router: Supervisor) -> FaultRecord:
        began = time.monotonic()
        if kind == "driver":
            router.kill()
            time.sleep(5)  # the supervisor restarts it
        elif kind == "broker":
            broker = self.leader_of_partition_0()
            pid = kafka_broker.running_pid(broker)
            assert pid is not None, "the broker is not running"
            os.kill(pid, signal.SIGKILL)
            time.sleep(self.rng.uniform(10, 30))
            kafka_broker.start(broker)
        else:
            self.postgres.stop(mode="immediate")
            time.sleep(self.rng.uniform(30, 60))
            self.postgres.start()
        back = time.monotonic()
        record = FaultRecord(kind, round(began - self.started, 1), round(back - began, 1), None)
        record.recovered_after = self.caught_up_after(back)
        return record

    def run(self) -> SoakReport:
        status = self.stack.up()
        try:
            return self._run(status.bootstrap_servers)
        finally:
            self.stack.down()

    def _run(self, bootstrap: str) -> SoakReport:
        self.bootstrap = bootstrap
        traffic = Traffic(bootstrap, self.args.rate)
        router = Supervisor(
            [sys.executable, "-m", "bergstream", "router", "run", "--topic", TOPIC,
             "--config", str(self.router_config(bootstrap))],
            self.work / "router.log",
        )  # fmt: skip
        try:
            traffic.start()
            time.sleep(3)  # the topic exists
            router.start()
            end = self.started + self.args.minutes * 60
            self.caught_up_after(time.monotonic())
            while True:
                wait = self.rng.uniform(self.args.fault_min, self.args.fault_max)
                if time.monotonic() + wait > end:
                    break
                self.watch(wait)
                kind = self.next_fault()
                log.info("%6.0fs: fault %s", self.elapsed(), kind)
                record = self.fault(kind, router)
                self.report.faults.append(record)
                log.info("%6.0fs: %s away %.0fs, router caught up %s s after", self.elapsed(), kind,
                         record.lasted, record.recovered_after)  # fmt: skip
            self.watch(max(0.0, end - time.monotonic()))
            traffic.stop()
            log.info("%6.0fs: producer stopped; draining", self.elapsed())
            self.caught_up_after(time.monotonic())
            drained_by = time.monotonic() + 600
            while self.lag() != 0 and time.monotonic() < drained_by:
                time.sleep(2)
        finally:
            traffic.stop()
            if self._lag_client is not None:
                self._lag_client.close()
            code = router.stop()
            log.info("router stopped with exit code %s", code)
        self.report.router_restarts = router.restarts
        self.prove(bootstrap)
        return self.report

    def prove(self, bootstrap_servers: str) -> None:
        expected = kafka_offsets(bootstrap_servers)
        rows = archived(self.catalog, TOPIC)
        dead = archived(self.catalog, f"{TOPIC}__dlq")
        seen = rows + dead
        report = self.report
        report.produced, report.archived, report.dead_lettered = len(expected), len(rows), len(dead)
        report.duplicates = len(seen) - len(set(seen))
        report.lost = len(expected - set(seen))
        strays = set(seen) - expected
        if strays:
            raise AssertionError(f"{len(strays)} archived offsets are not in Kafka")


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}"


def plot(report: SoakReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(11, 4))
    if report.lag:
        times, behind = zip(*report.lag, strict=True)
        axes.plot([t / 60 for t in times], behind, linewidth=0.8, color="black")
    colours = {"driver": "tab:red", "broker": "tab:blue", "catalog": "tab:green"}
    for fault in report.faults:
        axes.axvspan(fault.started / 60, (fault.started + fault.lasted) / 60, color=colours[fault.kind],
                     alpha=0.3, label=fault.kind)  # fmt: skip
    handles, labels = axes.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axes.legend(unique.values(), unique.keys(), loc="upper right")
    axes.set_xlabel("minutes")
    axes.set_ylabel("records behind Kafka")
    axes.set_title(f"soak: {report.rate:,} events/s, {len(report.faults)} faults, {report.lost} lost, "
                   f"{report.duplicates} duplicated")  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=int, default=2000, help="events per second")
    parser.add_argument("--brokers", type=int, default=3, choices=(1, 3))
    parser.add_argument("--fault-min", type=float, default=120, help="seconds between faults, at least")
    parser.add_argument("--fault-max", type=float, default=180, help="seconds between faults, at most")
    parser.add_argument("--faults", nargs="+", default=["driver", "broker", "catalog"],
                        choices=["driver", "broker", "catalog"])  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    OUT.mkdir(parents=True, exist_ok=True)
    with bench_home("soak") as work:
        try:
            with postgres_server() as postgres:
                report = Soak(args, work, postgres).run()
        finally:
            if (work / "router.log").exists():
                shutil.copy(work / "router.log", OUT / "router.log")
    (OUT / "soak.json").write_text(json.dumps(asdict(report), indent=1))
    plot(report, OUT / "soak.png")
    by_kind = Counter(fault.kind for fault in report.faults)
    recovered = [f.recovered_after for f in report.faults if f.recovered_after is not None]
    print(f"soak on {report.machine}: {report.minutes:.0f} min at {report.rate:,} events/s, "
          f"{report.brokers} broker(s)")  # fmt: skip
    print(f"  faults survived: {len(report.faults)} ({', '.join(f'{k} {n}' for k, n in by_kind.items())}); "
          f"router restarts {report.router_restarts}")  # fmt: skip
    for fault in report.faults:
        print(f"    {fault.started / 60:5.1f} min  {fault.kind:8} away {fault.lasted:5.1f} s, "
              f"caught up {fault.recovered_after} s after")  # fmt: skip
    if recovered:
        print(f"  lag recovered after a fault: median {sorted(recovered)[len(recovered) // 2]:.1f} s, "
              f"max {max(recovered):.1f} s")  # fmt: skip
    print(f"  records in Kafka {report.produced:,}: archived {report.archived:,}, dead-lettered "
          f"{report.dead_lettered:,}; lost {report.lost}, duplicated {report.duplicates}")  # fmt: skip
    print(f"  wrote {OUT / 'soak.json'} and {OUT / 'soak.png'}")
    if report.lost or report.duplicates or len(recovered) < len(report.faults):
        sys.exit(1)


if __name__ == "__main__":
    main()
