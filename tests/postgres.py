"""A throwaway PostgreSQL server on 127.0.0.1, from the machine's PostgreSQL binaries, for a JDBC catalog."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from bergstream.errors import MissingToolError, StackError
from bergstream.local.processes import free_port

USER = "bergstream"


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    database: str
    home: Path

    @property
    def jdbc_uri(self) -> str:
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.database}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.home} -c listen_addresses={self.host} -c fsync=off"
        _run([_binary("pg_ctl"), "-D", str(self.data_dir), "-o", options, "-l", str(self.home / "server.log"),
              "-w", "start"], f"starting PostgreSQL on {self.host}:{self.port}")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; mode `immediate` ends it the way a crash would, without a checkpoint."""
        _run([_binary("pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "stop"],
             f"stopping PostgreSQL on {self.host}:{self.port}")  # fmt: skip

    def sql(self, statement: str) -> str:
        """Run `statement` in the database as user bergstream; its output, unaligned."""
        done = subprocess.run(
            [_binary("psql"), "-h", self.host, "-p", str(self.port), "-U", USER, "-d", self.database,
             "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", statement],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            where = f"{self.host}:{self.port}/{self.database}"
            raise StackError(f"psql on {where}: {done.stderr.strip()[-2000:]}")
        return done.stdout

    def pause(self) -> None:
        """The server stops answering, its connections open: a database stalled, not down."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, number: signal.Signals) -> None:
        postmaster = psutil.Process(int((self.data_dir / "postmaster.pid").read_text().split()[0]))
        for process in [postmaster, *postmaster.children(recursive=True)]:
            process.send_signal(number)


def _binary(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise MissingToolError(
            f"'{name}' was not found; install PostgreSQL (Debian: apt-get install postgresql)"
        )
    return found


def _as_server_user(command: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; Debian's package provides the `postgres` account for it.
    if os.geteuid() != 0:
        return command
    try:
        pwd.getpwnam("postgres")
    except KeyError as error:
        raise StackError("running as root needs the 'postgres' account to start PostgreSQL") from error
    return ["runuser", "-u", "postgres", "--", *command]


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(_as_server_user(command), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise StackError(f"{what} failed: {(done.stdout + done.stderr).strip()[-2000:]}")


@contextmanager
def postgres_server(database: str = "iceberg", host: str = "127.0.0.1") -> Iterator[PostgresServer]:
    """Start a server that trusts user `bergstream`, yield it, then stop and delete it."""
    home = Path(tempfile.mkdtemp(prefix="bergstream-postgres-"))
    if os.geteuid() == 0:
        postgres_account = pwd.getpwnam("postgres")
        os.chown(home, postgres_account.pw_uid, postgres_account.pw_gid)
    server = PostgresServer(host, free_port(host), database, home)
    try:
        _run([_binary("initdb"), "-D", str(server.data_dir), "-U", USER, "--auth=trust", "-E", "UTF8"],
             f"initdb in {server.data_dir}")  # fmt: skip
        server.start()
        try:
            _run([_binary("createdb"), "-h", host, "-p", str(server.port), "-U", USER, database],
                 f"creating database {database}")  # fmt: skip
            yield server
        finally:
            if (server.data_dir / "postmaster.pid").exists():
                server.stop()
    finally:
        shutil.rmtree(home, ignore_errors=True)
