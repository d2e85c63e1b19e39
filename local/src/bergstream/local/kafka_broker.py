"""Apache Kafka brokers in KRaft mode, run from the jars pinned in jvm/pom.xml: one node, or a cluster of
several on one machine, each node both broker and controller.

Without security it listens in plain text; secured, clients log in with SASL/SCRAM-SHA-512 over TLS and
ACLs say what each may do (kafka_security.py).
"""

from __future__ import annotations

import base64
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bergstream import jars
from bergstream.errors import StackError, require_tool
from bergstream.local import processes
from bergstream.local.kafka_security import BrokerSecurity

MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
LOG4J_CONFIG = Path(__file__).parent / "log4j2.properties"
READY_TIMEOUT_SECONDS = 90.0


@dataclass(frozen=True)
class BrokerConfig:
    home: Path
    host: str
    port: int
    controller_port: int
    partitions: int = 4
    heap: str = "1g"
    security: BrokerSecurity | None = None
    node_id: int = 1
    # (node id, controller port) of every node of the cluster; empty for a node alone.
    voters: tuple[tuple[int, int], ...] = ()
    # How long a new consumer group waits for more members before its first assignment. 0: a test's
    # group forms at once. Kafka's default, 3,000, lets members that start together (a Kafka Connect
    # sink's tasks) join one assignment instead of a rebalance each.
    group_initial_rebalance_delay_ms: int = 0

    @property
    def cluster_size(self) -> int:
        return max(1, len(self.voters))

    @property
    def bootstrap_servers(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def admin_config(self) -> dict[str, str]:
        """librdkafka settings of a client that may do anything: the admin's login when secured."""
        if self.security is None:
            return {"bootstrap.servers": self.bootstrap_servers}
        return self.security.admin_config(self.bootstrap_servers)

    @property
    def log_dir(self) -> Path:
        return self.home / "data"

    @property
    def properties_file(self) -> Path:
        return self.home / "server.properties"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "broker.log"


def server_properties(config: BrokerConfig) -> str:
    host = f"[{config.host}]" if ":" in config.host else config.host
    voters = config.voters or ((config.node_id, config.controller_port),)
    # Three copies, of which two must have a write, where there are three nodes: a node may go down without
    # losing an acknowledged record or refusing writes.
    replicas = min(3, config.cluster_size)
    in_sync = 2 if replicas >= 3 else 1
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(config.node_id),
        "controller.quorum.voters": ",".join(f"{node}@{host}:{port}" for node, port in voters),
        "listeners": f"PLAINTEXT://{host}:{config.port},CONTROLLER://{host}:{config.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{config.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(config.log_dir),
        "num.partitions": str(config.partitions),
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(in_sync),
        "offsets.topic.replication.factor": str(replicas),
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(in_sync),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(in_sync),
        "group.initial.rebalance.delay.ms": str(config.group_initial_rebalance_delay_ms),
        "auto.create.topics.enable": "false",
        # A short check interval lets small per-topic retention settings take effect quickly.
        "log.retention.check.interval.ms": "10000",
    }
    if config.security is not None:
        settings.update(config.security.server_properties(host, config.port, config.controller_port))
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    return require_tool("java", "run the Kafka broker (install OpenJDK 17 or newer)")


