"""The Spark drivers a run starts, started for less CPU: most of a run's CPU is Spark driver JVMs starting
(a command line's `backfill publish`, a router killed and started again), each loading some 20,000 classes
and compiling its hot ones, for a few seconds of work on a few thousand rows.

Every driver the run starts, in the tests' own processes or in the commands they run, gets
SPARK_SUBMIT_OPTS with:
- the client compiler only (-XX:TieredStopAtLevel=1): the optimising compiler spends more CPU than a
  short-lived driver ever wins back; with the code cache the optimising compiler would have (240 MB, not the
  48 MB the client compiler alone gets by default): Spark's, Iceberg's and Kafka's code overflows 48 MB, and
  the JVM then spends its time sweeping the cache and running code it has stopped compiling (a run's driver
  spent more CPU in its sweeper thread than in its tasks);
- a class-data archive of the classes a driver loads (Spark's, Iceberg's, bergstream's), made once per
  JDK and pyspark by a driver that runs the usual work and dumps them as it exits, kept in bergstream's
  cache: a driver maps them instead of reading and verifying each. A JVM that cannot use the archive (another
  JDK, another pyspark) starts as it would without;
- the JVM's own warnings on stderr rather than stdout, where a command's --json output goes.

A driver that starts this way spends about 10 s of CPU where it spent 25 (this module's own
`python -m tests.jvm_start --compare`). Nothing here changes what a driver computes. Drivers on a cluster's
executors, the Kafka broker and Maven are left as they are.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bergstream.jars import cache_root, spark_home_jars

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = "SPARK_SUBMIT_OPTS"
QUICK = (
    "-XX:TieredStopAtLevel=1",
    "-XX:ReservedCodeCacheSize=240m",
    "-Xlog:disable",
    "-Xlog:all=error:stderr",
)
# The most a driver running the usual work takes to start, work and dump its classes.
ARCHIVE_TIMEOUT = 600


def java() -> Path | None:
    """The java a driver runs: JAVA_HOME's, else the PATH's (as spark-class finds it)."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else None
    if found is None or not found.exists():
        on_path = shutil.which("java")
        found = Path(on_path) if on_path else None
    return found.resolve() if found is not None else None


