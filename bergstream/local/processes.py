"""Background processes with pid files, and ports on the loopback interface."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bergstream.errors import StackError


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return True
            raise StackError(f"cannot use {host}:{port}: {error.strerror}") from error
    return False


def free_port(host: str = "127.0.0.1") -> int:
    (port,) = free_ports(1, host)
    return port


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that nothing listens on now (all held open until all are chosen)."""
    probes = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for probe in probes:
            probe.bind((host, 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie left by a parent that has not reaped it yet is not running.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def running_pid(pid_file: Path, command_marker: str) -> int | None:
    """The pid in `pid_file` if that process runs and its command line holds `command_marker`.

    The marker tells our process from an unrelated one that got the same pid after a reboot.
    """
    pid = read_pid(pid_file)
    if pid is None or not alive(pid):
        return None
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return pid if command_marker in command_line else None


def stop(pid: int, grace_seconds: float) -> bool:
    """SIGTERM the process group, then SIGKILL it once the grace period is over; False if it survives."""
    for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive(pid):
                return True
            time.sleep(0.2)
    return False


@contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Serialise commands that start or stop the same stack."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def last_error(log_file: Path) -> str:
    """The last line of a log that reports an error (else its last line), to quote in a one-line message."""
    try:
        lines = [line.strip() for line in log_file.read_text(errors="replace").splitlines() if line.strip()]
    except FileNotFoundError:
        return "(no log written)"
    errors = [line for line in lines if " ERROR " in line or "Exception" in line]
    return (errors or lines or ["(empty log)"])[-1][:300]
