"""`bergstream local`: the embedded stack as a user drives it, through the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bergstream.home import read_catalog
from bergstream.local import LocalStack
from bergstream.local.processes import alive, free_port, free_ports

pytestmark = pytest.mark.integration
BERGSTREAM = [sys.executable, "-m", "bergstream"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BERGSTREAM, *args], capture_output=True, text=True, check=False, env=env, timeout=180
    )


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected a one-line error, got:\n{done.stderr}"
    return lines[0]


@pytest.fixture
def stack_dir(tmp_path: Path) -> Path:
    yield tmp_path / "stack"
    run("local", "down", "--data-dir", str(tmp_path / "stack"))


def ports() -> list[str]:
    kafka_port, controller_port = free_ports(2)
    return ["--kafka-port", str(kafka_port), "--controller-port", str(controller_port)]


def test_up_status_down_and_the_log_survives_a_restart(stack_dir: Path) -> None:
    data = ["--data-dir", str(stack_dir)]
    up = run("local", "up", *data, *ports())
    assert up.returncode == 0, up.stderr
    status = json.loads(run("local", "status", *data, "--json").stdout)
    assert status["running"] is True
    assert status["bootstrap_servers"].startswith("127.0.0.1:")
    assert status["catalog_uri"] == f"jdbc:sqlite:{stack_dir}/catalog/catalog.db"
    assert status["warehouse"] == (stack_dir / "warehouse").as_uri()
    # Read by code below the local stack that names no catalog (read_batches).
    assert read_catalog(stack_dir) == LocalStack.at(stack_dir).config.catalog
    pid = status["broker_pid"]

    bootstrap = status["bootstrap_servers"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("kept", 1, 1)])["kept"].result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        producer.produce("kept", value=str(i).encode())
    assert producer.flush(30) == 0

    assert run("local", "down", *data).returncode == 0
    assert not alive(pid)
    stopped = run("local", "status", *data, "--json")
    assert stopped.returncode == 1
    assert json.loads(stopped.stdout)["running"] is False

    assert run("local", "up", *data, *ports()).returncode == 0
    bootstrap = json.loads(run("local", "status", *data, "--json").stdout)["bootstrap_servers"]
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check"})
    low, high = consumer.get_watermark_offsets(TopicPartition("kept", 0), timeout=30)
    consumer.close()
    assert (low, high) == (0, 10)


def test_up_twice_is_refused(stack_dir: Path) -> None:
    data = ["--data-dir", str(stack_dir)]
    assert run("local", "up", *data, *ports()).returncode == 0
    again = run("local", "up", *data, *ports())
    assert again.returncode != 0
    assert "already running" in error_line(again)


def test_down_with_nothing_running(tmp_path: Path) -> None:
    done = run("local", "down", "--data-dir", str(tmp_path))
    assert done.returncode != 0
    assert "nothing is running" in error_line(done)


def test_a_taken_port_is_named_and_nothing_is_left_running(stack_dir: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run("local", "up", "--data-dir", str(stack_dir), "--kafka-port", str(port),
                   "--controller-port", str(free_port()))  # fmt: skip
    assert done.returncode != 0
    assert f"port {port} on 127.0.0.1 is already in use" in error_line(done)
    assert not (stack_dir / "kafka" / "broker.pid").exists()


def test_missing_java_is_named(stack_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)
    done = run("local", "up", "--data-dir", str(stack_dir), *ports(), env=env)
    assert done.returncode != 0
    assert "'java' was not found" in error_line(done)
    assert not (stack_dir / "kafka" / "broker.pid").exists()


def test_missing_maven_is_named(stack_dir: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PATH": str(Path(sys.executable).parent),
        "BERGSTREAM_CACHE": str(tmp_path / "empty"),
    }
    done = run("local", "up", "--data-dir", str(stack_dir), *ports(), env=env)
    assert done.returncode != 0
    assert "'mvn' was not found" in error_line(done)


def test_a_non_loopback_host_is_refused(stack_dir: Path) -> None:
    done = run("local", "up", "--data-dir", str(stack_dir), "--host", "0.0.0.0")
    assert done.returncode != 0
    assert "loopback only" in error_line(done)


def test_a_stale_pid_file_of_another_process_is_not_the_broker(stack_dir: Path) -> None:
    pid_file = stack_dir / "kafka" / "broker.pid"
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text(str(os.getpid()))  # after a reboot the pid may belong to anything: here, pytest
    status = run("local", "status", "--data-dir", str(stack_dir), "--json")
    assert json.loads(status.stdout)["running"] is False
    down = run("local", "down", "--data-dir", str(stack_dir))
    assert "nothing is running" in error_line(down)
    assert alive(os.getpid())
    assert run("local", "up", "--data-dir", str(stack_dir), *ports()).returncode == 0


def test_storage_format_takes_a_cluster_id_that_starts_with_a_dash(tmp_path: Path) -> None:
    from bergstream.local import kafka_broker

    config = kafka_broker.BrokerConfig(home=tmp_path, host="127.0.0.1", port=1, controller_port=2)
    tmp_path.mkdir(exist_ok=True)
    config.properties_file.write_text(kafka_broker.server_properties(config))
    kafka_broker.format_storage(config, "-" + "A" * 21)
    assert "cluster.id=-AAAAAAAAAAAAAAAAAAAAA" in (config.log_dir / "meta.properties").read_text()


def test_a_relative_folder_is_kept_as_an_absolute_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bergstream.local.stack_config import StackConfig

    monkeypatch.chdir(tmp_path)
    config = StackConfig(data_dir=Path("stack"))
    assert config.data_dir == tmp_path / "stack"
    assert config.catalog.warehouse == (tmp_path / "stack" / "warehouse").as_uri()
