"""Go programs the local stack and its checks run, built once from the Go module proxy into the cache beside
the jars: a main package at a pinned version with `go install`, or one pinned by a module folder of
bergstream's (its go.mod and go.sum) with `go build`."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bergstream import jars
from bergstream.errors import BergstreamError, MissingToolError, require_tool

_GO_VERSION = re.compile(r"go(\d+)\.(\d+)")


def require_go(needed: str, program: str) -> str:
    """The `go` command on the PATH, when it is Go `needed` ("1.25") or newer; MissingToolError otherwise.
    GOTOOLCHAIN=local in every build: a Go too old never downloads another."""
    go = require_tool("go", f"build {program} (Go {needed} or newer)")
    found = subprocess.run(
        [go, "env", "GOVERSION"], capture_output=True, text=True, check=False
    ).stdout.strip()
    match = _GO_VERSION.match(found)
    wanted = tuple(int(part) for part in needed.split("."))
    if match is None or (int(match.group(1)), int(match.group(2))) < wanted:
        raise MissingToolError(
            f"'{go}' is {found or 'of an unknown version'}; building {program} needs Go {needed} or newer"
        )
    return go


@dataclass(frozen=True)
class GoProgram:
    """The main package `package`, built by Go `go_needed` or newer with build `tags`: at module
    `version` (`go install package@version`), or, given `module`, at the versions that folder's go.mod and
    go.sum pin."""

    name: str
    package: str
    go_needed: str
    version: str | None = None
    module: Path | None = None
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.version is None) == (self.module is None):
            raise ValueError(f"{self.name}: give a version or a module folder, one of them")

    @property
    def binary(self) -> Path:
        return jars.cache_root().parent / self.name / self._pin() / self.package.rsplit("/", 1)[-1]

    def _pin(self) -> str:
        built_with = "".join(f"+{tag}" for tag in self.tags)
        if self.module is None:
            assert self.version is not None
            return self.version + built_with
        digest = hashlib.sha256((self.module / "go.mod").read_bytes())
        digest.update((self.module / "go.sum").read_bytes())
        return digest.hexdigest()[:12] + built_with

    def installed(self) -> bool:
        return self.binary.exists()

    def install(self) -> Path:
        """Build the program, once; a no-op when the cache has it. A second process building it at the same
        time (another pytest worker, the tests of another Python) waits for the first's binary."""
        target = self.binary
        if target.exists():
            return target
        go = require_go(self.go_needed, self.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        with (target.parent / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():
                self._build(go, target)
        return target

    def _build(self, go: str, target: Path) -> None:
        staging = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
        environment = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false"}
        tags = [f"-tags={','.join(self.tags)}"] if self.tags else []
        if self.module is None:
            command = [go, "install", *tags, f"{self.package}@{self.version}"]
            environment["GOBIN"] = str(staging)
        else:
            # A copy of the module folder: go never writes into bergstream's own files.
            for name in ("go.mod", "go.sum"):
                shutil.copy(self.module / name, staging / name)
            command = [go, "build", "-trimpath", *tags, "-o", str(staging / target.name), self.package]
            environment.update(GOFLAGS="-mod=readonly -buildvcs=false", CGO_ENABLED="0")
        try:
            done = subprocess.run(
                command, cwd=staging, capture_output=True, text=True, check=False, env=environment
            )
            if done.returncode != 0:
                output = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
                reason = next((line for line in reversed(output) if "go:" in line or "error" in line.lower()),
                              output[-1] if output else "no output")  # fmt: skip
                raise BergstreamError(f"`{' '.join(command[1:])}` for {self.name} failed: {reason[:400]}")
            (staging / target.name).rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


# Prometheus 3's promtool (the Go module's v0.3xx tags are Prometheus 3.xx), which checks the alert rules and
# the scrape configuration as Debian's Prometheus 2 promtool does. Built without the cloud service
# discoveries (Prometheus's remove_all_sd tag; file, HTTP and Kubernetes stay): bergstream's scrape
# configurations name static targets, and the build takes 90 s instead of 216 s and half the downloads.
PROMTOOL_3 = GoProgram(
    "promtool",
    "github.com/prometheus/prometheus/cmd/promtool",
    "1.25",
    version="v0.316.0",
    tags=("remove_all_sd",),
)
