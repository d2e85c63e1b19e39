"""`bergstream app run` killed with SIGKILL while a live application runs, then run again with the same
command: the batch Spark replays from its offset log fails its progress report (SPARK-55271), the query is
started again, and the output holds every record once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from bergstream.loadgen.producer import ProduceRequest, produce
from tests.commands import run_whole
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration
RECORDS = 6000
PARTITIONS = 3


def _logged(folder: Path) -> int:
    return len(list(folder.glob("[0-9]*"))) if folder.is_dir() else 0


def test_a_live_application_killed_with_sigkill_resumes_with_every_record_once(
    stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    produce(
        ProduceRequest(topic=topic_name, schema="playback", count=RECORDS, partitions=PARTITIONS, seed=3),
        stack.bootstrap_servers, show_progress=False,
    )  # fmt: skip
    output = f"identity_{topic_name}".replace("-", "_").replace(".", "_")
    checkpoint = tmp_path / "checkpoint"
    settings = {
        "app": "identity",
        "entry": "tests.jobs.identity_app:identity",
        "sources": {"playback": {"topic": topic_name, "schema": "playback"}},
        "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
        "checkpoint_location": str(checkpoint),
        "output_table": output,
        "max_offsets_per_trigger": RECORDS // 8,
        "spark": {"master": "local[2]"},
    }
    config = tmp_path / "identity.yaml"
    config.write_text(yaml.safe_dump(settings))
    command = [sys.executable, "-m", "bergstream", "app", "run", "--app", "identity", "--config", str(config),
               "--available-now"]  # fmt: skip
    root = Path(__file__).parent.parent
    log = tmp_path / "killed.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    # Killed while a batch is in its offset log and not yet committed: the restart replays it.
    deadline = time.monotonic() + 240
    while not (2 <= _logged(checkpoint / "commits") < _logged(checkpoint / "offsets")):
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the application committed no two micro-batches in 240s"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert _logged(checkpoint / "commits") < 8, "killed before the end of the topic"

    resumed = run_whole(spark, command)  # the same command, run to its end on the tests' session
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "SPARK-55271" in resumed.stderr, "the killed batch was not replayed"
    rows = [(row.partition, row.offset) for row in spark.table(f"bergstream.apps.{output}").collect()]
    assert len(rows) == RECORDS
    per_partition = {p: sorted(o for q, o in rows if q == p) for p in range(PARTITIONS)}
    assert sum(len(offsets) for offsets in per_partition.values()) == RECORDS
    assert all(offsets == list(range(len(offsets))) for offsets in per_partition.values()), "a gap or a twin"


def test_an_application_keeping_its_state_in_rocksdb_commits_the_changes_not_snapshots(
    spark: SparkSession, tmp_path: Path
) -> None:
    """In the session bergstream builds, a RocksDB state store's commit writes a changelog of the batch's
    changes (Spark's default writes the whole store again at every commit)."""
    from pyspark.sql import functions as F

    provider = "spark.sql.streaming.stateStore.providerClass"
    for part in range(3):
        spark.range(part * 100, (part + 1) * 100, numPartitions=1).write.parquet(
            str(tmp_path / "in" / f"part={part}")
        )
    spark.conf.set(provider, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    try:
        counts = (
            spark.readStream.schema("id long, part int")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(tmp_path / "in"))
            .groupBy(F.col("id") % 10)
            .count()
        )
        query = (
            counts.writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    finally:
        spark.conf.unset(provider)
    state = [p.name for p in (tmp_path / "checkpoint" / "state").rglob("*") if p.is_file()]
    assert len(query.recentProgress) == 3
    changelogs = sorted(name for name in state if name.endswith(".changelog"))
    assert changelogs == sorted(["1.changelog", "2.changelog", "3.changelog"] * 4), state
    assert not [name for name in state if name.endswith(".zip")], state
