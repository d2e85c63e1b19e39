"""An Iceberg REST catalog: Iceberg's own server (`org.apache.iceberg.rest.RESTCatalogServer`), run from
the jars pinned in jvm/pom.xml (profile rest-catalog).

The server keeps its tables in a JDBC catalog on a SQLite file of the stack and is configured by
`CATALOG_*` environment variables, as Iceberg's REST fixture image is: `CATALOG_URI`, `CATALOG_WAREHOUSE`,
`CATALOG_IO__IMPL`, `CATALOG_S3_ENDPOINT`, ... (`_` stands for `.`, `__` for `-`). Its warehouse is the
stack's: a folder, or the object store's bucket through S3FileIO. The object store's keys reach it as
AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, which S3FileIO reads when the catalog names no keys: the
server logs its catalog properties when it starts, and a secret among them would be in its log.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from bergstream import jars
from bergstream.errors import StackError, require_tool
from bergstream.local import processes

MAIN_CLASS = "org.apache.iceberg.rest.RESTCatalogServer"
DEFAULT_PORT = 8181
READY_TIMEOUT_SECONDS = 90.0
# Catalog properties that go to the server as AWS_* variables instead of CATALOG_* ones.
_AWS_ENVIRONMENT = {"s3.access-key-id": "AWS_ACCESS_KEY_ID", "s3.secret-access-key": "AWS_SECRET_ACCESS_KEY"}


@dataclass(frozen=True)
class RestCatalogConfig:
    home: Path
    warehouse: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    # Iceberg catalog properties of the warehouse's storage (io-impl, s3.endpoint, ...).
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def uri(self) -> str:
        return processes.http_url(self.host, self.port)

    @property
    def database(self) -> Path:
        return self.home / "catalog.db"

    @property
    def pid_file(self) -> Path:
        return self.home / "rest-catalog.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "rest-catalog.log"

    def environment(self) -> dict[str, str]:
        """The server's settings, as RESTCatalogServer reads them."""
        settings = {
            "uri": f"jdbc:sqlite:{self.database}",
            "jdbc.schema-version": "V1",
            "warehouse": self.warehouse,
            "rest.port": str(self.port),
            **{key: value for key, value in self.properties.items() if key not in _AWS_ENVIRONMENT},
        }
        variables = {_variable(key): value for key, value in settings.items()}
        for key, value in self.properties.items():
            if key in _AWS_ENVIRONMENT:
                variables[_AWS_ENVIRONMENT[key]] = value
        return variables


def _variable(key: str) -> str:
    """The CATALOG_* variable of a catalog property: `-` is `__`, `.` is `_` (s3.path-style-access:
    CATALOG_S3_PATH__STYLE__ACCESS)."""
    return "CATALOG_" + key.replace("-", "__").replace(".", "_").upper()


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    return require_tool("java", "run the Iceberg REST catalog (install OpenJDK 17 or newer)")


def running_pid(config: RestCatalogConfig) -> int | None:
    return processes.running_pid(config.pid_file, f"-Djava.io.tmpdir={config.home}")


def start(config: RestCatalogConfig) -> int:
    """Start the server in the background and return its pid once it answers GET /v1/config."""
    if processes.port_in_use(config.host, config.port):
        raise StackError(
            f"port {config.port} on {config.host} is already in use; choose another with --rest-port"
        )
    classpath = os.pathsep.join(str(jar) for jar in jars.rest_catalog_classpath())
    config.home.mkdir(parents=True, exist_ok=True)
    # Only what the server needs from this environment: no CATALOG_* or AWS_* setting of the caller's.
    inherited = {key: value for key, value in os.environ.items() if not key.startswith(("CATALOG_", "AWS_"))}
    command = [
        _java(), "-Xmx512m", "-Djava.awt.headless=true",
        # The pid file's marker, and where the server's own scratch files go.
        f"-Djava.io.tmpdir={config.home}", "-cp", classpath, MAIN_CLASS,
    ]  # fmt: skip

    def ready(process: subprocess.Popen[bytes]) -> None:
        processes.wait_until_answers(
            "the Iceberg REST catalog", f"{config.uri}/v1/config", process, config.log_file,
            READY_TIMEOUT_SECONDS, any_status=False,
        )  # fmt: skip

    environment = {**inherited, **config.environment()}
    return processes.start_server(command, environment, config.log_file, config.pid_file, ready)


def stop(config: RestCatalogConfig, grace_seconds: float = 10.0) -> bool:
    """Stop the server; False when none was running."""
    pid = running_pid(config)
    if pid is not None and not processes.stop(pid, grace_seconds):
        raise StackError(
            f"the Iceberg REST catalog (pid {pid}) did not stop, even on SIGKILL; {config.pid_file} is kept"
        )
    config.pid_file.unlink(missing_ok=True)
    return pid is not None
