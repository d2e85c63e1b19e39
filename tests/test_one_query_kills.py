"""The one query over several topics, killed at random moments: every record once, in its topic's table or
its dead-letter table, with a topic created while the router runs, a topic whose schema appears only later
and a checkpoint lost on the way."""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.config import table_for_topic
from bergstream.schemas.event_schema import AVRO_DIR
from tests.commands import run_whole
from tests.routers import (
    archived_offsets,
    pattern_command,
    produced_offsets,
    start_command,
    write_defaults,
)
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
from tests.test_pattern_router import archived_dead_letters
from tests.test_router import wait_for_line

pytestmark = pytest.mark.integration


def test_one_query_over_several_topics_killed_at_random_moments_loses_and_repeats_nothing(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    prefix = topic_name[:40]
    steady = [f"{prefix}.s{n}" for n in range(3)]
    late, unknown = f"{prefix}.late", f"{prefix}.unknown"
    topics = [*steady, late, unknown]
    # The unknown topic's schema is looked up in a folder of its own, empty until the third run.
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    topics_dir = tmp_path / "topics"
    topics_dir.mkdir()
    (topics_dir / f"{unknown}.yaml").write_text(
        yaml.safe_dump({"schema": "later", "encoding": "json", "schema_dir": str(schemas)})
    )
    defaults = write_defaults(
        stack, tmp_path, schema="playback", encoding="json", trigger_interval="1 second",
        max_offsets_per_trigger=1500,
        spark={"master": "local[2]",
               "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}},
    )  # fmt: skip
    command = pattern_command(rf"{prefix}\..*", defaults, topics_dir)
    sent: dict[str, set[tuple[int, int]]] = {topic: set() for topic in topics}

    def send(topic: str, count: int, seed: int) -> None:
        request = ProduceRequest(
            topic=topic, schema="playback", count=count, bad_fraction=0.02, partitions=2, seed=seed
        )
        report = produce(request, stack.bootstrap_servers, show_progress=False)
        sent[topic] |= produced_offsets(report.offsets)

    rng = random.Random(7)
    log = tmp_path / "router.log"
    for round_number in range(3):
        for n, topic in enumerate([*steady, unknown]):
            send(topic, 1200, seed=10 * round_number + n)
        if round_number == 2:
            # The schema appears, and the checkpoint is lost: each topic resumes where its tables end.
            shutil.copy(AVRO_DIR / "playback.avsc", schemas / "later.avsc")
            shutil.rmtree(tmp_path / "checkpoint")
        batches = log.read_text().count(" batch ") if log.exists() else 0
        router = start_command(command, log)
        try:
            wait_for_line(log, " batch ", count=batches + 1, timeout=180)  # warmed up
            if round_number == 1:
                # A topic created while the router runs, joining its query at a later batch.
                admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
                admin.create_topics([NewTopic(late, 2, 1)])[late].result(30)
                send(late, 800, seed=99)
                # Some of the unknown topic's records dead-lettered before its schema appears.
                wait_for_line(log, f"{unknown} batch ", count=1, timeout=180)
            time.sleep(rng.uniform(0, 5))
        finally:
            os.killpg(router.pid, signal.SIGKILL)  # the Python driver and its Spark JVM, at once
            router.wait()
    drained = run_whole(spark, [*command, "--available-now"])
    assert drained.returncode == 0, drained.stderr[-3000:]
    # The third run found no checkpoint: each topic that had archived resumed where its tables end.
    resumed = log.read_text().count("holds no batch; resuming where the tables' snapshots say")
    assert resumed >= len(steady), resumed

    for topic in topics:
        seen = archived_offsets(stack, table_for_topic(topic))
        duplicates = len(seen) - len(set(seen))
        assert duplicates == 0, f"{topic}: {duplicates} offsets archived more than once"
        assert set(seen) == sent[topic], f"{topic}: {len(sent[topic] - set(seen))} offsets lost"
    # The unknown topic's records before its schema appeared are dead letters that say why; the later ones
    # are archived.
    reasons = archived_dead_letters(stack, f"{stack.catalog.namespace}.{table_for_topic(unknown)}__dlq")
    assert any("no event schema named 'later'" in reason for reason in reasons), reasons[:3]
    archive = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{table_for_topic(unknown)}")
    assert archive.scan().to_arrow().num_rows > 0, "archived once its schema appeared"
