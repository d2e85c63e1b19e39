"""CPU time of the processes that do a peer's work, from /proc: utime + stime, the broker left out.

Spark runs in the bench's own process through py4j: its work is the Python process and the JVM child it
launched. The Kafka Connect worker is a JVM of its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
# pyspark's gateway runs spark-submit, which execs the driver's JVM with this main class.
SPARK_SUBMIT = "org.apache.spark.deploy.SparkSubmit"


class ProcessGone(Exception):
    """The process exited while its CPU time was being read."""


def stat_fields(stat: str) -> list[str]:
    """The fields of a /proc/<pid>/stat line after the command name, which may hold spaces and
    parentheses: field 3 (state) is element 0."""
    closing = stat.rindex(")")
    return stat[closing + 2 :].split()


def cpu_ticks(stat: str) -> int:
    """utime + stime (fields 14 and 15) of a /proc/<pid>/stat line, in clock ticks."""
    fields = stat_fields(stat)
    return int(fields[11]) + int(fields[12])


def parent_pid(stat: str) -> int:
    return int(stat_fields(stat)[1])


def command_name(stat: str) -> str:
    return stat[stat.index("(") + 1 : stat.rindex(")")]


def _read_stat(pid: int, proc: Path) -> str:
    try:
        return (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError) as error:
        raise ProcessGone(f"process {pid} is gone") from error


def java_children(pid: int, proc: Path = PROC, main_class: str | None = None) -> list[int]:
    """The JVMs that `pid` started; with `main_class`, only those whose command line names it (the
    embedded stack's broker is a JVM child of the bench too)."""
    children = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if parent_pid(stat) != pid or command_name(stat) != "java":
                continue
            if main_class is not None and main_class not in (entry / "cmdline").read_bytes().decode(
                errors="replace"
            ).split("\0"):
                continue
        except OSError:
            continue
        children.append(int(entry.name))
    return children


@dataclass(frozen=True)
class CpuClock:
    """CPU seconds spent so far by a fixed set of processes (all their threads)."""

    pids: tuple[int, ...]
    proc: Path = PROC

    @classmethod
    def spark_in_process(cls) -> CpuClock:
        me = os.getpid()
        jvms = java_children(me, main_class=SPARK_SUBMIT)
        if not jvms:
            raise ProcessGone(f"no Spark JVM child of process {me}: is the Spark session started?")
        return cls((me, *jvms))

    def seconds(self) -> float:
        ticks = sum(cpu_ticks(_read_stat(pid, self.proc)) for pid in self.pids)
        return ticks / os.sysconf("SC_CLK_TCK")
