"""A topic deleted and created again under its name, on a real broker, Spark and Iceberg: its offsets start
over, and neither the router (from its checkpoint, or from its tables' positions) nor a bootstrap reads on
from the old topic's offsets into the new one. Each refuses, naming the topic, both ids and what to do."""

from __future__ import annotations

import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.admin import AdminClient

from bergstream.backfill.errors import BackfillConfigError
from bergstream.backfill.read.handover import pin_handover, refuse_lost_handover
from bergstream.backfill.read.planner import table_ref
from bergstream.errors import ConfigError
from bergstream.kafka_topics import topic_ids
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router.config import RouterConfig
from bergstream.router.consumer_group import GroupCommitter
from bergstream.router.driver.launch import archive_available_now
from bergstream.router.identity import IDS_FILE, CheckpointFile, TopicIdentity, TopicRecreated, refuse_another
from bergstream.schemas.batch_range import TOPIC_ID
from tests.routers import eventually, recreate
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration
CLUSTER = "us-east-1"


def router(stack: Services, topic: str, checkpoint: Path, table: str | None = None) -> RouterConfig:
    return RouterConfig.flat(
        topic=topic, schema="playback", encoding="json", table=table or topic, cluster=CLUSTER,
        kafka={"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
        checkpoint_location=str(checkpoint), catalog=stack.catalog, max_offsets_per_trigger=500,
    )  # fmt: skip


def test_a_router_and_a_bootstrap_refuse_a_topic_deleted_and_created_again(
    stack: Services, spark: SparkSession, tmp_path: Path
) -> None:
    topic = "recreated_playback"
    bootstrap = {"bootstrap.servers": stack.bootstrap_servers}
    produce(ProduceRequest(topic=topic, schema="playback", count=900, partitions=3, seed=1),
            stack.bootstrap_servers, show_progress=False)  # fmt: skip
    config = router(stack, topic, tmp_path / "checkpoint")
    assert archive_available_now(spark, config).archived == 900
    old = topic_ids(AdminClient(bootstrap), [topic])[topic]
    assert old is not None
    assert json.loads((tmp_path / "checkpoint" / IDS_FILE).read_text()) == {topic: old}
    table = stack.catalog.load().load_table(f"{stack.catalog.namespace}.{topic}")
    assert table.current_snapshot().summary.additional_properties[TOPIC_ID] == old  # type: ignore[union-attr]
    handover = pin_handover(stack.catalog, table_ref(topic, stack.catalog), topic, CLUSTER)
    assert handover.topic_id == old

    recreate(stack.bootstrap_servers, topic, 3)
    produce(ProduceRequest(topic=topic, schema="playback", count=3000, partitions=3, seed=2),
            stack.bootstrap_servers, show_progress=False)  # fmt: skip
    new = topic_ids(AdminClient(bootstrap), [topic])[topic]
    assert new is not None and new != old

    with pytest.raises(TopicRecreated) as from_checkpoint:
        archive_available_now(spark, config)
    assert str(from_checkpoint.value).startswith(
        f"topic {topic}: Kafka's topic of that name has id {new}, and the router's checkpoint "
        f"({tmp_path / 'checkpoint'}/{IDS_FILE}) records id {old}: the topic was deleted and created again"
    )
    assert "Archive the new topic with a router of its own from its start" in str(from_checkpoint.value)
    shutil.rmtree(tmp_path / "checkpoint")
    with pytest.raises(
        TopicRecreated, match=f"table {stack.catalog.table_identifier(topic)} records id {old}"
    ):
        archive_available_now(spark, config)
    assert spark.table(stack.catalog.table_identifier(topic)).count() == 900, "nothing of the new topic"

    with pytest.raises(BackfillConfigError) as refused:
        refuse_lost_handover(handover, bootstrap)
    assert str(refused.value).startswith(
        f"topic {topic}: Kafka's topic of that name has id {new}, and the router commit that records the "
        f"hand-over (snapshot {handover.snapshot_id} of {handover.table}) records id {old}"
    )
    check_planned = spark._jvm.io.bergstream.backfill.Handover.checkPlanned  # type: ignore[union-attr]
    with pytest.raises(Exception, match=f"at the switch: Kafka's topic {topic} has id {new}, and the router"):
        check_planned({"kafka.bootstrap.servers": stack.bootstrap_servers}, json.dumps(handover.to_json()),
                      "at the switch")  # fmt: skip

    # What the message says to do: the new topic archived whole, from its start, beside the old archive.
    fresh = router(stack, topic, tmp_path / "new-checkpoint", table=f"{topic}_2")
    assert archive_available_now(spark, fresh).archived == 3000


def test_a_topic_created_again_while_the_router_runs_stops_it_before_its_next_batch(
    stack: Services, spark: SparkSession, tmp_path: Path
) -> None:
    topic = "recreated_running"
    produce(ProduceRequest(topic=topic, schema="playback", count=10, partitions=2, seed=3),
            stack.bootstrap_servers, show_progress=False)  # fmt: skip
    kafka = GroupCommitter(
        topic, f"bergstream-router.{topic}", {"bootstrap.servers": stack.bootstrap_servers}
    )
    try:
        identity = TopicIdentity(topic, CLUSTER, kafka)
        started_on = identity.at_start(spark, str(tmp_path / "checkpoint"), {})
        identity.before_batch(6)  # the same topic: no error
        recreate(stack.bootstrap_servers, topic, 2)

        def described_again() -> bool:
            """Kafka answers for the topic made again: its metadata has reached the broker it asks."""
            try:
                return kafka.topic_id() not in (None, started_on)
            except ConfigError:
                return False

        eventually(described_again, f"Kafka describing topic {topic} made again", timeout=60)
        with pytest.raises(TopicRecreated) as stopped:
            identity.before_batch(7)
        assert f"records id {started_on}" in str(stopped.value)
        assert "the router, which started on it and was about to write batch 7," in str(stopped.value)
    finally:
        kafka.close()


def test_a_topic_made_again_with_fewer_records_while_the_router_runs_stops_it_reading_neither_topic(
    stack: Services, tmp_path: Path
) -> None:
    """Made again with fewer records than the router had met: Spark's end offsets fall below the batch's
    start, its batch reads nothing of the topic, and its id is checked all the same. The router, on an hour's
    target lag, had read nothing of the old topic: it stops saying why, before reading either topic's
    records at those offsets; the old topic's range stays recorded unread from its start, and nothing of
    either topic is archived."""
    from tests.routers import archived_offsets, start_router, unread_record, write_config
    from tests.test_unread_ranges import killed

    topic = "recreated_fewer"
    # A trigger long beside the topic's deletion and creation: no batch sees the topic missing between them.
    config = write_config(
        stack, tmp_path, topic, cluster=CLUSTER, target_lag="1h", trigger_interval="20 seconds"
    )
    produce(ProduceRequest(topic=topic, schema="playback", count=300, partitions=2, seed=4),
            stack.bootstrap_servers, show_progress=False)  # fmt: skip
    old = topic_ids(AdminClient({"bootstrap.servers": stack.bootstrap_servers}), [topic])[topic]
    log = tmp_path / "router.log"
    checkpoint = tmp_path / "checkpoints" / topic
    router = start_router(topic, config, log)
    try:
        eventually(
            lambda: topic in unread_record(checkpoint), "the topic's range recorded unread", timeout=240
        )
        recreate(stack.bootstrap_servers, topic, 2)
        produce(ProduceRequest(topic=topic, schema="playback", count=10, partitions=2, seed=5),
                stack.bootstrap_servers, show_progress=False)  # fmt: skip
        eventually(lambda: router.poll() is not None, "the router stopping on the topic again", timeout=180)
    finally:
        if router.poll() is None:
            killed(router)
    output = log.read_text()
    assert router.returncode != 0, output[-3000:]
    assert f"topic {topic}: Kafka's topic of that name has id" in output, output[-3000:]
    assert f"records id {old}" in output and "was about to write batch" in output, output[-3000:]
    assert archived_offsets(stack, topic) == [], "read at offsets the topic made again reuses"
    assert unread_record(checkpoint)[topic]["start"] == {"0": 0, "1": 0}, "unread from the old topic's start"


def test_commits_and_checkpoints_without_an_id_are_accepted_as_unknown() -> None:
    refuse_another("plays", "AAAA", None, "table t")  # written before ids were recorded
    refuse_another("plays", None, "BBBB", "table t")  # a broker that gives no id
    refuse_another("plays", "AAAA", "AAAA", "table t")
    with pytest.raises(
        TopicRecreated, match="topic plays: Kafka's topic of that name has id AAAA, and table t "
    ):
        refuse_another("plays", "AAAA", "BBBB", "table t")


def test_the_ids_file_is_read_whole_while_topics_started_side_by_side_write_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    # A pattern's topics start on a pool of threads: each writes its id beside the checkpoint (the file
    # replaced by a delete and a rename) while others read it. A read between the two once stopped the start
    # of a thousand topics with "No such file or directory".
    checkpoint = str(tmp_path / "checkpoint")
    errors: list[BaseException] = []
    done = threading.Event()

    def write(first: int) -> None:
        kept = CheckpointFile(spark, checkpoint)
        for key in range(first, first + 40):
            kept.put(f"topic_{key:03d}", f"id-{key}")

    def read() -> None:
        kept = CheckpointFile(spark, checkpoint)
        while not done.is_set():
            try:
                kept.read()
            except BaseException as error:
                errors.append(error)
                return

    readers = [threading.Thread(target=read) for _ in range(4)]
    for reader in readers:
        reader.start()
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(write, range(0, 160, 40)))
    finally:
        done.set()
        for reader in readers:
            reader.join()
    assert errors == []
    assert CheckpointFile(spark, checkpoint).read() == {f"topic_{key:03d}": f"id-{key}" for key in range(160)}
