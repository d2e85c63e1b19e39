"""A secured local broker: TLS and SASL/SCRAM-SHA-512 for clients, users, and ACLs that give each user
only what it needs.

Users:
- `admin`, the super user: the broker's own login between brokers, and bergstream's to create topics,
  users and ACLs; its SCRAM credential is written into the metadata when the log directory is formatted;
- `producer`, for `bergstream produce` and replay: describe, create and write any topic;
- `router-<topic>`, one per topic's router: read its topic, read (commit) its group
  `bergstream-router.<topic>`, nothing else.

The controller listener stays internal: TLS with client certificates, which only the broker holds.

Passwords are in `secrets.json` and in each user's client settings (`clients/<user>.properties`, the Java
client's names, as Kafka's tools and Spark's Kafka source take them), all readable by their owner alone.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bergstream.backfill.replay.state import STATE_TOPIC_PREFIX, TRANSACTIONAL_ID_PREFIX
from bergstream.errors import StackError
from bergstream.kafka_settings import (
    ClientErrors,
    KafkaUnreachable,
    cluster_metadata,
    librdkafka_settings,
    write_properties,
)
from bergstream.local import certificates

MECHANISM = "SCRAM-SHA-512"
ADMIN = "admin"
PRODUCER = "producer"
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
# What Kafka takes by default; at least 4096.
SCRAM_ITERATIONS = 8192
LOGIN_TIMEOUT_SECONDS = 30.0


def router_user(topic: str) -> str:
    return f"router-{topic}"


def router_group(topic: str) -> str:
    return f"bergstream-router.{topic}"


def jaas_login(user: str, password: str) -> str:
    return f'{SCRAM_LOGIN} required username="{user}" password="{password}";'


@dataclass(frozen=True)
class BrokerSecurity:
    """The secured broker's files: its secrets, its certificates, its users' client settings."""

    directory: Path

    @property
    def secrets_file(self) -> Path:
        return self.directory / "secrets.json"

    @property
    def ca_file(self) -> Path:
        return self.directory / certificates.CA_FILE

    @property
    def keystore_file(self) -> Path:
        return self.directory / certificates.KEYSTORE_FILE

    def client_file(self, user: str) -> Path:
        return self.directory / "clients" / f"{user}.properties"

    def prepare(self) -> None:
        """The secrets and certificates of a new secured broker; those that exist are kept."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        if not self.secrets_file.exists():
            self._save({"keystore_password": secrets.token_urlsafe(24), "users": {ADMIN: _password()}})
        if not (self.ca_file.exists() and self.keystore_file.exists()):
            certificates.make_certificates(self.directory, self.keystore_password())

    def _load(self) -> dict[str, Any]:
        try:
            loaded: dict[str, Any] = json.loads(self.secrets_file.read_text())
        except FileNotFoundError as error:
            raise StackError(
                f"{self.secrets_file} is missing: the secured stack's users cannot log in without it"
            ) from error
        return loaded

    def _save(self, saved: dict[str, Any]) -> None:
        partial = self.secrets_file.with_suffix(".partial")
        with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
            json.dump(saved, out, indent=2)
        partial.replace(self.secrets_file)

    def keystore_password(self) -> str:
        return str(self._load()["keystore_password"])

    def password(self, user: str) -> str | None:
        found = self._load()["users"].get(user)
        return str(found) if found is not None else None

    def users(self) -> list[str]:
        return sorted(self._load()["users"])

    def server_properties(self, host: str, port: int, controller_port: int) -> dict[str, str]:
        """The broker's listeners: SASL_SSL for clients and between brokers, TLS with client
        certificates for the controller."""
        admin_password = self.password(ADMIN)
        assert admin_password is not None, "prepare() made the admin's password"
        return {
            "listeners": f"SASL_SSL://{host}:{port},CONTROLLER://{host}:{controller_port}",
            "advertised.listeners": f"SASL_SSL://{host}:{port}",
            "inter.broker.listener.name": "SASL_SSL",
            "listener.security.protocol.map": "CONTROLLER:SSL,SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas_login(ADMIN, admin_password),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.keystore_file),
            "ssl.keystore.password": self.keystore_password(),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "listener.name.controller.ssl.client.auth": "required",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{ADMIN};User:{certificates.BROKER_NAME}",
            "allow.everyone.if.no.acl.found": "false",
        }

    def format_arguments(self) -> list[str]:
        """StorageTool's arguments that write the admin's SCRAM credential into the new metadata."""
        return ["--add-scram", f"{MECHANISM}=[name={ADMIN},password={self.password(ADMIN)}]"]

    def client_settings(self, user: str, bootstrap_servers: str) -> dict[str, str]:
        """`user`'s settings under the Java client's names."""
        password = self.password(user)
        if password is None:
            raise StackError(f"the local stack has no user {user!r}")
        return {
            "bootstrap.servers": bootstrap_servers,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.jaas.config": jaas_login(user, password),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
        }

    def write_client_files(self, bootstrap_servers: str) -> None:
        """Every user's client settings, with the broker's address of this start."""
        for user in self.users():
            write_properties(
                self.client_file(user),
                self.client_settings(user, bootstrap_servers),
                f"Kafka client settings of user {user} of the local stack (Java client names).",
            )

    def admin_config(self, bootstrap_servers: str) -> dict[str, str]:
        """The admin's settings for librdkafka."""
        return librdkafka_settings(self.client_settings(ADMIN, bootstrap_servers))

    def add_user(self, user: str, bootstrap_servers: str, acls: list[Any]) -> None:
        """Create `user` with a new password and exactly `acls`, and write its client settings."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        password = _password()
        admin = AdminClient({**self.admin_config(bootstrap_servers), **ClientErrors().settings()})
        credential = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
        try:
            for future in admin.alter_user_scram_credentials(
                [UserScramCredentialUpsertion(user, credential, password.encode())]
            ).values():
                future.result(timeout=30)
            for future in admin.create_acls(acls).values() if acls else []:
                future.result(timeout=30)
        except Exception as error:
            raise StackError(f"creating Kafka user {user} on {bootstrap_servers} failed: {error}") from error
        saved = self._load()
        saved["users"][user] = password
        self._save(saved)
        write_properties(
            self.client_file(user),
            self.client_settings(user, bootstrap_servers),
            f"Kafka client settings of user {user} of the local stack (Java client names).",
        )
        self.wait_for_login(user, bootstrap_servers)

    def wait_for_login(self, user: str, bootstrap_servers: str) -> None:
        """Until `user` can log in: a new credential reaches the broker through the metadata log."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + LOGIN_TIMEOUT_SECONDS
        while True:
            errors = ClientErrors()
            config = librdkafka_settings(self.client_settings(user, bootstrap_servers))
            client = AdminClient({**config, **errors.settings()})
            try:
                cluster_metadata(client, errors, timeout=5)
                return
            except KafkaUnreachable as error:
                if time.monotonic() > deadline:
                    raise StackError(f"user {user} cannot log in to {bootstrap_servers}: {error}") from error
                time.sleep(0.2)


