"""`bergstream produce` against the real broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.schemas import load_event_schema
from tests.services import Services

pytestmark = pytest.mark.integration


def bergstream(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bergstream", *args], capture_output=True, text=True, check=False, timeout=120
    )


def test_unknown_topic_is_refused_before_anything_is_sent(stack: Services) -> None:
    done = bergstream(
        "produce", "--topic", "clicks", "--count", "5", "--bootstrap-servers", stack.bootstrap_servers
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "bergstream: error: unknown topic 'clicks': the load generator makes playback, impression events; "
        "name the kind of event with --schema"
    )


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--late-fraction", "1.5", "--late-fraction 1.5"),
        ("--count", "-1", "--count -1"),
        ("--rate", "0", "--rate"),
    ],
)
def test_bad_arguments_are_named(stack: Services, flag: str, value: str, message: str) -> None:
    args = {
        "--topic": "playback",
        "--count": "5",
        "--bootstrap-servers": stack.bootstrap_servers,
        flag: value,
    }
    done = bergstream("produce", *[part for pair in args.items() for part in pair])
    assert done.returncode == 1
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_no_local_stack_and_no_bootstrap_servers(tmp_path: Path) -> None:
    done = bergstream("produce", "--topic", "playback", "--count", "1", "--data-dir", str(tmp_path))
    assert done.returncode == 1
    assert "no local stack runs in" in done.stderr


def test_the_cli_sends_what_it_says(stack: Services, topic_name: str) -> None:
    done = bergstream(
        "produce", "--topic", topic_name, "--schema", "impression", "--count", "500", "--encoding", "avro",
        "--bootstrap-servers", stack.bootstrap_servers,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"sent 500 avro records to {topic_name}" in done.stdout


def test_records_are_keyed_by_account_and_decode(stack: Services, topic_name: str) -> None:
    request = ProduceRequest(
        topic=topic_name, schema="playback", count=1000, late_fraction=0.2, partitions=2, seed=5
    )
    report = produce(request, stack.bootstrap_servers, show_progress=False)
    assert report.sent == 1000 and 100 < report.late < 300
    assert sum(report.per_partition.values()) == 1000

    schema = load_event_schema("playback")
    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": topic_name})
    consumer.assign([TopicPartition(topic_name, p, 0) for p in (0, 1)])
    seen = 0
    while seen < 1000:
        message = consumer.poll(10)
        assert message is not None and message.error() is None
        event = schema.decode(message.value(), "json")
        assert message.key() == str(event["account_id"]).encode()
        assert dict(message.headers())["encoding"] == b"json"
        seen += 1
    consumer.close()
    for partition, (low, high) in report.offsets.items():
        assert high - low + 1 == report.per_partition[partition]
