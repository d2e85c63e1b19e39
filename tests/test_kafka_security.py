"""A secured Kafka (`bergstream local up --security sasl_ssl`): TLS, SCRAM-SHA-512 users and ACLs, through
the router, its consumer group and lag, `produce` and replay; refusals as one line naming their cause;
passwords nowhere but in the settings files and the Kubernetes Secret."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from bergstream.kafka_settings import librdkafka_settings, read_properties, write_properties
from bergstream.kafka_topics import ensure_topic
from bergstream.local import LocalStack, certificates, kafka_security
from bergstream.local.kafka_security import ADMIN, PRODUCER, BrokerSecurity, jaas_login
from bergstream.local.processes import free_ports
from bergstream.spark import LOCAL_LOG_CONFIG
from tests.kafka_reads import read_committed
from tests.routers import ROOT, archived_offsets, eventually, run_router, start_router, write_config
from tests.services import Services

pytestmark = pytest.mark.integration
TOPIC = "secured_playback"
ROUTER_USER = kafka_security.router_user(TOPIC)
COUNT = 3000
SPARK_LOG_CONFIG = LOCAL_LOG_CONFIG


def bergstream(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bergstream", *args], capture_output=True, text=True, check=False,
        timeout=timeout, cwd=ROOT,
    )  # fmt: skip


@dataclass
class Secured:
    data_dir: Path
    services: Services
    security: BrokerSecurity
    # Everything the stack's commands printed, to search for passwords.
    outputs: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrap_servers(self) -> str:
        return self.services.bootstrap_servers

    def java(self, user: str) -> dict[str, str]:
        return self.security.client_settings(user, self.bootstrap_servers)

    def client(self, user: str) -> dict[str, str]:
        return librdkafka_settings(self.java(user))

    def secrets(self) -> dict[str, str]:
        saved = json.loads(self.security.secrets_file.read_text())
        return {"keystore password": saved["keystore_password"], **saved["users"]}

    def assert_no_secret(self, text: str, where: str) -> None:
        for name, secret in self.secrets().items():
            assert secret not in text, f"the password of {name} appears in {where}"


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The error a command ended with: its last line, which is all of it."""
    assert done.returncode == 1, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("bergstream: error: "), done.stderr[-3000:]
    return line


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    data_dir = tmp_path_factory.mktemp("secured") / "stack"
    kafka_port, controller_port = free_ports(2)
    data = ["--data-dir", str(data_dir)]
    up = bergstream("local", "up", *data, "--security", "sasl_ssl",
                    "--kafka-port", str(kafka_port), "--controller-port", str(controller_port))  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        stack = LocalStack.at(data_dir)
        services = Services(stack.config.broker.bootstrap_servers, stack.config.catalog, None)
        security = stack.config.kafka_security
        assert security is not None
        yield Secured(data_dir, services, security, {"local up": up.stdout + up.stderr})
    finally:
        bergstream("local", "down", *data)


@pytest.fixture(scope="module")
def topic(secured: Secured) -> str:
    """The topic, and its router's user."""
    ensure_topic(secured.client(ADMIN), TOPIC, 4)
    LocalStack.at(secured.data_dir).router_client(TOPIC)
    return TOPIC


def test_status_says_how_to_connect_and_where_the_passwords_are(secured: Secured) -> None:
    shown = bergstream("local", "status", "--data-dir", str(secured.data_dir))
    status = json.loads(bergstream("local", "status", "--data-dir", str(secured.data_dir), "--json").stdout)
    assert status["security"] == "sasl_ssl"
    assert status["ca_file"] == str(secured.security.ca_file)
    assert f"producer_config         {secured.security.client_file(PRODUCER)}" in shown.stdout
    admin = read_properties(Path(status["admin_config"]))
    assert admin["security.protocol"] == "SASL_SSL" and admin["sasl.mechanism"] == "SCRAM-SHA-512"
    assert admin["ssl.truststore.location"] == status["ca_file"]
    for path in (status["admin_config"], status["producer_config"], secured.security.secrets_file):
        assert Path(path).stat().st_mode & 0o777 == 0o600
    secured.assert_no_secret(shown.stdout + shown.stderr, "local status")
    secured.assert_no_secret(secured.outputs["local up"], "local up")
    # The broker logs its settings, passwords hidden.
    log = (secured.data_dir / "kafka" / "broker.log").read_text()
    assert "ssl.keystore.password = [hidden]" in log
    secured.assert_no_secret(log, "the broker's log")


