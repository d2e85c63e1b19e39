"""A topic that fails stops no other topic of its query and loses nothing: its share of each batch is set
aside by Kafka range, kept beside the checkpoint, and archived from Kafka once its table takes commits
again, while the query runs or after it started again (router/driver/behind.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.config import RouterConfig
from bergstream.router.driver.behind import BEHIND_FILE
from bergstream.router.driver.query import TopicsQuery
from bergstream.router.driver.settings import named_topics_settings
from bergstream.router.metrics import RouterMetrics
from tests.routers import (
    appended_by_spark,
    archived_offsets,
    committed_offsets,
    eventually,
    produced_offsets,
)
from tests.services import Services

pytestmark = pytest.mark.integration


def send(stack: Services, topic: str, count: int, seed: int) -> set[tuple[int, int]]:
    request = ProduceRequest(topic=topic, count=count, partitions=2, schema="playback", seed=seed)
    return produced_offsets(produce(request, stack.bootstrap_servers, show_progress=False).offsets)


def test_a_topic_whose_table_is_gone_is_set_aside_the_others_go_on_and_it_catches_up_once_it_is_back(
    stack: Services, spark: SparkSession, topic_name: str, tmp_path: Path
) -> None:
    good, failing = f"{topic_name}_good", f"{topic_name}_failing"
    checkpoint = tmp_path / "checkpoint"

    def config(topic: str) -> RouterConfig:
        return RouterConfig.flat(
            topic=topic, schema="playback", encoding="json", table=topic, trigger_interval="1 second",
            kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
            checkpoint_location=str(checkpoint), catalog=stack.catalog,
        )  # fmt: skip

    configs = {topic: config(topic) for topic in (good, failing)}
    sent = {good: send(stack, good, 300, 1), failing: send(stack, failing, 300, 2)}
    settings = named_topics_settings("pair", list(configs.values()), None, str(checkpoint))
    table = stack.catalog.table_identifier(failing)
    # Spark renames within the table's catalog: the new name is the namespace's.
    away, back = f"{stack.catalog.namespace}.{failing}_away", f"{stack.catalog.namespace}.{failing}"
    behind_file = checkpoint / BEHIND_FILE

    def behind() -> dict[str, object]:
        return json.loads(behind_file.read_text()) if behind_file.is_file() else {}

    def archived(topic: str) -> set[tuple[int, int]]:
        try:
            rows = archived_offsets(stack, topic)
        except Exception:  # the table is renamed away
            return set()
        assert len(rows) == len(set(rows)), f"{topic}: {len(rows) - len(set(rows))} offsets archived twice"
        return set(rows)

    def start() -> tuple[TopicsQuery, threading.Thread]:
        query = TopicsQuery(settings, configs.__getitem__, spark, RouterMetrics("pair"), strict=True)
        thread = threading.Thread(target=query.run, name="set-aside-query")
        thread.start()
        return query, thread

    query, thread = start()
    try:
        eventually(
            lambda: archived(good) == sent[good] and archived(failing) == sent[failing], "both archived"
        )
        # The failing topic's table goes away: its batches are set aside, the good topic's go on.
        spark.sql(f"ALTER TABLE {table} RENAME TO {away}")
        sent[failing] |= send(stack, failing, 200, 3)
        sent[good] |= send(stack, good, 200, 4)
        eventually(lambda: failing in behind(), "the failing topic set aside")
        eventually(lambda: archived(good) == sent[good], "the good topic archived while the other fails")
        assert query.up(good) == 1 and query.up(failing) == 0
        # Its group stays where its table ends; once the table is back, it catches up and rejoins.
        assert sum(committed_offsets(stack, failing, [0, 1]).values()) == 300
        spark.sql(f"ALTER TABLE {table}_away RENAME TO {back}")
        eventually(lambda: archived(failing) == sent[failing], "the failing topic caught up", timeout=120)
        eventually(lambda: failing not in behind() and query.up(failing) == 1, "the topic rejoined")
        sent[failing] |= send(stack, failing, 100, 5)
        eventually(lambda: archived(failing) == sent[failing], "its batches written again")
        eventually(
            lambda: sum(committed_offsets(stack, failing, [0, 1]).values()) == 600, "its group committed"
        )

        # Set aside again, then the query stops: the range kept beside the checkpoint is archived after
        # the next start.
        spark.sql(f"ALTER TABLE {table} RENAME TO {away}")
        sent[failing] |= send(stack, failing, 150, 6)
        eventually(lambda: failing in behind(), "set aside again")
    finally:
        query.stop()
        thread.join()
    assert archived(failing) == set(), "its table is away"
    spark.sql(f"ALTER TABLE {table}_away RENAME TO {back}")
    assert len(archived(failing)) == 600
    query, thread = start()
    try:
        eventually(lambda: archived(failing) == sent[failing], "caught up after the start", timeout=120)
        eventually(lambda: not behind(), "nothing behind")
        assert archived(good) == sent[good]
        # Caught up by the job that writes every batch, as the batches written together were.
        assert appended_by_spark(stack, failing) == [] and appended_by_spark(stack, good) == []
    finally:
        query.stop()
        thread.join()
