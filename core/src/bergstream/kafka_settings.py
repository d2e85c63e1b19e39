"""Kafka client settings under the Java client's names, as Spark's Kafka source takes them, and their
translation for librdkafka, which bergstream's own clients use: the router's consumer group and lag,
`produce` and replay.

Only where and how to connect is translated (`bootstrap.servers`, `security.protocol`, `sasl.*`, `ssl.*`):
the Java client's other settings tune Spark's consumer, not these clients. A security setting that
librdkafka cannot follow is refused, naming the key; values are never quoted, since they hold passwords.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from bergstream.errors import BergstreamError, ConfigError

log = logging.getLogger("bergstream.kafka")

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SAME_NAME = {
    "bootstrap.servers", "client.dns.lookup", "sasl.mechanism", "sasl.kerberos.service.name",
    "sasl.kerberos.kinit.cmd", "sasl.kerberos.min.time.before.relogin",
}  # fmt: skip
# How the JVM's TLS (JSSE) negotiates; OpenSSL under librdkafka makes these choices itself.
_JSSE_ONLY = {
    "ssl.protocol", "ssl.enabled.protocols", "ssl.cipher.suites", "ssl.keymanager.algorithm",
    "ssl.trustmanager.algorithm", "ssl.secure.random.implementation", "ssl.provider",
}  # fmt: skip
_TRUSTSTORE = ("ssl.truststore.type", "ssl.truststore.location", "ssl.truststore.certificates",
               "ssl.truststore.password")  # fmt: skip
_KEYSTORE = ("ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password", "ssl.keystore.key",
             "ssl.keystore.certificate.chain", "ssl.key.password")  # fmt: skip
_LOGIN_MODULES = (
    "org.apache.kafka.common.security.scram.ScramLoginModule",
    "org.apache.kafka.common.security.plain.PlainLoginModule",
)
_JAAS_ENTRY = re.compile(r"^\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\b(.*?);?\s*$", re.DOTALL)
_JAAS_OPTION = re.compile(r'\s*([\w.-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s";]+))')


def _is_connection_setting(key: str) -> bool:
    return key in ("bootstrap.servers", "client.dns.lookup", "security.protocol") or key.startswith(
        ("sasl.", "ssl.")
    )


def librdkafka_settings(java: Mapping[str, str], prefix: str = "") -> dict[str, str]:
    """The connection settings among `java` (Java client names, each behind `prefix`), for librdkafka.

    Errors name the key as the user wrote it, `prefix` included."""
    options = {key.removeprefix(prefix): value for key, value in java.items() if key.startswith(prefix)}
    settings: dict[str, str] = {}
    for key, value in options.items():
        if not _is_connection_setting(key) or key in _JSSE_ONLY or key in _TRUSTSTORE or key in _KEYSTORE:
            continue
        if key in _SAME_NAME:
            settings[key] = value
        elif key == "security.protocol":
            if value.upper() not in PROTOCOLS:
                raise ConfigError(f"{prefix}{key} {value!r} is not one of {', '.join(PROTOCOLS)}")
            settings[key] = value.upper()
        elif key == "sasl.jaas.config":
            settings.update(_login(value, f"{prefix}{key}"))
        elif key == "ssl.endpoint.identification.algorithm":
            if value.strip().lower() not in ("", "https"):
                raise ConfigError(f"{prefix}{key}: only https, or empty for none, is known to librdkafka")
            settings[key] = value.strip().lower() or "none"
        else:
            raise ConfigError(
                f"{prefix}{key} has no equivalent in librdkafka, which bergstream's own Kafka clients use "
                "(the router's consumer group and lag, produce, replay); give the Java client's settings "
                "that librdkafka follows: security.protocol, sasl.mechanism, sasl.jaas.config (SCRAM or "
                "PLAIN), a PEM or PKCS12 key store, a PEM trust store, ssl.endpoint.identification.algorithm"
            )
    settings.update(_truststore(options, prefix))
    settings.update(_keystore(options, prefix))
    return settings


def _login(jaas: str, key: str) -> dict[str, str]:
    """username and password of a SCRAM or PLAIN login module; never quotes the entry, which holds them."""
    entry = _JAAS_ENTRY.match(jaas)
    if entry is None:
        raise ConfigError(f'{key} is not a JAAS entry such as `<LoginModule> required username="..." ...;`')
    module, _, rest = entry.groups()
    if module not in _LOGIN_MODULES:
        raise ConfigError(
            f"{key}: login module {module} has no equivalent in librdkafka here; "
            f"use {' or '.join(_LOGIN_MODULES)}"
        )
    options: dict[str, str] = {}
    position = 0
    while position < len(rest.rstrip()):
        option = _JAAS_OPTION.match(rest, position)
        if option is None:
            raise ConfigError(f'{key}: the options of {module} are not name="value" pairs')
        name, quoted, bare = option.groups()
        options[name] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        position = option.end()
    unknown = sorted(set(options) - {"username", "password"})
    if unknown:
        raise ConfigError(f"{key}: option {', '.join(unknown)} of {module} has no equivalent in librdkafka")
    if "username" not in options or "password" not in options:
        raise ConfigError(f"{key}: {module} needs a username and a password")
    return {"sasl.username": options["username"], "sasl.password": options["password"]}


def _truststore(options: Mapping[str, str], prefix: str) -> dict[str, str]:
    if "ssl.truststore.location" not in options and "ssl.truststore.certificates" not in options:
        return {}
    kind = options.get("ssl.truststore.type", "JKS").upper()
    if kind != "PEM":
        raise ConfigError(
            f"{prefix}ssl.truststore.type {kind}: librdkafka reads a PEM trust store only; convert it, for "
            f"example with `keytool -exportcert -rfc`, and set {prefix}ssl.truststore.type=PEM"
        )
    if "ssl.truststore.certificates" in options:
        return {"ssl.ca.pem": options["ssl.truststore.certificates"]}
    return {"ssl.ca.location": options["ssl.truststore.location"]}


def _keystore(options: Mapping[str, str], prefix: str) -> dict[str, str]:
    """A client certificate, for brokers that authenticate clients by TLS."""
    if not any(key in options for key in ("ssl.keystore.location", "ssl.keystore.key")):
        return {}
    kind = options.get("ssl.keystore.type", "JKS").upper()
    settings: dict[str, str] = {}
    if "ssl.key.password" in options:
        settings["ssl.key.password"] = options["ssl.key.password"]
    if kind == "PKCS12" and "ssl.keystore.location" in options:
        settings["ssl.keystore.location"] = options["ssl.keystore.location"]
        if "ssl.keystore.password" in options:
            settings["ssl.keystore.password"] = options["ssl.keystore.password"]
    elif kind == "PEM" and "ssl.keystore.location" in options:
        # A Java PEM key store is one file holding the private key and the certificate chain.
        settings["ssl.certificate.location"] = options["ssl.keystore.location"]
        settings["ssl.key.location"] = options["ssl.keystore.location"]
    elif kind == "PEM" and "ssl.keystore.key" in options and "ssl.keystore.certificate.chain" in options:
        settings["ssl.key.pem"] = options["ssl.keystore.key"]
        settings["ssl.certificate.pem"] = options["ssl.keystore.certificate.chain"]
    else:
        raise ConfigError(
            f"{prefix}ssl.keystore.type {kind}: librdkafka reads a PKCS12 or a PEM key store only; "
            f"convert it and set {prefix}ssl.keystore.type"
        )
    return settings


def read_properties(path: Path) -> dict[str, str]:
    """A Java properties file, as Kafka's tools read their --command-config."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"{path}: {error.strerror}") from error
    settings: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not logical and (not line or line.startswith(("#", "!"))):
            continue
        # A line ending in an odd number of backslashes goes on on the next line.
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            logical += line[:-1]
            continue
        logical += line
        key, value = _property(logical)
        settings[key] = value
        logical = ""
    if logical:
        key, value = _property(logical)
        settings[key] = value
    return settings