def _classpath() -> str:
    return os.pathsep.join(str(jar) for jar in jars.kafka_classpath())


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def format_storage(config: BrokerConfig, cluster_id: str) -> None:
    """Write the KRaft metadata of a new cluster into the node's log directory; secured, with the admin's
    SCRAM credential, which the brokers log in with between them."""
    arguments = [
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", "-cp", _classpath(), STORAGE_TOOL,
        # `=` keeps an id that starts with "-" (base64 does that) from reading as an option.
        "format", f"--cluster-id={cluster_id}", f"--config={config.properties_file}",
        *(config.security.format_arguments() if config.security is not None else []),
    ]  # fmt: skip
    # The arguments go in a file of the owner's (java @file): a password on a command line is visible to
    # every user of the machine.
    argument_file = config.home / "format.args"
    with os.fdopen(os.open(argument_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write("".join(_quoted(argument) + "\n" for argument in arguments))
    try:
        done = subprocess.run([_java(), f"@{argument_file}"], capture_output=True, text=True, check=False)
    finally:
        argument_file.unlink()
    if done.returncode != 0:
        output = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        reason = next((line for line in reversed(output) if "error" in line.lower()), "no reason given")
        raise StackError(f"formatting the Kafka log directory {config.log_dir} failed: {reason}")


def _quoted(argument: str) -> str:
    """One argument of a java @file."""
    return '"' + argument.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _wait_until_ready(config: BrokerConfig, process: subprocess.Popen[bytes]) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**config.admin_config(), "log_level": 0})
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StackError(
                f"the Kafka broker exited with code {process.returncode} while starting; "
                f"{processes.last_error(config.log_file)} (see {config.log_file})"
            )
        try:
            metadata = admin.list_topics(timeout=2)
            if metadata.brokers:
                return
        except Exception:  # not reachable yet; retried until the deadline
            time.sleep(0.5)
    raise StackError(
        f"the Kafka broker did not answer on {config.bootstrap_servers} within {READY_TIMEOUT_SECONDS:.0f}s; "
        f"{processes.last_error(config.log_file)} (see {config.log_file})"
    )


def launch(config: BrokerConfig, cluster_id: str | None = None) -> subprocess.Popen[bytes]:
    """Start the node in the background, formatting its log directory first when new."""
    java = _java()
    classpath = _classpath()
    config.home.mkdir(parents=True, exist_ok=True)
    if config.security is not None:
        config.security.prepare()
    # Secured, the broker's settings hold its key store's password and the admin's.
    config.properties_file.touch(mode=0o600, exist_ok=True)
    config.properties_file.chmod(0o600)
    config.properties_file.write_text(server_properties(config))
    if not (config.log_dir / "meta.properties").exists():
        format_storage(config, cluster_id or new_cluster_id())
    command = [
        java, f"-Xmx{config.heap}", "-Xms256m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", f"-Dkafka.logs.dir={config.home}",
        "-cp", classpath, MAIN_CLASS, str(config.properties_file),
    ]  # fmt: skip
    with config.log_file.open("ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    config.pid_file.write_text(str(process.pid))
    return process


def _abandon(config: BrokerConfig, process: subprocess.Popen[bytes]) -> None:
    processes.stop(process.pid, grace_seconds=5)
    process.wait()
    if processes.read_pid(config.pid_file) == process.pid:
        config.pid_file.unlink()


def start(config: BrokerConfig) -> int:
    """Start the node and return its pid once it answers metadata requests: a node alone, or one node of
    a cluster whose other nodes run (a restart)."""
    return start_cluster([config])[0]


def start_cluster(nodes: list[BrokerConfig]) -> list[int]:
    """Start every node, then wait for each to answer: a quorum of controllers elects a leader only once
    a majority of them runs. New nodes are formatted with one cluster id."""
    cluster_id = new_cluster_id()
    started: list[tuple[BrokerConfig, subprocess.Popen[bytes]]] = []
    try:
        for node in nodes:
            started.append((node, launch(node, cluster_id)))
        for node, process in started:
            _wait_until_ready(node, process)
    except BaseException:
        for node, process in started:
            _abandon(node, process)
        raise
    return [process.pid for _, process in started]


def running_pid(config: BrokerConfig) -> int | None:
    return processes.running_pid(config.pid_file, str(config.properties_file))


def stop(config: BrokerConfig, grace_seconds: float = 30.0) -> bool:
    """Stop the broker; False when none was running."""
    pid = running_pid(config)
    if pid is not None and not processes.stop(pid, grace_seconds):
        raise StackError(
            f"the Kafka broker (pid {pid}) did not stop, even on SIGKILL; {config.pid_file} is kept"
        )
    config.pid_file.unlink(missing_ok=True)
    return pid is not None
