"""Burrow (LinkedIn's consumer lag checker) for the local stack: its configuration, and a server on 127.0.0.1.

The router commits its progress to the consumer group `bergstream-router.<topic>`; Burrow reads those
commits from `__consumer_offsets` and the partitions' log ends, and judges each group OK, WARN or ERR.

Burrow 1.9.5 is the first that reads a Kafka 4 cluster. Older ones, Debian 12's 1.2.1 among them, ask the
brokers for log ends with ListOffsets version 0, which Kafka 4.0 removed (the broker answers
UnsupportedVersionException and closes the connection), cannot decode the version 4 offset commit values
that Kafka 4 writes, and need a ZooKeeper of their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bergstream.errors import MissingToolError, StackError
from bergstream.local import processes

# Burrow reads client versions through sarama; 1.9.5's sarama knows Kafka 4.0's protocol at most.
KAFKA_VERSION = "4.0.0"
BINARY_VARIABLE = "BERGSTREAM_BURROW"
OFFSETS_TOPIC = "__consumer_offsets"
TOO_OLD = (
    "Burrow older than 1.9.5 (Debian 12's burrow package is 1.2.1) cannot read a Kafka 4 cluster: it asks "
    "for log ends with ListOffsets version 0, which Kafka 4 no longer serves, and cannot decode the offset "
    "commits Kafka 4 writes; install Burrow 1.9.5 or newer"
)


@dataclass(frozen=True)
class BurrowSettings:
    """Burrow's view of one cluster: how often it reads topics and log ends, how many commits per partition
    it keeps to judge a group by (its evaluation window), where its HTTP API listens."""

    bootstrap_servers: str
    http_port: int
    cluster: str = "local"
    host: str = "127.0.0.1"
    topic_refresh_seconds: int = 60
    offset_refresh_seconds: int = 10
    intervals: int = 10
    expire_cache_seconds: int = 10

    def toml(self, home: Path) -> str:
        servers = json.dumps(self.bootstrap_servers.split(","))
        return f"""[general]
pidfile = {json.dumps(str(home / "burrow.pid"))}

[logging]
level = "info"

[client-profile.bergstream]
client-id = "burrow-bergstream"
kafka-version = "{KAFKA_VERSION}"

[cluster.{self.cluster}]
class-name = "kafka"
servers = {servers}
client-profile = "bergstream"
topic-refresh = {self.topic_refresh_seconds}
offset-refresh = {self.offset_refresh_seconds}

[consumer.{self.cluster}]
class-name = "kafka"
cluster = "{self.cluster}"
servers = {servers}
client-profile = "bergstream"

[httpserver.default]
address = "{self.host}:{self.http_port}"

[storage.default]
class-name = "inmemory"
intervals = {self.intervals}
min-distance = 1

[evaluator.default]
class-name = "caching"
expire-cache = {self.expire_cache_seconds}
"""


def burrow_binary() -> str:
    """$BERGSTREAM_BURROW, else `burrow` or Debian's `Burrow` on the PATH."""
    chosen = os.environ.get(BINARY_VARIABLE)
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise MissingToolError(f"{BINARY_VARIABLE}={chosen} is not an executable file")
        return chosen
    found = shutil.which("burrow") or shutil.which("Burrow")
    if found is None:
        raise MissingToolError(
            f"Burrow was not found on the PATH; install Burrow 1.9.5 or newer or set {BINARY_VARIABLE}"
        )
    return found


@dataclass(frozen=True)
class BurrowServer:
    url: str
    cluster: str

    def get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as answer:
            body: dict[str, Any] = json.load(answer)
        return body

    def group_status(self, group: str) -> dict[str, Any]:
        """Burrow's judgement of a consumer group: status (NOTFOUND, OK, WARN, ERR), totallag, partitions."""
        try:
            status: dict[str, Any] = self.get(f"/v3/kafka/{self.cluster}/consumer/{group}/lag")["status"]
        except urllib.error.HTTPError as error:  # an unknown group answers 404 with a NOTFOUND status
            if error.code != 404:
                raise
            status = json.load(error)["status"]
        return status


def ensure_offsets_topic(bootstrap_servers: str, timeout: float = 60) -> None:
    """Burrow's consumer stops at start when `__consumer_offsets` is missing, as it is on a cluster no group
    has used yet: asking for a group's coordinator makes Kafka create it."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "burrow-bergstream"})
    deadline = time.monotonic() + timeout
    try:
        while OFFSETS_TOPIC not in consumer.list_topics(timeout=10).topics:
            with contextlib.suppress(KafkaException):  # the coordinator loads while the topic is made
                consumer.committed([TopicPartition(OFFSETS_TOPIC, 0)], timeout=5)
            if time.monotonic() > deadline:
                raise StackError(
                    f"Kafka at {bootstrap_servers} did not create {OFFSETS_TOPIC} in {timeout:.0f}s"
                )
            time.sleep(0.5)
    finally:
        consumer.close()


@contextmanager
def burrow_server(settings: BurrowSettings, home: Path | None = None) -> Iterator[BurrowServer]:
    """Burrow watching `settings.bootstrap_servers`, until the block ends; its files in `home` (made and
    removed here when not given)."""
    binary = burrow_binary()
    if processes.port_in_use(settings.host, settings.http_port):
        raise StackError(
            f"port {settings.http_port} on {settings.host} is already in use; choose another for Burrow's API"
        )
    owned = home is None
    home = Path(tempfile.mkdtemp(prefix="bergstream-burrow-")) if home is None else home
    home.mkdir(parents=True, exist_ok=True)
    (home / "burrow.toml").write_text(settings.toml(home))
    ensure_offsets_topic(settings.bootstrap_servers)
    log_file = home / "burrow.log"
    with log_file.open("ab") as log:
        process = subprocess.Popen(
            [binary, "-config-dir", str(home)], stdout=log, stderr=subprocess.STDOUT, cwd=home,
            start_new_session=True,
        )  # fmt: skip
    server = BurrowServer(f"http://{settings.host}:{settings.http_port}", settings.cluster)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{server.url}/burrow/admin", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    output = log_file.read_text(errors="replace")
                    if "Zookeeper" in output:
                        raise StackError(f"{binary}: {TOO_OLD}") from None
                    raise StackError(
                        f"Burrow did not start on {settings.host}:{settings.http_port}: "
                        f"{processes.last_error(log_file)} (see {log_file})"
                    ) from None
                time.sleep(0.3)
        yield server
    finally:
        processes.stop(process.pid, grace_seconds=10)
        process.wait()
        if owned:
            shutil.rmtree(home, ignore_errors=True)
