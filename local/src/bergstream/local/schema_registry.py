"""A schema registry on the loopback interface: AxonOps Schema Registry, which serves Confluent's Schema
Registry REST API (subjects, versions, schema ids, compatibility), keeping its schemas in memory.

It is a Go program, built once from the module pinned in schema-registry/go.mod (the Go module proxy
serves it) into the local cache; starting it takes a fraction of a second.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bergstream import jars
from bergstream.errors import BergstreamError, MissingToolError, StackError
from bergstream.local import processes

MODULE_DIR = Path(__file__).parent / "schema-registry"
PACKAGE = "github.com/axonops/axonops-schema-registry/cmd/schema-registry"
BINARY = "schema-registry"
# The module's go.mod asks for this Go release or a newer one.
MINIMUM_GO = (1, 26)
READY_TIMEOUT_SECONDS = 30.0
_GO_VERSION = re.compile(r"go(\d+)\.(\d+)")


def pinned_version(module_dir: Path = MODULE_DIR) -> str:
    """The registry's version, as go.mod requires it."""
    match = re.search(r"^require github\.com/axonops/axonops-schema-registry (\S+)$",
                      (module_dir / "go.mod").read_text(), re.MULTILINE)  # fmt: skip
    if match is None:
        raise BergstreamError(f"{module_dir / 'go.mod'} does not require the AxonOps schema registry")
    return match.group(1)


def _digest(module_dir: Path) -> str:
    digest = hashlib.sha256((module_dir / "go.mod").read_bytes())
    digest.update((module_dir / "go.sum").read_bytes())
    return digest.hexdigest()[:12]


def binary_path(module_dir: Path = MODULE_DIR) -> Path:
    return jars.cache_root().parent / "schema-registry" / _digest(module_dir) / BINARY


def _require_go() -> str:
    go = jars.require_tool("go", "build the schema registry (Go 1.26 or newer)")
    found = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout
    match = _GO_VERSION.match(found.strip())
    if match is None or (int(match.group(1)), int(match.group(2))) < MINIMUM_GO:
        raise MissingToolError(
            f"'{go}' is {found.strip() or 'of an unknown version'}; the schema registry needs Go "
            f"{'.'.join(map(str, MINIMUM_GO))} or newer"
        )
    return go


def build(module_dir: Path = MODULE_DIR) -> Path:
    """The registry's binary, built with `go build` the first time (about a minute on 2 cores)."""
    target = binary_path(module_dir)
    if target.exists():
        return target
    go = _require_go()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        # A copy of the module: go never writes into bergstream's own folder.
        for name in ("go.mod", "go.sum"):
            shutil.copy(module_dir / name, staging / name)
        # GOTOOLCHAIN=local: a Go too old says so, instead of downloading another Go.
        environment = {**os.environ, "GOFLAGS": "-mod=readonly", "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}
        built = subprocess.run(
            [go, "build", "-trimpath", "-o", str(staging / BINARY), PACKAGE],
            cwd=staging, env=environment, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if built.returncode != 0:
            lines = [line for line in built.stderr.splitlines() if line.strip()]
            raise BergstreamError(
                f"go could not build the schema registry {pinned_version(module_dir)}: "
                f"{(lines or ['no output'])[-1][:400]}"
            )
        with contextlib.suppress(OSError):  # another build finished first: its binary is as good
            (staging / BINARY).rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


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
    return processes.running_pid(config.pid_file, BINARY)


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
