"""The jars bergstream's JVMs run: those pinned in jvm/pom.xml, resolved once into a local cache, and the
project's own Java (the router's writer of many topics, the strict JSON reader, the backfill source) against
the same Spark and Iceberg; which of them a SparkSession is handed.

An installed bergstream ships its own Java built, as jvm/bergstream-spark.jar; a checkout builds it once per
version of its sources into the cache. Spark and the broker read the cache; the build (maven.py, the same as
the wheel's and the JUnit tests') runs only when the cache lacks what is pinned or built. With
BERGSTREAM_JARS=packages, Spark is handed the pinned coordinates (spark.jars.packages) to resolve itself
instead of the cache's jars.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bergstream import maven
from bergstream.errors import BergstreamError, ConfigError
from bergstream.maven import PARTS, POM, PROJECT_JAR

_NS = maven.NAMESPACE
# Where a wheel carries the jar that setup.py built; a checkout has none there.
SHIPPED_JAR = maven.JVM / PROJECT_JAR
# How Spark gets the pinned jars: "resolved", the cache's files in spark.jars (what the local stack and an
# offline machine need); "packages", their Maven coordinates in spark.jars.packages, for a cluster that
# resolves them from its own repository or mirror.
JARS_ENVIRONMENT = "BERGSTREAM_JARS"
JarSource = Literal["resolved", "packages"]
JarSet = Literal["spark", "kafka", "rest-catalog", "kafka-connect", "iceberg-kafka-connect"]
# What the local stack runs, resolved by `make setup`.
JAR_SETS: tuple[JarSet, ...] = ("spark", "kafka", "rest-catalog")
# A Kafka Connect worker and Iceberg's sink as its plugin, resolved when asked for (bench/router's peer).
ON_DEMAND_JAR_SETS: tuple[JarSet, ...] = ("kafka-connect", "iceberg-kafka-connect")
_COMPLETE = ".complete"


@dataclass(frozen=True)
class PinnedVersions:
    spark: str
    iceberg: str
    kafka: str
    scala_binary: str
    iceberg_rest: str  # Iceberg's REST catalog server (`local up --catalog rest`)


def pinned_versions(pom: Path = POM) -> PinnedVersions:
    props = ET.parse(pom).getroot().find("m:properties", _NS)
    assert props is not None, f"{pom} has no <properties>"

    def prop(name: str) -> str:
        node = props.find(f"m:{name}", _NS)
        if node is None or not node.text:
            raise BergstreamError(f"{pom}: property <{name}> is missing")
        return node.text.strip()

    return PinnedVersions(
        spark=prop("spark.version"),
        iceberg=prop("iceberg.version"),
        kafka=prop("kafka.version"),
        scala_binary=prop("scala.binary.version"),
        iceberg_rest=prop("iceberg-rest.version"),
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


def resolve(jar_set: JarSet, pom: Path = POM) -> Path:
    """Copy one set's jars and their runtime dependencies into the cache; a no-op when already there."""
    target = jar_dir(jar_set, pom)
    if (target / _COMPLETE).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # A staging folder of its own, so that two resolves at once cannot spoil each other's files.
    staging = Path(tempfile.mkdtemp(prefix=f".{jar_set}-", dir=target.parent))
    try:
        maven.copy_dependencies(pom, jar_set, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    (staging / _COMPLETE).write_text(_pom_digest(pom))
    try:
        staging.rename(target)
    except OSError:  # another resolve finished first: its copy is as good
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_all(pom: Path = POM, jar_sets: tuple[JarSet, ...] = JAR_SETS) -> dict[JarSet, Path]:
    return {jar_set: resolve(jar_set, pom) for jar_set in jar_sets}


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


def spark_home_jars() -> Path:
    """The jars Spark itself ships: $SPARK_HOME/jars, or those inside the pyspark package."""
    spark_home = os.environ.get("SPARK_HOME")
    if spark_home:
        return Path(spark_home) / "jars"
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def jar_source() -> JarSource:
    named = os.environ.get(JARS_ENVIRONMENT) or "resolved"
    if named not in ("resolved", "packages"):
        raise ConfigError(f"{JARS_ENVIRONMENT}={named}: it is 'resolved' (the default) or 'packages'")
    return "packages" if named == "packages" else "resolved"


def spark_packages(pom: Path = POM) -> list[str]:
    """The spark set's Maven coordinates (group:artifact:version) as pinned, for spark.jars.packages."""
    root = ET.parse(pom).getroot()
    properties = {
        node.tag.split("}")[1]: (node.text or "").strip() for node in root.findall("m:properties/*", _NS)
    }
    profile = next(
        node
        for node in root.findall("m:profiles/m:profile", _NS)
        if node.findtext("m:id", namespaces=_NS) == "spark"
    )

    def expanded(text: str) -> str:
        return re.sub(r"\$\{([^}]+)\}", lambda name: properties[name.group(1)], text.strip())

    return [
        ":".join(
            expanded(dependency.findtext(f"m:{part}", "", _NS))
            for part in ("groupId", "artifactId", "version")
        )
        for dependency in profile.findall("m:dependencies/m:dependency", _NS)
    ]


def spark_jar_conf(spark_home: Path | None = None, pom: Path = POM) -> dict[str, str]:
    """spark.jars, and with BERGSTREAM_JARS=packages spark.jars.packages: how a SparkSession gets the pinned
    jars and bergstream's own."""
    if jar_source() == "packages":
        return {
            "spark.jars": str(project_jar()),
            "spark.jars.packages": ",".join(spark_packages(pom)),
        }
    return {"spark.jars": ",".join(str(jar) for jar in spark_jars(spark_home, pom))}


def spark_jars(spark_home: Path | None = None, pom: Path = POM) -> list[Path]:
    """The jars for spark.jars: the resolved set less the artifacts Spark already ships, and bergstream's
    own."""
    shipped = spark_home or spark_home_jars()
    pinned = [jar for jar in resolved_jars("spark", pom) if not ships(shipped, artifact_id(jar))]
    return [*pinned, project_jar()]


def project_jar(parts: Path = PARTS) -> Path:
    """bergstream's own Java in one jar: the one an installed bergstream ships, else built by Maven from the
    checkout's modules (maven.package, as `make test` and a wheel build it), once per version of their sources
    and poms, in a folder of its own (two builds at once share no file)."""
    if SHIPPED_JAR.is_file():
        return SHIPPED_JAR
    if not parts.is_file():
        raise BergstreamError(
            f"{SHIPPED_JAR} is missing and there are no Java sources to build it from: "
            "reinstall bergstream from its wheel, or run it from a checkout"
        )
    target = cache_root() / "built" / maven.sources_digest(parts) / PROJECT_JAR
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        built = maven.package(parts, staging)
        with contextlib.suppress(OSError):  # another build finished first: its jar is as good
            built.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def kafka_classpath(pom: Path = POM) -> list[Path]:
    return resolved_jars("kafka", pom)


def rest_catalog_classpath(pom: Path = POM) -> list[Path]:
    return resolved_jars("rest-catalog", pom)
