"""A target lag Kafka's retention leaves no room for is refused at start: a topic is read only when its commit
is due (router/driver/unread.py), so its records must still be in Kafka by then. Real broker and Spark."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka.admin import AdminClient, NewTopic

from tests.commands import run_whole
from tests.routers import pattern_command, write_defaults
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_a_target_lag_over_half_a_topic_s_retention_is_refused_at_start_naming_the_topic(
    spark: SparkSession, stack: Services, topic_name: str, tmp_path: Path
) -> None:
    prefix = topic_name[:40]
    short, long = f"{prefix}.short", f"{prefix}.long"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    created = admin.create_topics(
        [NewTopic(short, 1, 1, config={"retention.ms": "100000"}), NewTopic(long, 1, 1)]
    )
    for future in created.values():
        future.result(30)
    (topics_dir := tmp_path / "topics").mkdir()
    command = pattern_command(rf"{prefix}\..*", write_defaults(stack, tmp_path, schema="playback",
                              encoding="json", target_lag="60s"), topics_dir, "--available-now")  # fmt: skip
    refused = run_whole(spark, command)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output[-3000:]
    assert f"{short} (retention.ms 100000, target_lag 60s)" in output, output[-3000:]
    assert long not in output.split("less than 2 times their target lag")[-1].split("\n")[0]

    # Half the retention passes: the router starts and archives both topics.
    defaults = write_defaults(stack, tmp_path, schema="playback", encoding="json", target_lag="50s")
    accepted = run_whole(spark, pattern_command(rf"{prefix}\..*", defaults, topics_dir, "--available-now"))
    assert accepted.returncode == 0, (accepted.stdout + accepted.stderr)[-3000:]
