"""The Java client's security settings, translated for librdkafka: no broker needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bergstream.errors import ConfigError
from bergstream.kafka_settings import librdkafka_settings, read_properties, write_properties

PASSWORD = 'p4ss "quoted" \\ word'
JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="router-playback" password="p4ss \\"quoted\\" \\\\ word";'
)
KERBEROS = "com.sun.security.auth.module.Krb5LoginModule"
SECURED = {
    "kafka.bootstrap.servers": "127.0.0.1:9093",
    "kafka.security.protocol": "sasl_ssl",
    "kafka.sasl.mechanism": "SCRAM-SHA-512",
    "kafka.sasl.jaas.config": JAAS,
    "kafka.ssl.truststore.type": "PEM",
    "kafka.ssl.truststore.location": "/etc/kafka/ca.pem",
    "kafka.ssl.endpoint.identification.algorithm": "",
    # Spark's consumer's business, and the JVM's TLS choices: not the router's own clients'.
    "kafka.max.poll.records": "500",
    "kafka.ssl.enabled.protocols": "TLSv1.3",
    "startingOffsets": "earliest",
}


def test_a_secured_source_is_translated() -> None:
    assert librdkafka_settings(SECURED, prefix="kafka.") == {
        "bootstrap.servers": "127.0.0.1:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "router-playback",
        "sasl.password": PASSWORD,
        "ssl.ca.location": "/etc/kafka/ca.pem",
        "ssl.endpoint.identification.algorithm": "none",
    }


def test_plain_login_and_key_stores() -> None:
    java = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required username=u "
        'password="s";',
        "ssl.truststore.type": "pem",
        "ssl.truststore.certificates": "-----BEGIN CERTIFICATE-----...",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": "/etc/kafka/client.p12",
        "ssl.keystore.password": "k",
    }
    assert librdkafka_settings(java) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "s",
        "ssl.ca.pem": "-----BEGIN CERTIFICATE-----...",
        "ssl.keystore.location": "/etc/kafka/client.p12",
        "ssl.keystore.password": "k",
    }


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"kafka.ssl.truststore.type": "JKS"}, "kafka.ssl.truststore.type JKS: librdkafka reads a PEM"),
        ({"kafka.ssl.keystore.location": "/k.jks"}, "kafka.ssl.keystore.type JKS: librdkafka reads a PKCS12"),
        ({"kafka.sasl.username": "u"}, "kafka.sasl.username has no equivalent in librdkafka"),
        ({"kafka.sasl.login.callback.handler.class": "x.Y"}, "kafka.sasl.login.callback.handler.class"),
        ({"kafka.security.protocol": "TLS"}, "kafka.security.protocol 'TLS' is not one of"),
        ({"kafka.ssl.endpoint.identification.algorithm": "ldap"}, "only https, or empty for none"),
        (
            {"kafka.sasl.jaas.config": f'{KERBEROS} required p="{PASSWORD}"'},
            f"kafka.sasl.jaas.config: login module {KERBEROS} has no equivalent",
        ),
        (
            {"kafka.sasl.jaas.config": JAAS.replace("username=", "tokenauth=true username=")},
            "option tokenauth of org.apache.kafka.common.security.scram.ScramLoginModule",
        ),
        ({"kafka.sasl.jaas.config": f"username={PASSWORD}"}, "kafka.sasl.jaas.config is not a JAAS entry"),
    ],
)
def test_what_librdkafka_cannot_follow_is_refused_by_name_never_by_value(
    setting: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        librdkafka_settings({**SECURED, **setting}, prefix="kafka.")
    assert message in str(refused.value)
    assert "p4ss" not in str(refused.value)


def test_properties_files_round_trip_and_stay_private(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    settings = {"sasl.jaas.config": JAAS, "bootstrap.servers": "a:1,b:2", "odd": "line\nbreak \\ back"}
    write_properties(path, settings, "a user's settings")
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_properties(path) == settings


def test_properties_as_java_writes_them(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text(
        "# comment\n! another\n\nsecurity.protocol = SASL_SSL\nsasl.mechanism:SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '    username="u" password="p";\nclient.id\\=x value\n'
    )
    assert read_properties(path) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" '
        'password="p";',
        "client.id=x": "value",
    }


class _Polled:
    """A client whose poll serves nothing: what librdkafka said came before."""

    def poll(self, timeout: float) -> None:
        pass


def test_records_purged_after_a_fatal_error_only_logged_are_explained_by_it() -> None:
    from confluent_kafka import KafkaError

    from bergstream.kafka_settings import ClientErrors

    errors = ClientErrors()
    purged = KafkaError(KafkaError._PURGE_QUEUE)
    assert errors.explain(_Polled(), purged) == purged.str()
    reason = "Fatal error: Broker: Cluster authorization failed: Failed to acquire idempotence PID"
    errors.log(0, "%s [%s] %s", "FATAL", "rdkafka#producer-2", f"[thrd:main]: {reason}")
    assert errors.explain(_Polled(), purged) == f"not authorized: {reason}"
    # A broker's own refusal still says more.
    refused = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    assert errors.explain(_Polled(), refused) == refused.str()


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("produce", ["--topic", "t", "--count", "1"]),
        ("backfill replay", ["--table", "t", "--to-topic", "u", "--start", "2026-11-22T00:00:00Z",
                             "--end", "2026-11-22T01:00:00Z", "--producer-property", "linger.ms=5"]),
    ],
)  # fmt: skip
def test_kafka_tools_option_names_are_taken_as_aliases(command: str, args: list[str]) -> None:
    from bergstream.cli import cli

    group, *names = command.split()
    chosen = cli.commands[group]
    for name in names:
        chosen = chosen.commands[name]  # type: ignore[attr-defined]
    aliases = ["--bootstrap-server", "127.0.0.1:9092", "--command-config", "client.properties"]
    context = chosen.make_context(command, [*args, *aliases])
    assert context.params["bootstrap_servers"] == "127.0.0.1:9092"
    assert context.params["client_config"] == Path("client.properties")
    if "--producer-property" in args:
        assert context.params["producer_options"] == ("linger.ms=5",)


def test_a_producer_option_without_a_value_is_refused_naming_it() -> None:
    from click.testing import CliRunner

    from bergstream.cli import cli

    refused = CliRunner().invoke(cli, [
        "backfill", "replay", "--table", "t", "--to-topic", "u", "--start", "2026-11-22T00:00:00Z",
        "--end", "2026-11-22T01:00:00Z", "--bootstrap-server", "127.0.0.1:1",
        "--producer-property", "linger.ms",
    ])  # fmt: skip
    assert refused.exit_code == 2
    assert "'linger.ms': write KEY=VALUE" in refused.output and "--producer-option" in refused.output
