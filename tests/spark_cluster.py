"""A Spark standalone master and one worker on 127.0.0.1, from the scripts that ship with pyspark."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bergstream.errors import StackError
from bergstream.jars import spark_home_jars
from bergstream.local import processes

READY_TIMEOUT_SECONDS = 90.0


def _spark_class() -> str:
    return str(spark_home_jars().parent / "bin" / "spark-class")


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_HOME": str(spark_home_jars().parent)}
    with log.open("ab") as out:
        return subprocess.Popen(
            [_spark_class(), *args], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )  # fmt: skip


EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


@dataclass(frozen=True)
class SparkCluster:
    master_url: str
    ui_url: str
    work_dir: Path

    def state(self) -> dict[str, Any]:
        """The master's view of the cluster: workers, active and completed applications."""
        with urllib.request.urlopen(f"{self.ui_url}/json", timeout=5) as answer:
            state: dict[str, Any] = json.load(answer)
        return state

    def executor_pids(self) -> list[int]:
        """The executors this cluster's worker runs now: their working folders are under its work dir.

        An executor that starts a process (Hadoop's local file system runs `chmod`) has, for a moment, a
        forked child with its command line and folder; a process whose parent is an executor is not one."""
        parents: dict[int, int] = {}
        for process in psutil.process_iter():
            try:
                command = process.cmdline()
                folder = Path(process.cwd())
                parent = process.ppid()
            except (psutil.NoSuchProcess, psutil.AccessDenied):  # ended meanwhile, or not ours to read
                continue
            if EXECUTOR_CLASS in command and folder.is_relative_to(self.work_dir):
                parents[process.pid] = parent
        return sorted(pid for pid, parent in parents.items() if parent not in parents)

    def answers(self) -> bool:
        try:
            self.state()
        except OSError:
            return False
        return True

    def alive_workers(self) -> int:
        try:
            workers = self.state().get("workers", [])
        except OSError:
            return 0
        return sum(1 for worker in workers if worker.get("state") == "ALIVE")


@contextmanager
def spark_cluster(
    home: Path, worker_cores: int = 1, worker_memory: str = "1g", workers: int = 1
) -> Iterator[SparkCluster]:
    """Yield the cluster once its worker (`workers`: 1 or 0) has registered with the master, or the master
    answers; stop them after."""
    home.mkdir(parents=True, exist_ok=True)
    port, ui_port, worker_ui_port = processes.free_ports(3)
    cluster = SparkCluster(
        master_url=f"spark://127.0.0.1:{port}",
        ui_url=f"http://127.0.0.1:{ui_port}",
        work_dir=(home / "work").resolve(),
    )
    master_url = cluster.master_url
    started = [
        _start(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
            home / "master.log",
        ),
    ]
    if workers:
        started.append(_start(["org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                "--cores", str(worker_cores), "--memory", worker_memory, "--webui-port", str(worker_ui_port),
                "--work-dir", str(cluster.work_dir)], home / "worker.log"))  # fmt: skip
    try:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not (cluster.alive_workers() >= workers and cluster.answers()):
            if time.monotonic() > deadline or any(p.poll() is not None for p in started):
                raise StackError(
                    f"the Spark standalone cluster at {master_url} did not get a worker; "
                    f"see {home / 'master.log'} and {home / 'worker.log'}"
                )
            time.sleep(0.5)
        yield cluster
    finally:
        for process in reversed(started):
            processes.stop(process.pid, grace_seconds=10)
            process.wait()
