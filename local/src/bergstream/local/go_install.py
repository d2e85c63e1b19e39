"""Go programs the local stack and its checks run, built once with `go install` from the Go module proxy at a
pinned version, into the cache beside the jars."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bergstream import jars
from bergstream.errors import BergstreamError


@dataclass(frozen=True)
class GoProgram:
    """`package` (a main package's import path) at module `version`, built by Go `go_needed` or newer."""

    name: str
    package: str
    version: str
    go_needed: str

    @property
    def binary(self) -> Path:
        return jars.cache_root().parent / self.name / self.version / self.package.rsplit("/", 1)[-1]

    def installed(self) -> bool:
        return self.binary.exists()

    def install(self) -> Path:
        """Build the program with `go install`, once; a no-op when the cache has it."""
        target = self.binary
        if target.exists():
            return target
        go = jars.require_tool("go", f"build {self.name} (Go {self.go_needed} or newer)")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
        # GOTOOLCHAIN=local: a Go too old for the program says so, instead of downloading another Go.
        environment = {
            **os.environ,
            "GOBIN": str(staging),
            "GOTOOLCHAIN": "local",
            "GOFLAGS": "-buildvcs=false",
        }
        command = f"go install {self.package}@{self.version}"
        try:
            done = subprocess.run(
                [go, "install", f"{self.package}@{self.version}"],
                capture_output=True, text=True, check=False, env=environment,
            )  # fmt: skip
            if done.returncode != 0:
                output = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
                reason = next((line for line in reversed(output) if "go:" in line or "error" in line.lower()),
                              output[-1] if output else "no output")  # fmt: skip
                raise BergstreamError(f"`{command}` failed: {reason[:400]}")
            with contextlib.suppress(OSError):  # another build finished first: its binary is as good
                (staging / target.name).rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target


# Prometheus 3's promtool (the Go module's v0.3xx tags are Prometheus 3.xx), which checks the alert rules and
# the scrape configuration as Debian's Prometheus 2 promtool does.
PROMTOOL_3 = GoProgram("promtool", "github.com/prometheus/prometheus/cmd/promtool", "v0.316.0", "1.25")