def archive_path(java_binary: Path) -> Path:
    """The archive of this JDK's and this pyspark's classes: named by both, so that another of either makes
    its own."""
    digest = hashlib.sha256()
    stat = java_binary.stat()
    digest.update(f"{java_binary}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    jars = spark_home_jars()
    digest.update(f"{jars.resolve()}\0".encode())  # the archive holds the class path's own paths
    for jar in sorted(jars.glob("*.jar")):
        digest.update(f"{jar.name}\0{jar.stat().st_size}\0".encode())
    return cache_root() / "driver-classes" / f"{digest.hexdigest()[:16]}.jsa"


def driver_options(make_archive: bool = True) -> tuple[str, str]:
    """SPARK_SUBMIT_OPTS for the run's drivers, and a line that says what they are: the archive made first
    where there is none yet and `make_archive`."""
    given = os.environ.get(OPTIONS, "")
    java_binary = java()
    if java_binary is None:
        return given, "Spark drivers: no java found"
    archive = archive_path(java_binary)
    made = ""
    if not archive.exists() and not make_archive:
        return _joined(given, *QUICK), "Spark drivers: the client compiler alone"
    if not archive.exists():
        making = f"Spark drivers: making the class archive {archive} (once per JDK and pyspark) ..."
        print(making, file=sys.stderr, flush=True)
        started = time.monotonic()
        problem = _make_archive(archive)
        if problem:
            described = f"Spark drivers: the client compiler alone; no class archive: {problem}"
            return _joined(given, *QUICK), described
        made = f", made in {time.monotonic() - started:.0f} s"
    options = _joined(given, *QUICK, f"-XX:SharedArchiveFile={archive}")
    return options, f"Spark drivers: the client compiler alone, classes from {archive}{made}"


def _joined(*parts: str) -> str:
    return " ".join(part for part in parts if part)


def _make_archive(archive: Path) -> str:
    """Run the usual work in a driver that dumps its classes as it exits; '' when the archive is made, else
    what went wrong."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f"{archive.stem}.{os.getpid()}.partial")
    environment = {**os.environ, OPTIONS: _joined(*QUICK, f"-XX:ArchiveClassesAtExit={partial}")}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.jvm_start", "--work"], cwd=ROOT, env=environment,
            capture_output=True, text=True, timeout=ARCHIVE_TIMEOUT, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        return f"the driver that makes it took more than {ARCHIVE_TIMEOUT} s"
    if done.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        return f"the driver that makes it failed (exit {done.returncode}): {done.stderr[-1500:]}"
    partial.replace(archive)
    return ""


def usual_work(scratch: Path) -> float:
    """What most drivers of a run do, in one driver: a session on a SQLite catalog, a table partitioned by
    the hour made, written, merged into, branched and read; a Kafka source and an Iceberg stream planned;
    a streaming query run to its end. Returns the CPU seconds the driver's JVM spent (Linux's /proc)."""
    from bergstream.catalog import CatalogConfig
    from bergstream.spark import build_spark_session

    catalog = CatalogConfig.sqlite(scratch / "catalog.db", scratch / "warehouse")
    spark = build_spark_session(catalog, master="local[2]", app_name="bergstream-driver-classes",
                                conf={"spark.ui.enabled": "false"})  # fmt: skip
    try:
        name = f"{catalog.name}.{catalog.namespace}"
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {name}")
        spark.sql(f"CREATE TABLE {name}.events (k BIGINT, v STRING, ts TIMESTAMP) USING iceberg "
                  "PARTITIONED BY (hours(ts))")  # fmt: skip
        spark.sql(f"INSERT INTO {name}.events SELECT id, CAST(id AS STRING), current_timestamp() "
                  "FROM range(5000)")  # fmt: skip
        spark.sql(f"ALTER TABLE {name}.events CREATE BRANCH fix")
        spark.sql(f"MERGE INTO {name}.events t USING (SELECT id AS k FROM range(100)) u ON t.k = u.k "
                  "WHEN MATCHED THEN DELETE")  # fmt: skip
        spark.sql(f"SELECT v, count(*) FROM {name}.events VERSION AS OF 'fix' GROUP BY v").collect()
        spark.sql(f"SELECT * FROM {name}.events.snapshots").collect()
        spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9").option(
            "subscribe", "none"
        ).load()
        stream = (
            spark.readStream.format("iceberg").option("streaming-skip-overwrite-snapshots", "true")
            .option("streaming-skip-delete-snapshots", "true").load(f"{name}.events")
        )  # fmt: skip
        query = (
            stream.groupBy("v").count().writeStream.outputMode("complete").format("memory")
            .queryName("driver_classes").option("checkpointLocation", str(scratch / "checkpoint"))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination()
        pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    finally:
        spark.stop()


def probe() -> dict[str, object]:
    """What this process's Spark driver started with: its JVM's arguments, and the size of the class-data
    archives it mapped (jcmd's VM.info)."""
    import re

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        bean = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
        arguments = [str(argument) for argument in bean.getInputArguments()]
        pid = jvm.java.lang.ProcessHandle.current().pid()
    finally:
        java_binary = java()
        jcmd = str(java_binary.parent / "jcmd") if java_binary else "jcmd"
        info = subprocess.run([jcmd, str(pid), "VM.info"], capture_output=True, text=True, timeout=60).stdout
        spark.stop()
    mapped = re.search(r"CDS archive\(s\) mapped at: .*size (\d+)", info)
    return {"arguments": arguments, "mapped": int(mapped.group(1)) if mapped else 0}


def _compare() -> None:
    """The CPU of a driver doing the usual work, started as it would be and started quicker."""
    java_binary = java()
    if java_binary is None:
        raise SystemExit("no java found")
    archive = archive_path(java_binary)
    shapes = {
        "default": "",
        "client compiler": _joined(*QUICK),
        "client compiler and class archive": _joined(*QUICK, f"-XX:SharedArchiveFile={archive}"),
    }
    for shape, options in shapes.items():
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "tests.jvm_start", "--work"], cwd=ROOT, text=True,
            env={**os.environ, OPTIONS: options}, check=True, capture_output=True,
        )  # fmt: skip
        cpu = float(done.stdout.split()[-1])
        print(f"{shape:36s} wall {time.monotonic() - started:5.1f} s  driver CPU {cpu:5.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", action="store_true", help="run the usual work in one driver")
    parser.add_argument("--compare", action="store_true", help="a driver's CPU started each way")
    parser.add_argument("--probe", action="store_true", help="print what a driver started with, as JSON")
    arguments = parser.parse_args()
    if arguments.work:
        with tempfile.TemporaryDirectory(prefix="bergstream-driver-classes-") as scratch:
            print(f"driver CPU seconds: {usual_work(Path(scratch)):.1f}")
    elif arguments.probe:
        print(json.dumps(probe()))
    elif arguments.compare:
        print(driver_options()[1])
        _compare()
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
