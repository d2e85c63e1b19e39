"""Background processes with pid files, and ports on the loopback interface."""

from __future__ import annotations

import errno
import fcntl
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

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
    """`count` distinct ports that nothing listens on now (all held open until all are chosen).

    They are drawn at random below the kernel's ephemeral range: a port of that range, free when chosen, can
    be taken a moment later by any outgoing connection before its server binds it.
    """
    probes: list[socket.socket] = []
    chosen: list[int] = []
    candidates = _unassigned_ports()
    try:
        while len(chosen) < count:
            probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            probes.append(probe)
            port = next(candidates, 0)
            try:
                probe.bind((host, port))
            except OSError as error:
                if error.errno != errno.EADDRINUSE or port == 0:
                    raise
                continue
            chosen.append(int(probe.getsockname()[1]))
        return chosen
    finally:
        for probe in probes:
            probe.close()


# Below the ephemeral ranges of Linux (32768 on) and macOS (49152 on): no outgoing connection takes one.
_UNASSIGNED = range(10000, 32768)


def _unassigned_ports() -> Iterator[int]:
    """A few hundred ports below the kernels' ephemeral ranges, in a random order."""
    return (random.choice(_UNASSIGNED) for _ in range(300))


def alive(pid: int) -> bool:
    """Whether process `pid` runs; a zombie left by a parent that has not reaped it yet does not."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's: it exists
        return True


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
        command_line = " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
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


def http_url(host: str, port: int) -> str:
    """http://host:port, with an IPv6 host in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def answers(request: str | urllib.request.Request, any_status: bool = True) -> bool:
    """Whether an HTTP server answers `request`: with any status, or only with a success."""
    try:
        urllib.request.urlopen(request, timeout=2).close()
    except urllib.error.HTTPError:
        return any_status
    except OSError:
        return False
    return True


def wait_until_answers(
    name: str,
    request: str | urllib.request.Request,
    process: subprocess.Popen[bytes],
    log_file: Path,
    timeout: float,
    any_status: bool = True,
) -> None:
    """Wait until the server `process` runs answers `request`; a StackError naming it and quoting its log
    when it exits first or stays silent past `timeout` seconds."""
    url = request if isinstance(request, str) else request.full_url
    deadline = time.monotonic() + timeout
    while not answers(request, any_status):
        if process.poll() is not None:
            raise StackError(
                f"{name} exited with code {process.returncode} while starting; "
                f"{last_error(log_file)} (see {log_file})"
            )
        if time.monotonic() > deadline:
            raise StackError(
                f"{name} did not answer on {url} within {timeout:.0f}s; "
                f"{last_error(log_file)} (see {log_file})"
            )
        time.sleep(0.2)


def start_server(
    command: list[str],
    environment: dict[str, str],
    log_file: Path,
    pid_file: Path,
    ready: Callable[[subprocess.Popen[bytes]], None],
) -> int:
    """Start a server in a session of its own, its output in `log_file` and its pid in `pid_file`, then
    `ready(process)`, which waits for it; a server that never gets ready is stopped again. Its pid."""
    with log_file.open("ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environment,
            start_new_session=True,
        )  # fmt: skip
    pid_file.write_text(str(process.pid))
    try:
        ready(process)
    except BaseException:
        stop(process.pid, grace_seconds=5)
        process.wait()
        pid_file.unlink(missing_ok=True)
        raise
    return process.pid
