"""bench/router's CPU accounting from /proc: the only logic of the bench worth a test of its own."""

import subprocess
import sys
from pathlib import Path

import pytest

from bench.router.cpu import CpuClock, ProcessGone, command_name, cpu_ticks, java_children, parent_pid

# A command name with a space and a closing parenthesis, which a naive split of the line gets wrong.
STAT = "4242 (java (x) y) S 17 4242 17 0 -1 4194560 900 0 0 0 1234 567 0 0 20 0 58 0 3211032 0 0"


def test_stat_fields_are_read_after_the_command_name() -> None:
    assert cpu_ticks(STAT) == 1234 + 567
    assert parent_pid(STAT) == 17
    assert command_name(STAT) == "java (x) y"


def test_java_children_are_the_jvms_of_that_parent(tmp_path: Path) -> None:
    for pid, name, parent in ((10, "java", 1), (11, "java", 2), (12, "python3", 1), (13, "java", 1)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({name}) S {parent} 0 0 0 -1 0 0 0 0 0 5 6 0 0")
    (tmp_path / "self").mkdir()
    assert sorted(java_children(1, tmp_path)) == [10, 13]
    # A Spark driver and a broker, both started by the bench: only the driver does the writer's work.
    (tmp_path / "10" / "cmdline").write_bytes(
        b"java\0-cp\0jars\0org.apache.spark.deploy.SparkSubmit\0pyspark-shell\0"
    )
    (tmp_path / "13" / "cmdline").write_bytes(b"java\0-cp\0jars\0kafka.Kafka\0server.properties\0")
    assert java_children(1, tmp_path, main_class="org.apache.spark.deploy.SparkSubmit") == [10]


def _child(code: str) -> subprocess.Popen[str]:
    """A Python child that runs `code`, says so, then waits for its stdin to close."""
    script = f"import sys, time\n{code}\nprint('ready', flush=True)\nsys.stdin.read()"
    return subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def test_the_clock_counts_a_busy_child_and_not_an_idle_one() -> None:
    busy = _child("while time.process_time() < 0.5: pass")
    idle = _child("time.sleep(0.5)")
    try:
        for child in (busy, idle):
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        # Clock ticks: utime and stime each rounded down to 10 ms.
        assert CpuClock((busy.pid,)).seconds() >= 0.45
        assert CpuClock((idle.pid,)).seconds() < 0.4
        assert CpuClock((busy.pid, idle.pid)).seconds() >= CpuClock((busy.pid,)).seconds()
    finally:
        for child in (busy, idle):
            assert child.stdin is not None
            child.stdin.close()
            child.wait()
    with pytest.raises(ProcessGone):
        CpuClock((busy.pid,)).seconds()
