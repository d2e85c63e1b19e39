"""The one place that builds a SparkSession for bergstream."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from bergstream import jars
from bergstream.catalog import CatalogConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"


def spark_home_jars() -> Path:
    """The jars Spark itself ships: $SPARK_HOME/jars, or those inside the pyspark package."""
    spark_home = os.environ.get("SPARK_HOME")
    if spark_home:
        return Path(spark_home) / "jars"
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


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
        "spark.jars": ",".join(str(jar) for jar in jars.spark_jars(spark_home_jars())),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.sql.defaultCatalog": catalog.name,
        # Ingestion times are instants: keep them in UTC wherever Spark turns them into text.
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "8" if master.startswith("local") else "200",
        **catalog.spark_conf(),
    }
    settings.update(conf or {})
    return settings


def build_spark_session(
    catalog: CatalogConfig,
    master: str = DEFAULT_MASTER,
    app_name: str = "bergstream",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    from pyspark.sql import SparkSession

    # Python workers must run the interpreter that has bergstream installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in session_conf(catalog, master, app_name, conf).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
