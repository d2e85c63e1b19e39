"""Archive a topic once, in a process of its own, with the master and catalog given on the command line.

A Python process holds one SparkContext, so sessions on other masters or catalogs than the tests' own
run here.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from bergstream.catalog import CatalogConfig
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.spark import build_spark_session


def main() -> None:
    parser = argparse.ArgumentParser()
    for option in ("--master", "--catalog-uri", "--warehouse", "--bootstrap-servers", "--topic", "--schema"):
        parser.add_argument(option, required=True)
    parser.add_argument("--catalog-user")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--encoding", choices=("json", "avro"), required=True)
    args = parser.parse_args()
    catalog = CatalogConfig(uri=args.catalog_uri, warehouse=args.warehouse, user=args.catalog_user)
    config = RouterConfig(
        topic=args.topic, schema=args.schema, encoding=args.encoding, table=args.topic,
        kafka={"kafka.bootstrap.servers": args.bootstrap_servers, "startingOffsets": "earliest"},
        checkpoint_location=args.checkpoint, catalog=catalog,
    )  # fmt: skip
    spark = build_spark_session(
        catalog, master=args.master, app_name=f"archive-once-{args.topic}",
        conf={"spark.executor.memory": "1g", "spark.cores.max": "1"},
    )  # fmt: skip
    try:
        totals = archive_available_now(spark, config)
    finally:
        spark.stop()
    print(json.dumps({key: value for key, value in asdict(totals).items() if key != "per_partition"}))


if __name__ == "__main__":
    main()