def _property(line: str) -> tuple[str, str]:
    match = re.match(r"((?:[^\s=:\\]|\\.)*)\s*[=:]?\s*(.*)$", line, re.DOTALL)
    assert match is not None, "every line matches: the key may be empty"
    return _unescape(match.group(1)), _unescape(match.group(2))


def _unescape(text: str) -> str:
    escapes = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}

    def replace(match: re.Match[str]) -> str:
        escaped = match.group(1)
        if escaped.startswith("u"):
            return chr(int(escaped[1:], 16))
        return escapes.get(escaped, escaped)

    return re.sub(r"\\(u[0-9a-fA-F]{4}|.)", replace, text)


def write_properties(path: Path, settings: Mapping[str, str], comment: str) -> None:
    """`settings` as a Java properties file readable by its owner alone: it may hold passwords."""
    lines = [f"# {line}" for line in comment.splitlines()]
    lines += [f"{key}={_escape(value)}" for key, value in settings.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text("\n".join(lines) + "\n")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def failure(error: KafkaError) -> str:
    """librdkafka's reason for a failed connection or request, with the cause said first."""
    reason = error.str()
    code = error.code()
    if code == KafkaError._AUTHENTICATION:
        return f"authentication failed: {reason}"
    if code == KafkaError._SSL:
        return f"TLS failed, the broker's certificate is not trusted or not valid: {reason}"
    if code in _AUTHORIZATION:
        return f"not authorized: {reason}"
    return reason


def not_authorized(error: KafkaError) -> bool:
    return error.code() in _AUTHORIZATION


_AUTHORIZATION = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
                  KafkaError.CLUSTER_AUTHORIZATION_FAILED)  # fmt: skip
