"""An S3 object store on the loopback interface: the Versity S3 Gateway (versitygw) over a folder.

versitygw is built once from the Go module proxy with `go install`, at the version pinned here, into the
cache beside the jars. It serves a folder of the stack as S3 (each sub-folder a bucket), with one root
user whose keys are made on the first `up` and kept in a file of the owner's. The stack's warehouse is then
`s3://<bucket>/warehouse`, reached by Iceberg's S3FileIO (Spark, the REST catalog server) and pyarrow's
S3FileSystem (pyiceberg) with path-style requests.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from bergstream.errors import StackError
from bergstream.local import processes
from bergstream.local.go_install import GoProgram

VERSITYGW_PACKAGE = "github.com/versity/versitygw/cmd/versitygw"
VERSITYGW_VERSION = "v1.8.0"
# "1.25": the Go release versitygw's go.mod asks for; older ones cannot build it.
VERSITYGW = GoProgram("versitygw", VERSITYGW_PACKAGE, "1.25", version=VERSITYGW_VERSION)
DEFAULT_PORT = 7070
DEFAULT_BUCKET = "bergstream"
REGION = "us-east-1"
ACCESS_KEY_ID = "bergstream"
READY_TIMEOUT_SECONDS = 30.0
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"


def binary() -> Path:
    """Where the pinned versitygw is built: the cache beside the jars."""
    return VERSITYGW.binary


def installed() -> bool:
    return VERSITYGW.installed()


def install() -> Path:
    """Build the pinned versitygw with `go install`, once; a no-op when the cache has it."""
    return VERSITYGW.install()


@dataclass(frozen=True)
class ObjectStoreConfig:
    home: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    bucket: str = DEFAULT_BUCKET

    @property
    def endpoint(self) -> str:
        return processes.http_url(self.host, self.port)

    @property
    def warehouse(self) -> str:
        return f"s3://{self.bucket}/warehouse"

    @property
    def root(self) -> Path:
        """The folder versitygw serves: one sub-folder per bucket."""
        return self.home / "data"

    @property
    def pid_file(self) -> Path:
        return self.home / "versitygw.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "versitygw.log"

    @property
    def credentials_file(self) -> Path:
        return self.home / "credentials.json"

    def secret_access_key(self) -> SecretStr:
        """The root user's secret key, made on first use; the file is readable by its owner alone."""
        if not self.credentials_file.exists():
            self.home.mkdir(parents=True, exist_ok=True)
            made = {"access_key_id": ACCESS_KEY_ID, "secret_access_key": secrets.token_urlsafe(24)}
            descriptor = os.open(self.credentials_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as out:
                json.dump(made, out)
        return SecretStr(json.loads(self.credentials_file.read_text())["secret_access_key"])

    def catalog_properties(self) -> dict[str, str]:
        """The Iceberg catalog properties that reach this store, under Iceberg's names."""
        return {
            "io-impl": S3_FILE_IO,
            "s3.endpoint": self.endpoint,
            "s3.path-style-access": "true",
            "s3.access-key-id": ACCESS_KEY_ID,
            "s3.secret-access-key": self.secret_access_key().get_secret_value(),
            "client.region": REGION,
        }


def running_pid(config: ObjectStoreConfig) -> int | None:
    return processes.running_pid(config.pid_file, str(config.root))


def start(config: ObjectStoreConfig) -> int:
    """Start versitygw in the background, wait until it answers, and make the bucket when new."""
    if processes.port_in_use(config.host, config.port):
        raise StackError(
            f"port {config.port} on {config.host} is already in use; choose another with --object-store-port"
        )
    versitygw = install()
    config.root.mkdir(parents=True, exist_ok=True)
    secret = config.secret_access_key().get_secret_value()
    # The keys go in the environment, not on the command line that every user of the machine can read.
    environment = {**os.environ, "ROOT_ACCESS_KEY_ID": ACCESS_KEY_ID, "ROOT_SECRET_ACCESS_KEY": secret}
    command = [
        str(versitygw), "--port", f"{config.endpoint.removeprefix('http://')}", "--region", REGION, "--quiet",
        "posix", str(config.root),
    ]  # fmt: skip

    def ready(process: subprocess.Popen[bytes]) -> None:
        # An unsigned request gets an S3 error document: it is serving.
        processes.wait_until_answers(
            "versitygw", config.endpoint, process, config.log_file, READY_TIMEOUT_SECONDS
        )
        ensure_bucket(config)

    return processes.start_server(command, environment, config.log_file, config.pid_file, ready)


def ensure_bucket(config: ObjectStoreConfig) -> None:
    """Make the bucket through the S3 API unless it is there."""
    from pyarrow.fs import FileType, S3FileSystem

    filesystem = S3FileSystem(
        access_key=ACCESS_KEY_ID, secret_key=config.secret_access_key().get_secret_value(),
        endpoint_override=config.endpoint, region=REGION, allow_bucket_creation=True,
    )  # fmt: skip
    if filesystem.get_file_info(config.bucket).type == FileType.NotFound:
        filesystem.create_dir(config.bucket)


def stop(config: ObjectStoreConfig, grace_seconds: float = 10.0) -> bool:
    """Stop versitygw; False when none was running."""
    pid = running_pid(config)
    if pid is not None and not processes.stop(pid, grace_seconds):
        raise StackError(f"versitygw (pid {pid}) did not stop, even on SIGKILL; {config.pid_file} is kept")
    config.pid_file.unlink(missing_ok=True)
    return pid is not None