def _password() -> str:
    return secrets.token_urlsafe(24)


def producer_acls(user: str) -> list[Any]:
    """Describe, create and write every topic: `produce` and replay make the topics they write. A replay
    sends in transactions of its own transactional id, and reads its progress back from its topic."""
    from confluent_kafka.admin import AclOperation  # type: ignore[attr-defined]

    return [
        *(_allow(user, "TOPIC", "*", op) for op in (AclOperation.DESCRIBE, AclOperation.CREATE,
                                                     AclOperation.WRITE)),
        _allow(user, "TOPIC", STATE_TOPIC_PREFIX, AclOperation.READ, prefixed=True),
        *(_allow(user, "TRANSACTIONAL_ID", TRANSACTIONAL_ID_PREFIX, op, prefixed=True)
          for op in (AclOperation.DESCRIBE, AclOperation.WRITE)),
    ]  # fmt: skip


def router_acls(user: str, topic: str) -> list[Any]:
    """Read the topic (which lets it be described too), and commit the router's consumer group.

    Spark's Kafka source assigns partitions itself and commits nothing: its generated groups need no ACL."""
    from confluent_kafka.admin import AclOperation  # type: ignore[attr-defined]

    return [_allow(user, "TOPIC", topic, AclOperation.READ), _allow(user, "GROUP", router_group(topic),
                                                                   AclOperation.READ)]  # fmt: skip


def _allow(user: str, resource: str, name: str, operation: Any, prefixed: bool = False) -> Any:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
    return AclBinding(
        ResourceType[resource], name, pattern, f"User:{user}", "*", operation, AclPermissionType.ALLOW
    )
