"""The JVM side: jars pinned in jvm/pom.xml, resolved once with Maven into a local cache.

Spark and the broker read the cache; Maven runs only when the cache lacks the pinned set.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bergstream.errors import BergstreamError, MissingToolError

POM = Path(__file__).parent / "jvm" / "pom.xml"
JarSet = Literal["spark", "kafka"]
JAR_SETS: tuple[JarSet, ...] = ("spark", "kafka")
_COMPLETE = ".complete"


@dataclass(frozen=True)
class PinnedVersions:
    spark: str
    iceberg: str
    kafka: str
    scala_binary: str


def pinned_versions(pom: Path = POM) -> PinnedVersions:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    props = ET.parse(pom).getroot().find("m:properties", ns)
    assert props is not None, f"{pom} has no <properties>"

    def prop(name: str) -> str:
        node = props.find(f"m:{name}", ns)
        if node is None or not node.text:
            raise BergstreamError(f"{pom}: property <{name}> is missing")
        return node.text.strip()

    return PinnedVersions(
        spark=prop("spark.version"),
        iceberg=prop("iceberg.version"),
        kafka=prop("kafka.version"),
        scala_binary=prop("scala.binary.version"),
    )


def cache_root() -> Path:
    base = os.environ.get("BERGSTREAM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "bergstream"
    )
    return Path(base) / "jars"


def _pom_digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()[:12]


def jar_dir(jar_set: JarSet, pom: Path = POM) -> Path:
    return cache_root() / _pom_digest(pom) / jar_set


def require_tool(name: str, purpose: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise MissingToolError(
            f"'{name}' was not found on PATH; it is needed to {purpose}. Install it and retry."
        )
    return path


def resolve(jar_set: JarSet, pom: Path = POM) -> Path:
    """Copy one set's jars and their runtime dependencies into the cache; a no-op when already there."""
    target = jar_dir(jar_set, pom)
    if (target / _COMPLETE).exists():
        return target
    mvn = require_tool("mvn", f"resolve the {jar_set} jars pinned in {pom}")
    target.parent.mkdir(parents=True, exist_ok=True)
    # A staging folder of its own, so that two resolves at once cannot spoil each other's files.
    staging = Path(tempfile.mkdtemp(prefix=f".{jar_set}-", dir=target.parent))
    command = [
        mvn, "-q", "-B", "-f", str(pom), "-P", jar_set,
        "dependency:copy-dependencies", "-DincludeScope=runtime", "-Dmdep.useRepositoryLayout=true",
        f"-DoutputDirectory={staging}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        output = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        reason = next((line for line in output if "ERROR" in line), output[-1] if output else "no output")
        raise BergstreamError(f"Maven could not resolve the {jar_set} jars of {pom}: {reason[:400]}")
    (staging / _COMPLETE).write_text(_pom_digest(pom))
    try:
        staging.rename(target)
    except OSError:  # another resolve finished first: its copy is as good
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_all(pom: Path = POM) -> dict[JarSet, Path]:
    return {jar_set: resolve(jar_set, pom) for jar_set in JAR_SETS}


def resolved_jars(jar_set: JarSet, pom: Path = POM) -> list[Path]:
    """The set's jars, in Maven's repository layout: <group path>/<artifact>/<version>/<file>.jar."""
    return sorted(resolve(jar_set, pom).rglob("*.jar"))


def artifact_id(jar: Path) -> str:
    return jar.parent.parent.name


def ships(spark_home_jars: Path, artifact: str) -> bool:
    """Whether Spark's own jars folder has this artifact, in whatever version."""
    prefix = f"{artifact}-"
    return any(
        jar.name.startswith(prefix) and jar.name[len(prefix) : len(prefix) + 1].isdigit()
        for jar in spark_home_jars.glob("*.jar")
    )


def spark_jars(spark_home_jars: Path, pom: Path = POM) -> list[Path]:
    """The jars for spark.jars: the resolved set less the artifacts Spark already ships."""
    return [jar for jar in resolved_jars("spark", pom) if not ships(spark_home_jars, artifact_id(jar))]


def kafka_classpath(pom: Path = POM) -> list[Path]:
    return resolved_jars("kafka", pom)
