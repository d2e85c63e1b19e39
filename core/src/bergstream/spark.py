"""The one place that builds a SparkSession for bergstream."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from bergstream import jars
from bergstream.catalog import CatalogConfig
from bergstream.settings_file import OptionValue

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"


class SparkSettings(BaseModel):
    """The `spark:` block of a topic's or an application's settings file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    master: str = DEFAULT_MASTER
    conf: dict[str, OptionValue] = Field(default_factory=dict)


LOCAL_LOG_CONFIG = Path(__file__).parent / "spark-log4j2.properties"

# A malformed Avro value can claim a string or an array of billions of elements; without these limits
# the decoder allocates for it and the JVM runs out of memory. No Kafka record comes near them.
AVRO_DECODER_LIMITS = (
    "-Dorg.apache.avro.limits.string.maxLength=16777216 "
    "-Dorg.apache.avro.limits.bytes.maxLength=16777216 "
    "-Dorg.apache.avro.limits.collectionItems.maxLength=1048576"
)


_LIST_SETTINGS = {
    "spark.jars": ",",
    "spark.jars.packages": ",",
    "spark.sql.extensions": ",",
    "spark.driver.extraJavaOptions": " ",
    "spark.executor.extraJavaOptions": " ",
}

# Spark's default redaction, and Kafka logins: kafka.sasl.jaas.config, set in the settings of a Kafka source
# or sink, stays off the UI's environment page, the event log and plans. Catalog secrets (jdbc.password,
# s3.secret-access-key) match it too.
ROCKSDB_CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
REDACTION_REGEX = "(?i)secret|password|token|credential|access[.]?key|jaas"

CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def local_cores(master: str) -> int | None:
    """The cores a `local[N]` master runs on (`local[*]`: the machine's); None for a cluster.

    A stateful query runs one state store per shuffle partition and commits each every micro-batch: on
    one machine, one partition per core (a backfill's micro-batches cost a quarter less than with 8).
    """
    if master == "local":
        return 1
    if not master.startswith("local["):
        return None
    cores = master.removeprefix("local[").split(",")[0].rstrip("]")
    if cores == "*":
        return os.cpu_count() or 1
    return max(int(cores), 1) if cores.isdigit() else None


def jvm_start_conf(local: bool) -> dict[str, str]:
    """The settings a driver's and its executors' JVMs take only as they start: bergstream's jars and the
    Java options (Avro's decoder limits; a local driver's log settings). A session sets them; so does a
    driver pod's spark-submit, where no session has started the JVM."""
    driver_options = AVRO_DECODER_LIMITS
    if local:
        driver_options += f" -Dlog4j2.configurationFile='{LOCAL_LOG_CONFIG}'"
    return {
        **jars.spark_jar_conf(),
        "spark.driver.extraJavaOptions": driver_options,
        "spark.executor.extraJavaOptions": AVRO_DECODER_LIMITS,
    }


def session_conf(
    catalog: CatalogConfig,
    master: str = DEFAULT_MASTER,
    app_name: str = "bergstream",
    conf: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Every Spark setting bergstream relies on; `conf` overrides and extends them."""
    settings = {
        "spark.master": master,
        "spark.app.name": app_name,
        **jvm_start_conf(local=master.startswith("local")),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.sql.defaultCatalog": catalog.name,
        # Ingestion times are instants: keep them in UTC wherever Spark turns them into text.
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(local_cores(master) or 200),
        "spark.driver.memory": "2g",
        # Offset, commit and state files through Hadoop's FileSystem API: the same write-then-rename as the
        # default FileContext manager, about 20 ms less per file; a backfill writes two per micro-batch.
        "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
        # Where an application keeps its state in RocksDB, each commit writes the changes since the last,
        # and snapshots are taken in the background: a join over 1.5 h of impressions commits in 12 ms
        # instead of 870 (bench/apps). Ignored by Spark's default state store.
        ROCKSDB_CHANGELOG: "true",
        "spark.redaction.regex": REDACTION_REGEX,
        **catalog.spark_conf(),
    }
    extra = dict(conf or {})
    # Settings that are lists: what the caller gives is added to what bergstream needs, never instead.
    for option, separator in _LIST_SETTINGS.items():
        if option in extra:
            given = (settings.get(option, ""), extra.pop(option))
            settings[option] = separator.join(part for part in given if part)
    settings.update(extra)
    return settings


def build_spark_session(
    catalog: CatalogConfig,
    master: str = DEFAULT_MASTER,
    app_name: str = "bergstream",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    from pyspark.sql import SparkSession

    # A catalog that cannot be reached is refused before Spark takes its time to start.
    catalog.check_reachable()
    # Python workers must run the interpreter that has bergstream installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # A local session talks to itself over loopback, whatever the host name resolves to.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    settings = session_conf(catalog, master, app_name, conf)
    # Secrets (the catalog's password, an object store's secret key) are set once the session runs, before
    # its catalog is first used: what the builder is given is on the JVM's command line, which `ps` shows.
    secrets = {key: value for key, value in settings.items() if _SECRET_SETTING.search(key)}
    for key, value in settings.items():
        if key not in secrets:
            builder = builder.config(key, value)
    session = builder.getOrCreate()
    for key, value in secrets.items():
        session.conf.set(key, value)
    session.sparkContext.setLogLevel("WARN")
    return session


# Spark settings whose values are secrets: a catalog's `jdbc.password`, `s3.secret-access-key`, tokens.
_SECRET_SETTING = re.compile(r"^spark\.sql\.catalog\..*(secret|password|token|credential)", re.IGNORECASE)


@contextmanager
def spark_session(catalog: CatalogConfig, settings: SparkSettings, app_name: str) -> Iterator[SparkSession]:
    """A session of a settings file's catalog and `spark` block, stopped when the block ends."""
    session = build_spark_session(catalog, master=settings.master, app_name=app_name, conf=settings.conf)
    try:
        yield session
    finally:
        session.stop()
