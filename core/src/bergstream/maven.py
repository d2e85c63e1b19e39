"""Maven, the one build of bergstream's JVM side: the pinned jars resolved into a folder, and bergstream's own
Java (a Maven module per part, listed in jvm/parts.xml) packaged into one jar.

Three things run it: a checkout's first use, through the jar cache (jars.py); setup.py, for the jar a wheel
ships; and `make test-jvm`, with the JUnit tests, by the same parts.xml. It imports nothing of bergstream but
its errors, so that setup.py loads it from the checkout before anything is installed.
"""

from __future__ import annotations

import hashlib
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

from bergstream.errors import BergstreamError, require_tool

JVM = Path(__file__).parent / "jvm"
# The pinned versions and, a Maven profile each, the jar sets resolved from them.
POM = JVM / "pom.xml"
# bergstream's own Java, each part's beside its Python, a Maven module each, and the module that puts them in
# one jar handed to every SparkSession.
PARTS = JVM / "parts.xml"
PROJECT_JAR = "bergstream-spark.jar"
NAMESPACE = {"m": "http://maven.apache.org/POM/4.0.0"}


def copy_dependencies(pom: Path, profile: str, target: Path) -> None:
    """The jars of `pom`'s profile and their runtime dependencies, copied into `target` in Maven's repository
    layout (<group path>/<artifact>/<version>/<file>.jar)."""
    mvn = require_tool("mvn", f"resolve the {profile} jars pinned in {pom}")
    command = [
        mvn, "-q", "-B", "-f", str(pom), "-P", profile,
        "dependency:copy-dependencies", "-DincludeScope=runtime", "-Dmdep.useRepositoryLayout=true",
        f"-DoutputDirectory={target}",
    ]  # fmt: skip
    failure = _run(command)
    if failure is not None:
        raise BergstreamError(f"Maven could not resolve the {profile} jars of {pom}: {failure}")


def package(parts: Path, target: Path) -> Path:
    """bergstream's Java, the modules `parts` lists compiled against the pinned Spark and Iceberg, in one jar
    written into the folder `target`; its path."""
    mvn = require_tool("mvn", "build bergstream's Java (Maven, with a JDK 17)")
    command = [
        mvn, "-q", "-B", "-f", str(parts), "-Dmaven.test.skip=true", f"-Dparts.build={target}", "package",
    ]  # fmt: skip
    failure = _run(command, java_errors=True)
    if failure is not None:
        raise BergstreamError(f"Maven could not build bergstream's Java: {failure}")
    return target / PROJECT_JAR


def modules(parts: Path = PARTS) -> list[Path]:
    """The folders of the Maven modules that `parts` (parts.xml) lists, in its order."""
    listed = ET.parse(parts).getroot().findall("m:modules/m:module", NAMESPACE)
    return [(parts.parent / str(module.text).strip()).resolve() for module in listed]


def sources_digest(parts: Path = PARTS) -> str:
    """A digest of the poms and of every module's main sources and resources: a change to any builds anew."""
    digest = hashlib.sha256()
    for pom in (parts.parent / "pom.xml", parts):
        digest.update(pom.read_bytes())
    for number, folder in enumerate(modules(parts)):
        digest.update(f"{number}/pom.xml".encode())
        digest.update((folder / "pom.xml").read_bytes())
        main = folder / "src" / "main"
        for path in sorted(p for p in main.rglob("*") if p.is_file()) if main.is_dir() else ():
            digest.update(f"{number}/{path.relative_to(main)}".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _run(command: list[str], java_errors: bool = False) -> str | None:
    """Runs Maven; None when it succeeds, else the line of its output that says why (a compiler error names
    its file: "[ERROR] /…/Plan.java:[12,9] cannot find symbol"), at most 400 characters."""
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return None
    output = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    compiler = [line for line in output if ".java:[" in line] if java_errors else []
    reasons = compiler or [line for line in output if "ERROR" in line] or output[-1:] or ["no output"]
    return reasons[0][:400]
