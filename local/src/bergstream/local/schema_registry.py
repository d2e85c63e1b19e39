"""A schema registry on the loopback interface: AxonOps Schema Registry, which serves Confluent's Schema
Registry REST API (subjects, versions, schema ids, compatibility), keeping its schemas in memory.

It is a Go program, built once from the module pinned in schema-registry/go.mod (the Go module proxy
serves it) into the local cache; starting it takes a fraction of a second.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bergstream.errors import BergstreamError, StackError
from bergstream.local import processes
from bergstream.local.go_install import GoProgram

MODULE_DIR = Path(__file__).parent / "schema-registry"
PACKAGE = "github.com/axonops/axonops-schema-registry/cmd/schema-registry"
READY_TIMEOUT_SECONDS = 30.0


def pinned_version(module_dir: Path = MODULE_DIR) -> str:
    """The registry's version, as go.mod requires it."""
    match = re.search(r"^require github\.com/axonops/axonops-schema-registry (\S+)$",
                      (module_dir / "go.mod").read_text(), re.MULTILINE)  # fmt: skip
    if match is None:
        raise BergstreamError(f"{module_dir / 'go.mod'} does not require the AxonOps schema registry")
    return match.group(1)


# The registry's module asks for this Go release or a newer one.
SCHEMA_REGISTRY = GoProgram("schema-registry", PACKAGE, "1.26", module=MODULE_DIR)


def binary_path() -> Path:
    return SCHEMA_REGISTRY.binary


def build() -> Path:
    """The registry's binary, built with `go build` the first time (about two minutes on 2 cores)."""
    return SCHEMA_REGISTRY.install()


@dataclass(frozen=True)
class SchemaRegistryConfig:
    home: Path
    host: str
    port: int
    # With a user, every request must log in with HTTP basic authentication as that user.
    user: str | None = None
    password: str | None = None

    @property
    def url(self) -> str:
        return processes.http_url(self.host, self.port)

    @property
    def pid_file(self) -> Path:
        return self.home / "schema-registry.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "schema-registry.log"

    @property
    def config_file(self) -> Path:
        return self.home / "schema-registry.yaml"


def _settings(config: SchemaRegistryConfig) -> dict[str, object]:
    settings: dict[str, object] = {
        "server": {"host": config.host, "port": config.port},
        "storage": {"type": "memory"},
        "compatibility": {"default_level": "BACKWARD"},
    }
    if config.user is not None:
        settings["security"] = {
            "auth": {
                "enabled": True,
                "methods": ["basic"],
                # The password comes from the environment, never from this file.
                "bootstrap": {"enabled": True, "username": config.user},
                "rbac": {"enabled": True, "default_role": "readonly", "super_admins": [config.user]},
            }
        }
    return settings


def running_pid(config: SchemaRegistryConfig) -> int | None:
    return processes.running_pid(config.pid_file, SCHEMA_REGISTRY.binary.name)


def start(config: SchemaRegistryConfig) -> int:
    """Start the registry in the background and wait until it answers; its pid."""
    binary = build()
    if processes.port_in_use(config.host, config.port):
        raise StackError(
            f"port {config.port} on {config.host} is already in use: pick another --schema-registry-port"
        )
    config.home.mkdir(parents=True, exist_ok=True)
    # YAML is a superset of JSON.
    config.config_file.write_text(json.dumps(_settings(config), indent=2))
    environment = {**os.environ}
    for name in [name for name in environment if name.startswith("SCHEMA_REGISTRY_")]:
        del environment[name]
    if config.user is not None:
        if not config.password:
            raise StackError("a schema registry user needs a password")
        environment["SCHEMA_REGISTRY_BOOTSTRAP_PASSWORD"] = config.password
    request = urllib.request.Request(f"{config.url}/subjects")
    if config.user is not None:
        login = base64.b64encode(f"{config.user}:{config.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {login}")

    def ready(process: subprocess.Popen[bytes]) -> None:
        processes.wait_until_answers(
            "the schema registry", request, process, config.log_file, READY_TIMEOUT_SECONDS
        )

    command = [str(binary), "-config", str(config.config_file)]
    return processes.start_server(command, environment, config.log_file, config.pid_file, ready)


def stop(config: SchemaRegistryConfig) -> bool:
    """Stop the registry; False when it was not running. Its schemas are gone with it."""
    pid = running_pid(config)
    if pid is None:
        return False
    if not processes.stop(pid, grace_seconds=10):
        raise StackError(f"the schema registry (pid {pid}) did not stop")
    config.pid_file.unlink(missing_ok=True)
    return True