# Errors that retrying does not mend: a refused login, a certificate that is not trusted.
_FATAL = (KafkaError._AUTHENTICATION, KafkaError._SSL)
# Errors of a request that say only that it did not get through; the connection's own error says why.
# Records purged from the queue failed because something else did (a fatal error, an aborted transaction).
_VAGUE = (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._MSG_TIMED_OUT, KafkaError._WAIT_COORD,
          KafkaError._ALL_BROKERS_DOWN, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)  # fmt: skip


class KafkaUnreachable(BergstreamError):
    """Kafka did not answer, or refused the client; the message says why."""


class ClientErrors:
    """librdkafka's error callback and logger for one client: keeps what explains why its requests fail (a
    refused login, an untrusted certificate, a dropped connection), which the requests themselves report
    only as a timeout or a transport failure. bergstream says it in its own words, once; librdkafka's log
    lines go to the debug log.

    librdkafka hands errors and log lines over when the client is polled."""

    def __init__(self) -> None:
        self.fatal: KafkaError | None = None
        self.last: KafkaError | None = None
        self.dropped: str | None = None
        self.fatal_reason: str | None = None

    def settings(self) -> dict[str, Any]:
        return {"error_cb": self._on_error, "logger": self}

    def _on_error(self, error: KafkaError) -> None:
        # A producer's fatal error comes with its cause's code (a refused write, say) and says why it failed.
        if error.code() in _FATAL or error.fatal():
            self.fatal = error
        # "1/1 brokers are down" says less than the error that took them down.
        elif error.code() != KafkaError._ALL_BROKERS_DOWN:
            self.last = error

    def log(self, level: int, message: str, *args: Any) -> None:
        """librdkafka's log line: (facility, client name, text) for `message`."""
        log.debug(message, *args)
        if len(args) == 3 and args[0] == "FAIL":
            self.dropped = str(args[2]).split("]: ", 1)[-1]
        # A producer's fatal error (its idempotence refused, say) may reach only the log: the records queued
        # then fail as purged, and flush() raises nothing.
        if len(args) == 3 and args[0] == "FATAL":
            self.fatal_reason = str(args[2]).split("]: ", 1)[-1]

    def explain(self, client: Any, fallback: KafkaError | str) -> str:
        """Why a request of `client` failed: its connection's own error when it had one, else `fallback`."""
        client.poll(0)
        if self.fatal is not None:
            return failure(self.fatal)
        if isinstance(fallback, KafkaError) and fallback.code() not in _VAGUE:
            return failure(fallback)
        if self.fatal_reason is not None:
            refused = "authorization failed" in self.fatal_reason.lower()
            return f"not authorized: {self.fatal_reason}" if refused else self.fatal_reason
        if self.last is not None:
            return failure(self.last)
        if self.dropped is not None:
            # A broker that hangs up before the first request is likely one that speaks TLS to a client that
            # does not.
            hint = "; check security.protocol" if "APIVERSION_QUERY" in self.dropped else ""
            return f"{self.dropped}{hint}"
        return failure(fallback) if isinstance(fallback, KafkaError) else fallback


def cluster_metadata(
    client: Any, errors: ClientErrors, topic: str | None = None, timeout: float = 15.0
) -> Any:
    """The cluster's metadata (of `topic` alone, when given), tried again until `timeout`; a refused login
    or an untrusted certificate fails at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.list_topics(topic, timeout=max(0.1, min(2.0, deadline - time.monotonic())))
        except KafkaException as error:
            client.poll(0)
            if errors.fatal is not None or time.monotonic() >= deadline:
                raise KafkaUnreachable(errors.explain(client, error.args[0])) from error
