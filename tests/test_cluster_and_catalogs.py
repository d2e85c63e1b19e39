"""The same archive job on a Spark standalone cluster with a PostgreSQL JDBC catalog: other configuration,
same code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyiceberg import types as it

from bergstream.catalog import CatalogConfig
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local.postgres import USER, postgres_server
from bergstream.local.spark_cluster import spark_cluster
from tests.services import Services

pytestmark = pytest.mark.integration


def test_archive_on_a_standalone_cluster_into_a_postgres_catalog(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    request = ProduceRequest(
        topic=topic_name, schema="impression", count=2000, bad_fraction=0.02, encoding="avro"
    )
    report = produce(request, stack.bootstrap_servers, show_progress=False)

    with postgres_server() as postgres, spark_cluster(tmp_path / "spark") as cluster:
        catalog = CatalogConfig(uri=postgres.jdbc_uri, warehouse=(tmp_path / "warehouse").as_uri(), user=USER)
        done = subprocess.run(
            [sys.executable, "-m", "tests.jobs.archive_once", "--master", cluster.master_url,
             "--catalog-uri", catalog.uri, "--catalog-user", USER, "--warehouse", catalog.warehouse,
             "--bootstrap-servers", stack.bootstrap_servers, "--topic", topic_name, "--schema", "impression",
             "--encoding", "avro", "--checkpoint", str(tmp_path / "checkpoint")],
            capture_output=True, text=True, check=False, timeout=600, cwd=Path(__file__).parent.parent,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        bad = sum(report.malformed.values())
        assert (result["read"], result["archived"], result["dead_lettered"]) == (2000, 2000 - bad, bad)
        (application,) = cluster.state()["completedapps"]
        assert application["name"] == f"archive-once-{topic_name}"

        table = catalog.load().load_table(f"archive.{topic_name}")
        assert isinstance(table.schema().find_type("__metadata__.kafka_ingestion_ts"), it.TimestamptzType)
        assert table.scan().to_arrow().num_rows == result["archived"]
