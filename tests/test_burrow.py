"""Burrow, the consumer lag checker, sees the router through its group `bergstream-router.<topic>`."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from bergstream.errors import MissingToolError, StackError
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local.burrow import BINARY_VARIABLE, KAFKA_VERSION, TOO_OLD, BurrowSettings, burrow_server
from bergstream.local.processes import free_ports
from tests.routers import committed_offsets, eventually, start_router, write_config
from tests.services import Services

# Debian 12's package, Burrow 1.2.1.
DEBIAN_BURROW = "/usr/bin/Burrow"


def test_the_settings_are_toml_with_a_kafka_4_client_on_loopback(tmp_path: Path) -> None:
    settings = BurrowSettings("127.0.0.1:9092,127.0.0.1:9094", 8000, intervals=5, offset_refresh_seconds=1)
    parsed = tomllib.loads(settings.toml(tmp_path))
    assert parsed["client-profile"]["bergstream"]["kafka-version"] == KAFKA_VERSION
    assert parsed["cluster"]["local"]["servers"] == ["127.0.0.1:9092", "127.0.0.1:9094"]
    assert parsed["consumer"]["local"]["cluster"] == "local"
    assert parsed["httpserver"]["default"]["address"] == "127.0.0.1:8000"
    assert parsed["storage"]["default"]["intervals"] == 5
    assert "zookeeper" not in parsed and "notifier" not in parsed


@pytest.mark.integration
@pytest.mark.skipif(shutil.which(DEBIAN_BURROW) is None, reason="Debian's burrow package is not installed")
def test_a_burrow_too_old_for_kafka_4_is_refused_saying_what_to_install(
    stack: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BINARY_VARIABLE, DEBIAN_BURROW)
    (port,) = free_ports(1)
    with pytest.raises(StackError) as refused, burrow_server(BurrowSettings(stack.bootstrap_servers, port)):
        pass
    assert str(refused.value) == f"{DEBIAN_BURROW}: {TOO_OLD}"


def judged(status: dict[str, Any], topic: str) -> tuple[str, int, set[str]]:
    """(group status, total lag, statuses of the topic's partitions) as Burrow says them."""
    partitions = {p["status"] for p in status.get("partitions") or [] if p["topic"] == topic}
    return status["status"], int(status.get("totallag") or 0), partitions


@pytest.mark.integration
def test_burrow_judges_the_router_ok_while_it_archives_and_lagging_once_it_stops(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    group = f"bergstream-router.{topic_name}"
    burrow_port, metrics_port = free_ports(2)
    # Burrow judges a group over its last `intervals` commits and log ends: a few seconds' worth here.
    settings = BurrowSettings(
        stack.bootstrap_servers, burrow_port, topic_refresh_seconds=1, offset_refresh_seconds=1, intervals=5,
        expire_cache_seconds=1,
    )  # fmt: skip
    config = write_config(stack, tmp_path, topic_name, lag_refresh_seconds=1, metrics_port=metrics_port,
                          metrics_host="127.0.0.1")  # fmt: skip

    def burst(count: int, seed: int) -> dict[int, int]:
        request = ProduceRequest(topic=topic_name, schema="playback", count=count, partitions=2, seed=seed)
        report = produce(request, stack.bootstrap_servers, show_progress=False)
        return {p: last + 1 for p, (_, last) in report.offsets.items()}

    ends = burst(200, seed=0)
    with contextlib.ExitStack() as running:
        try:
            burrow = running.enter_context(burrow_server(settings, tmp_path / "burrow"))
        except MissingToolError as error:
            # A BERGSTREAM_BURROW that names no program is a mistake to fix, not a Burrow absent.
            if os.environ.get(BINARY_VARIABLE):
                raise
            pytest.skip(str(error))
        except StackError as error:
            if TOO_OLD not in str(error):
                raise
            pytest.skip(f"{error}; point {BINARY_VARIABLE} at one")
        router = start_router(topic_name, config, tmp_path / "router.log")
        running.callback(stop, router)
        eventually(lambda: committed_offsets(stack, topic_name, [0, 1]) == ends, "the first commit")
        # The router archives a few bursts, committing after each, and catches up.
        for seed in range(1, 6):
            ends = {**ends, **burst(50, seed)}
            time.sleep(1)
        eventually(lambda: committed_offsets(stack, topic_name, [0, 1]) == ends, "the router caught up")
        eventually(
            lambda: judged(burrow.group_status(group), topic_name) == ("OK", 0, {"OK"}),
            "Burrow to find the router's group OK", timeout=60,
        )  # fmt: skip

        # The router stops; records keep coming.
        router.send_signal(signal.SIGINT)
        router.wait(120)
        lags: list[int] = []

        def lagging() -> bool:
            burst(20, seed=100 + len(lags))
            status, total, partitions = judged(burrow.group_status(group), topic_name)
            lags.append(total)
            return status in ("WARN", "ERR") and bool(partitions & {"STOP", "STALL", "WARN"})

        eventually(lagging, "Burrow to find the stopped router lagging", timeout=90, every=1)
        assert lags[-1] > lags[0] and lags[-1] >= 40, lags
        # The lag keeps growing while nobody archives.
        burst(100, seed=999)
        eventually(lambda: judged(burrow.group_status(group), topic_name)[1] >= lags[-1] + 100,
                   "Burrow's total lag to grow by the 100 records produced", timeout=30)  # fmt: skip
    assert router.returncode == 0, (tmp_path / "router.log").read_text()[-3000:]


def stop(router: subprocess.Popen[bytes]) -> None:
    if router.poll() is None:
        router.send_signal(signal.SIGINT)
        router.wait(120)


def test_local_burrow_refuses_when_no_stack_runs(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bergstream", "local", "burrow", "--data-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "no local stack runs" in done.stderr