@dataclass(frozen=True)
class Archived:
    config: Path
    produced: list[tuple[int, int]]
    committed: dict[int, int]
    outputs: dict[str, str]


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def group_offsets(secured: Secured, group: str) -> dict[int, int]:
    # A consumer of the group: librdkafka 2.16's AdminClient can crash while the coordinator loads.
    consumer = Consumer({**secured.client(ADMIN), "group.id": group})
    try:
        committed = consumer.committed([TopicPartition(TOPIC, p) for p in range(4)], timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in committed if tp.offset >= 0}


def end_offsets(secured: Secured, topic: str, partitions: int = 4) -> dict[int, int]:
    consumer = Consumer({**secured.client(ADMIN), "group.id": "bergstream-tests"})
    try:
        marks = [consumer.get_watermark_offsets(TopicPartition(topic, p), 10) for p in range(partitions)]
        return {p: high for p, (_, high) in enumerate(marks)}
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def archived(secured: Secured, topic: str, tmp_path_factory: pytest.TempPathFactory) -> Archived:
    """The topic produced as the stack's producer, archived by a router that logs in as its own user, with
    Kafka's and Spark's Kafka logging turned up, its UI and metrics on, then replayed into another topic."""
    tmp = tmp_path_factory.mktemp("archived")
    data = ["--data-dir", str(secured.data_dir)]
    started = datetime.now(UTC) - timedelta(minutes=5)
    outputs: dict[str, str] = {}
    produced = bergstream("produce", *data, "--topic", TOPIC, "--schema", "playback",
                          "--count", str(COUNT), "--bad-fraction", "0.02")  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    outputs["produce"] = produced.stdout + produced.stderr
    made = bergstream("local", "router-user", *data, "--topic", TOPIC)
    assert made.returncode == 0, made.stderr
    outputs["local router-user"] = made.stdout + made.stderr
    assert str(secured.security.client_file(ROUTER_USER)) in made.stdout

    log_config = tmp / "log4j2.properties"
    log_config.write_text(
        SPARK_LOG_CONFIG.read_text() + "logger.kafka.name = org.apache.kafka\nlogger.kafka.level = info\n"
        "logger.source.name = org.apache.spark.sql.kafka010\nlogger.source.level = debug\n"
    )
    metrics_port, ui_port = free_ports(2)
    login = read_properties(secured.security.client_file(ROUTER_USER))
    config = write_config(
        secured.services, tmp, TOPIC, metrics_port=metrics_port, metrics_host="127.0.0.1",
        kafka={**{f"kafka.{key}": value for key, value in login.items()}, "startingOffsets": "earliest"},
        spark={"master": "local[2]", "conf": {
            "spark.ui.enabled": "true", "spark.ui.port": str(ui_port), "spark.sql.shuffle.partitions": "2",
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log_config}",
            # A login set where Spark shows its settings: the UI must redact it.
            "spark.bergstream.test.sasl.jaas.config": login["sasl.jaas.config"],
        }},
    )  # fmt: skip
    router_log = tmp / "router.log"
    router = start_router(TOPIC, config, router_log)
    try:
        ends = end_offsets(secured, TOPIC)
        expected = sorted((p, offset) for p, end in ends.items() for offset in range(end))
        assert len(expected) == COUNT

        def all_archived() -> bool:
            try:
                return len(archived_offsets(secured.services, TOPIC)) >= COUNT
            except Exception:  # the tables are not there yet
                return False

        eventually(all_archived, "every record archived", timeout=240)
        eventually(
            lambda: group_offsets(secured, f"bergstream-router.{TOPIC}") == ends,
            "the group commit",
            timeout=240,
        )
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        eventually(lambda: bool(lag_offsets(fetch(metrics_url))), "lag metrics", timeout=240)
        # The group is committed just before the lag is read again: give that read its time, then keep
        # what the metrics say, zero or not, for the test to judge.
        deadline = time.monotonic() + 60
        while set(lag_offsets(fetch(metrics_url))) != {0.0} and time.monotonic() < deadline:
            time.sleep(0.5)
        outputs["metrics"] = fetch(metrics_url)
        ui = f"http://127.0.0.1:{ui_port}/api/v1/applications"
        application = json.loads(fetch(ui))[0]["id"]
        outputs["Spark UI environment"] = fetch(f"{ui}/{application}/environment")
        outputs["Spark UI SQL"] = fetch(f"{ui}/{application}/sql?details=true")
    finally:
        router.send_signal(signal.SIGTERM)
        router.wait(timeout=120)
    outputs["router log"] = router_log.read_text(errors="replace")
    assert router.returncode == 0, outputs["router log"][-3000:]

    ended = datetime.now(UTC) + timedelta(minutes=5)
    replayed = bergstream(
        "backfill", "replay", *data, "--table", TOPIC, "--start", started.isoformat(),
        "--end", ended.isoformat(), "--max-misalignment", "15m", "--to-topic", f"{TOPIC}_replay",
        "--include-dead-letters",
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    outputs["replay"] = replayed.stdout + replayed.stderr
    return Archived(config, expected, ends, outputs)


def test_the_router_archives_every_offset_once_through_sasl_ssl(secured: Secured, archived: Archived) -> None:
    assert sorted(archived_offsets(secured.services, TOPIC)) == archived.produced


def lag_offsets(metrics: str) -> list[float]:
    """The router's lag per partition, from its metrics endpoint's text."""
    return [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("bergstream_router_lag_offsets{")
    ]


def test_the_router_commits_its_group_and_measures_lag(secured: Secured, archived: Archived) -> None:
    assert group_offsets(secured, f"bergstream-router.{TOPIC}") == archived.committed
    lags = lag_offsets(archived.outputs["metrics"])
    assert len(lags) == 4 and set(lags) == {0.0}


def test_replay_republishes_through_sasl_ssl(secured: Secured, archived: Archived) -> None:
    assert f"into {TOPIC}_replay" in archived.outputs["replay"]
    assert len(read_committed(secured.client(ADMIN), f"{TOPIC}_replay", "bergstream-tests")) == COUNT


def test_passwords_appear_in_no_output(secured: Secured, archived: Archived) -> None:
    outputs = archived.outputs
    # Kafka's clients and Spark's Kafka source did log their settings, passwords hidden.
    assert "sasl.jaas.config = [hidden]" in outputs["router log"]
    environment = json.loads(outputs["Spark UI environment"])
    shown = dict(environment["sparkProperties"])
    assert shown["spark.bergstream.test.sasl.jaas.config"] == "*********(redacted)"
    for where, text in outputs.items():
        secured.assert_no_secret(text, where)


def test_the_kubernetes_secret_alone_holds_the_password(
    secured: Secured, archived: Archived, tmp_path: Path
) -> None:
    settings = yaml.safe_load(archived.config.read_text())
    del settings["spark"]["conf"]["spark.bergstream.test.sasl.jaas.config"]  # planted for the UI test
    config = tmp_path / f"{TOPIC}.yaml"
    config.write_text(yaml.safe_dump(settings))
    rendered = bergstream("deploy", "kubernetes", "--topic", TOPIC, "--config", str(config))
    assert rendered.returncode == 0, rendered.stderr
    password = secured.secrets()[ROUTER_USER]
    manifests = list(yaml.safe_load_all(rendered.stdout))
    (secret,) = [m for m in manifests if m["kind"] == "Secret"]
    assert password in yaml.safe_dump(secret)
    for manifest in manifests:
        if manifest is not secret:
            assert password not in yaml.safe_dump(manifest), manifest["kind"]
    submit = bergstream("deploy", "spark-submit", "--topic", TOPIC, "--config", str(config))
    assert submit.returncode == 0, submit.stderr
    secured.assert_no_secret(submit.stdout + submit.stderr + rendered.stderr, "deploy spark-submit")


def test_the_router_user_may_do_nothing_else(secured: Secured, topic: str, tmp_path: Path) -> None:
    admin = AdminClient(secured.client(ADMIN))
    admin.create_topics([NewTopic(f"{TOPIC}_other", 1, 1)])[f"{TOPIC}_other"].result(30)
    of_the_router = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{ROUTER_USER}", None, AclOperation.ANY,
        AclPermissionType.ANY,
    )  # fmt: skip
    listed = admin.describe_acls(of_the_router).result(timeout=30)
    assert sorted((b.restype.name, b.name, b.operation.name, b.permission_type.name) for b in listed) == [
        ("GROUP", f"bergstream-router.{TOPIC}", "READ", "ALLOW"),
        ("TOPIC", TOPIC, "READ", "ALLOW"),
    ]
    router = secured.client(ROUTER_USER)
    consumer = Consumer({**router, "group.id": f"bergstream-router.{TOPIC}"})
    try:
        assert consumer.list_topics(TOPIC, timeout=30).topics[TOPIC].error is None
        other = consumer.list_topics(f"{TOPIC}_other", timeout=30).topics[f"{TOPIC}_other"]
        assert other.error is not None and other.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        consumer.close()
    someone_else = Consumer({**router, "group.id": "someone-else"})
    try:
        with pytest.raises(KafkaException):
            someone_else.committed([TopicPartition(TOPIC, 0)], timeout=5)
        refused = someone_else.poll(1)
        assert refused is not None and refused.error().code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        someone_else.close()
    as_router = AdminClient(router)
    with pytest.raises(KafkaException) as refused:
        as_router.create_topics([NewTopic(f"{TOPIC}_new", 1, 1)])[f"{TOPIC}_new"].result(30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    wrote = bergstream("produce", "--topic", TOPIC, "--schema", "playback", "--count", "5",
                       "--client-config", str(secured.security.client_file(ROUTER_USER)))  # fmt: skip
    assert "not authorized" in error_line(wrote) and len(wrote.stderr.strip().splitlines()) == 1
    secured.assert_no_secret(wrote.stderr, "produce's error")


def refused_router(secured: Secured, tmp_path: Path, kafka: dict[str, str]) -> str:
    config = write_config(secured.services, tmp_path, TOPIC, kafka={"startingOffsets": "earliest", **kafka})
    done = run_router(TOPIC, config, "--available-now", timeout=180)
    secured.assert_no_secret(done.stdout + done.stderr, "the router's error")
    return error_line(done)


def as_router(secured: Secured, user: str, **changes: str) -> dict[str, str]:
    return {f"kafka.{key}": value for key, value in {**secured.java(user), **changes}.items()}


def test_a_wrong_password_is_named(secured: Secured, topic: str, tmp_path: Path) -> None:
    wrong = jaas_login(ROUTER_USER, "not-the-password")
    error = refused_router(secured, tmp_path, as_router(secured, ROUTER_USER, **{"sasl.jaas.config": wrong}))
    assert f"cannot reach Kafka for topic {TOPIC}: authentication failed:" in error
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in error

    settings = tmp_path / "wrong.properties"
    write_properties(settings, {**secured.java(PRODUCER), "sasl.jaas.config": wrong}, "a wrong password")
    sent = bergstream("produce", "--topic", TOPIC, "--schema", "playback", "--count", "5",
                      "--client-config", str(settings))  # fmt: skip
    assert "authentication failed" in error_line(sent) and len(sent.stderr.strip().splitlines()) == 1


def test_an_untrusted_certificate_is_named(secured: Secured, topic: str, tmp_path: Path) -> None:
    store, password = certificates.make_authority(tmp_path / "other-ca", "another CA")
    certificates.export_authority(store, password, tmp_path / "other-ca.pem")
    other = {"ssl.truststore.location": str(tmp_path / "other-ca.pem")}
    error = refused_router(secured, tmp_path, as_router(secured, ROUTER_USER, **other))
    assert "TLS failed, the broker's certificate is not trusted or not valid" in error
    assert "certificate verify failed" in error

    settings = tmp_path / "untrusted.properties"
    write_properties(settings, {**secured.java(PRODUCER), **other}, "another CA")
    sent = bergstream("produce", "--topic", TOPIC, "--schema", "playback", "--count", "5",
                      "--client-config", str(settings))  # fmt: skip
    assert "certificate verify failed" in error_line(sent) and len(sent.stderr.strip().splitlines()) == 1


def test_a_missing_acl_is_named_with_the_topic_or_group(secured: Secured, topic: str, tmp_path: Path) -> None:
    topic_only = kafka_security.router_acls("no-group", TOPIC)[:1]
    group_only = kafka_security.router_acls("no-topic", TOPIC)[1:]
    secured.security.add_user("no-group", secured.bootstrap_servers, topic_only)
    secured.security.add_user("no-topic", secured.bootstrap_servers, group_only)
    error = refused_router(secured, tmp_path, as_router(secured, "no-group"))
    assert f"Kafka refuses the router's consumer group bergstream-router.{TOPIC}: not authorized:" in error
    assert f"its user needs READ on group bergstream-router.{TOPIC}" in error
    error = refused_router(secured, tmp_path, as_router(secured, "no-topic"))
    assert f"Kafka refuses topic {TOPIC} to the router: not authorized: Broker: Topic authorization" in error
    assert f"its user needs READ on topic {TOPIC}" in error


def test_a_secured_stack_restarts_with_its_users_and_only_secured(secured: Secured, topic: str) -> None:
    stack = LocalStack.at(secured.data_dir).config
    data = ["--data-dir", str(secured.data_dir)]
    ports = ["--kafka-port", str(stack.kafka_port), "--controller-port", str(stack.controller_port)]
    assert bergstream("local", "down", *data).returncode == 0
    plain = bergstream("local", "up", *data, *ports)
    assert "was made with --security sasl_ssl" in error_line(plain)
    again = bergstream("local", "up", *data, *ports, "--security", "sasl_ssl")
    assert again.returncode == 0, again.stderr
    sent = bergstream("produce", *data, "--topic", TOPIC, "--schema", "playback", "--count", "10")
    assert sent.returncode == 0, sent.stderr
    secured.security.wait_for_login(ROUTER_USER, secured.bootstrap_servers)
