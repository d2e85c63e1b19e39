"""`bergstream router run`: every offset archived exactly once, the group committed, bad settings refused."""

from __future__ import annotations

import os
import random
import re
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from bergstream.loadgen.producer import ProduceRequest, produce
from tests.routers import (
    archived_offsets,
    committed_offsets,
    produced_offsets,
    run_router,
    start_router,
    write_config,
)
from tests.services import Services

pytestmark = pytest.mark.integration


def wait_for_line(log: Path, text: str, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().count(text) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} did not appear {count} times in {log}")


def test_available_now_archives_each_offset_once_and_commits_the_group(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    config = write_config(stack, tmp_path, topic_name)
    first = produce(
        ProduceRequest(topic=topic_name, schema="playback", count=3000, bad_fraction=0.03, partitions=3),
        stack.bootstrap_servers, show_progress=False,
    )  # fmt: skip
    done = run_router(topic_name, config, "--available-now")
    assert done.returncode == 0, done.stderr[-3000:]
    bad = sum(first.malformed.values())
    assert f"read 3,000, archived {3000 - bad:,}, dead-lettered {bad:,}" in done.stdout
    # The files the summary counts are the ones the appends added to the two tables.
    counted = re.search(r"dead-lettered [\d,]+, (\d+) files", done.stdout)
    catalog = stack.catalog.load()
    tables = (topic_name, f"{topic_name}__dlq")
    added = [catalog.load_table(f"{stack.catalog.namespace}.{t}").inspect.files().num_rows for t in tables]
    assert counted is not None and int(counted.group(1)) == sum(added) and all(added), (counted, added)

    again = run_router(topic_name, config, "--available-now")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "read 0," in again.stdout

    second = produce(
        ProduceRequest(topic=topic_name, schema="playback", count=1000, partitions=3, seed=2),
        stack.bootstrap_servers, show_progress=False,
    )  # fmt: skip
    assert run_router(topic_name, config, "--available-now").returncode == 0

    seen = archived_offsets(stack, topic_name)
    expected = produced_offsets(first.offsets) | produced_offsets(second.offsets)
    assert len(seen) == len(set(seen)) == len(expected) == 4000
    assert set(seen) == expected
    ends = {p: high + 1 for p, (_, high) in second.offsets.items()}
    assert committed_offsets(stack, topic_name, [0, 1, 2]) == ends


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"kafka": {"subscribe": "other"}}, "kafka: Value error, option 'subscribe' is not allowed here"),
        (
            {"kafka": {"startingOffsets": "earliest"}},
            "kafka: Value error, kafka.bootstrap.servers is missing",
        ),
        (
            {"kafka": {"kafka.bootstrap.servers": "127.0.0.1:1", "maxOffsetsPerTrigger": "5"}},
            "max_offsets_per_trigger",
        ),
        (
            {"kafka": {"kafka.bootstrap.servers": "127.0.0.1:1", "startingOffset": "earliest"}},
            "unknown option",
        ),
        ({"trigger_interval": "often"}, "trigger_interval: Value error, 'often' is not an interval"),
        ({"trigger_interval": "30 s"}, "trigger_interval: Value error, '30 s' is not an interval"),
        ({"encoding": "protobuf"}, "encoding"),
        ({"colour": "blue"}, "colour: Extra inputs are not permitted"),
        ({"topic": "someone_else"}, "topic is 'someone_else' but the router was asked for"),
        ({"schema": "clicks"}, "no event schema named 'clicks'"),
    ],
)
def test_bad_settings_are_refused_naming_the_file_and_key(
    stack: Services, tmp_path: Path, settings: dict[str, object], message: str
) -> None:
    config = write_config(stack, tmp_path, "refused", **settings)
    done = run_router("refused", config, "--available-now", timeout=120)
    assert done.returncode == 1
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("bergstream: error: ")
    assert message in error
    assert str(config) in error


def test_sigkill_at_random_moments_loses_and_repeats_nothing(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    config = write_config(stack, tmp_path, topic_name, max_offsets_per_trigger=1500)
    rng = random.Random(42)
    offsets: set[tuple[int, int]] = set()
    log = tmp_path / "router.log"
    for round_number in range(4):
        report = produce(
            ProduceRequest(topic=topic_name, schema="playback", count=4000, bad_fraction=0.02, partitions=3,
                           seed=round_number),
            stack.bootstrap_servers, show_progress=False,
        )  # fmt: skip
        offsets |= produced_offsets(report.offsets)
        batches = log.read_text().count(" batch ") if log.exists() else 0
        router = start_router(topic_name, config, log)
        wait_for_line(log, " batch ", count=batches + 1)  # warmed up: the next batches take a second or two
        time.sleep(rng.uniform(0, 5))
        os.killpg(router.pid, signal.SIGKILL)  # the Python driver and its Spark JVM, at once
        router.wait()
    drained = run_router(topic_name, config, "--available-now")
    assert drained.returncode == 0, drained.stderr[-3000:]

    seen = archived_offsets(stack, topic_name)
    duplicates = len(seen) - len(set(seen))
    assert duplicates == 0, f"{duplicates} offsets archived more than once"
    assert set(seen) == offsets, f"{len(offsets - set(seen))} offsets lost"


def test_expired_offsets_are_counted_and_the_router_goes_on(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    config = write_config(stack, tmp_path, topic_name)
    request = ProduceRequest(topic=topic_name, schema="playback", count=100, partitions=1)
    produce(request, stack.bootstrap_servers, show_progress=False)
    assert run_router(topic_name, config, "--available-now").returncode == 0

    produce(request, stack.bootstrap_servers, show_progress=False)  # offsets 100..199
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    from confluent_kafka import TopicPartition

    deleted = admin.delete_records([TopicPartition(topic_name, 0, 150)])
    for future in deleted.values():
        future.result(30)
    produce(request, stack.bootstrap_servers, show_progress=False)  # offsets 200..299

    done = run_router(topic_name, config, "--available-now")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "partition 0: offsets 100 to 149 (50 records) expired from Kafka before being archived" in done.stderr
    )
    assert "50 offsets expired before they were read" in done.stdout
    seen = sorted(archived_offsets(stack, topic_name))
    assert seen == [(0, o) for o in [*range(100), *range(150, 300)]]
