"""The local stack's process helpers, on real processes: what `local status` and `local down` rely on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from bergstream.local.processes import alive, running_pid, stop
from tests.routers import eventually

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)", "bergstream-test-sleeper"]


def test_a_running_process_is_alive_and_found_by_its_marker(tmp_path: Path) -> None:
    process = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        pid_file = tmp_path / "sleeper.pid"
        pid_file.write_text(str(process.pid))
        assert alive(process.pid)
        # Forked, the child shows its parent's command line until it has exec'd its own.
        eventually(
            lambda: "bergstream-test-sleeper" in psutil.Process(process.pid).cmdline(), "the sleeper exec'd"
        )
        assert running_pid(pid_file, "bergstream-test-sleeper") == process.pid
        # Another program that got the same pid is not ours.
        assert running_pid(pid_file, "bergstream-kafka") is None
    finally:
        process.kill()
        process.wait()


def test_a_zombie_is_not_alive_and_an_ended_process_is_not_running(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    pid_file = tmp_path / "ended.pid"
    pid_file.write_text(str(process.pid))
    # Not reaped yet: a zombie until wait(). os.waitid with WNOWAIT waits for its end without reaping it.
    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
    assert not alive(process.pid)
    assert running_pid(pid_file, "python") is None
    process.wait()
    assert not alive(process.pid)
    assert running_pid(tmp_path / "missing.pid", "python") is None


def test_stop_ends_the_process_group_and_kills_what_ignores_sigterm() -> None:
    stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(600)"]  # fmt: skip
    process = subprocess.Popen(stubborn, start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    assert stop(process.pid, grace_seconds=0.5)
    assert process.wait(10) == -9
    assert stop(process.pid, grace_seconds=0.5), "a process that is gone already is stopped"


def test_no_module_of_bergstream_reads_linux_proc() -> None:
    """Processes are found and inspected through psutil, so the local stack runs on macOS as well."""
    root = Path(__file__).resolve().parent.parent
    readers = [
        f"{path.relative_to(root)}:{number}"
        for path in root.glob("*/src/bergstream/**/*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if '"/proc' in line or "'/proc" in line or 'Path("/proc' in line
    ]
    assert not readers, f"these lines read /proc: {readers}"
